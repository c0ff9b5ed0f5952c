"""CPU tier: the registry's contract, for every entry."""

import dataclasses

import pytest
import torch

from cute_kernels import registry

SPECS = registry.list()


def test_registry_is_not_empty_and_sorted():
    assert SPECS, "no kernels registered"
    assert [s.key for s in SPECS] == sorted(s.key for s in SPECS)


def test_get_and_errors():
    spec = registry.get("scan")
    assert spec.op == "scan" and registry.get("scan", spec.variant) is spec
    with pytest.raises(KeyError, match="no kernel registered for op 'nope'"):
        registry.get("nope")
    with pytest.raises(KeyError, match="has no variant"):
        registry.get("scan", "nope")


def test_duplicate_registration_is_refused():
    spec = registry.get("scan")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(dataclasses.replace(spec))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.op}-{s.variant}")
def test_entry_contract(spec):
    assert spec.backend in ("cute", "nvrtc")
    assert spec.bound in ("bandwidth", "fp32", "fp16")
    assert spec.dtypes and all(isinstance(d, torch.dtype) for d in spec.dtypes)
    candidates = spec.candidates()
    assert candidates and all(isinstance(c, spec.config_cls) for c in candidates)
    assert len(set(candidates)) == len(candidates), "duplicate candidates"
    problems = spec.standard_problems()
    assert problems
    for problem in problems:
        config = spec.default_config(problem)
        assert isinstance(config, spec.config_cls)
        assert spec.why_unsupported(config, problem) is None, (config, problem)
        assert spec.supported_candidates(problem), problem
        assert spec.flops(problem) > 0 and spec.bytes(problem) > 0
    assert registry.configs(spec.op, spec.variant) == list(candidates)
    assert set(registry.configs(spec.op, spec.variant, problems[0])) <= set(candidates)
