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
    assert spec.bound in ("bandwidth", "fp32", "fp16", "tf32x3")
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


# The entries users and tools can count on: (op, variant, backend, dtypes) of every entry, and each op's
# default variant. A change here is a change of the public registry, never a side effect of moving code.
EXPECTED_ENTRIES = [
    ("attention", "flash2_mma", "nvrtc", (torch.float16, torch.bfloat16)),
    ("attention", "flash2_tf32x3", "nvrtc", (torch.float32,)),
    ("attention", "flash3_wgmma", "nvrtc", (torch.float16, torch.bfloat16)),
    ("attention", "fused_fp32", "nvrtc", (torch.float32,)),
    ("conv3d", "direct", "nvrtc", (torch.float32,)),
    ("conv3d", "tiled", "nvrtc", (torch.float32,)),
    ("hgemm", "gemv", "nvrtc", (torch.float16, torch.bfloat16)),
    ("hgemm", "sm80_mma", "cute", (torch.float16, torch.bfloat16)),
    ("hgemm", "sm90_wgmma", "cute", (torch.float16, torch.bfloat16)),
    ("linear_scan", "columns", "nvrtc", (torch.float32, torch.float16, torch.bfloat16)),
    ("linear_scan", "lookback", "nvrtc", (torch.float32, torch.float16, torch.bfloat16)),
    ("scan", "columns", "nvrtc", (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)),
    ("scan", "lookback", "nvrtc", (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)),
    ("sgemm", "gemv", "nvrtc", (torch.float32,)),
    ("sgemm", "simt_cpasync", "cute", (torch.float32,)),
    ("sgemm", "tf32x3_mma", "cute", (torch.float32,)),
    ("sgemm", "tf32x3_wgmma", "nvrtc", (torch.float32,)),
]
EXPECTED_DEFAULTS = {"attention": "fused_fp32", "conv3d": "direct", "hgemm": "sm80_mma", "linear_scan": "lookback", "scan": "lookback",
                     "sgemm": "tf32x3_mma"}


def test_the_registered_entries_are_the_published_ones():
    assert [(s.op, s.variant, s.backend, tuple(s.dtypes)) for s in SPECS] == EXPECTED_ENTRIES
    assert {op: registry.get(op).variant for op in EXPECTED_DEFAULTS} == EXPECTED_DEFAULTS


def test_every_nvrtc_entry_names_its_sources_and_every_cute_entry_none():
    for spec in SPECS:
        assert bool(spec.sources) == (spec.backend == "nvrtc"), spec


def test_a_variant_that_is_not_a_name_is_refused_naming_the_argument():
    with pytest.raises(TypeError, match="^variant: expected a str or None, got list"):
        registry.for_call("conv3d", ["direct"])
    with pytest.raises(ValueError, match="^variant: op 'conv3d' has no variant 'nope'"):
        registry.for_call("conv3d", "nope")
    assert registry.for_call("conv3d", None) is registry.get("conv3d")
