"""Each registry entry's ``deterministic`` promise: two calls on the same input give bitwise-identical
outputs (entries that promise it), and integer scans, which are exact, always do."""

import pytest
import torch

from cute_kernels import registry
from cute_kernels.runtime import oracle

pytestmark = pytest.mark.gpu


def _first_problem(spec):
    return min(spec.standard_problems(), key=spec.flops)  # the cheapest standard problem


@pytest.mark.parametrize("spec", [s for s in registry.list() if s.deterministic], ids=repr)
def test_bitwise_repeatable(spec):
    problem = _first_problem(spec)
    generator = torch.Generator(device="cuda").manual_seed(5)
    inputs = spec.make_inputs(problem, torch.device("cuda"), generator)
    config = spec.choose_config(problem, 0)
    baseline = spec.baseline(problem, inputs)  # our output has the baseline's shape and dtype (bench.check)
    outputs = []
    for _ in range(3):
        out = oracle.poisoned_like(baseline)
        spec.launch(config, problem, inputs, out)
        outputs.append(out)
    torch.cuda.synchronize()
    verdict = spec.verify(problem, inputs, outputs[0], baseline)  # right, not merely the same three times
    assert verdict, verdict.detail
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])


def test_integer_scans_are_exact_hence_repeatable():
    import cute_kernels as ck

    x = torch.randint(-1000, 1000, (1 << 24,), device="cuda", dtype=torch.int32)
    first = ck.scan(x)
    assert torch.equal(first, torch.cumsum(x.long(), 0))
    assert all(torch.equal(first, ck.scan(x)) for _ in range(3))
