import collections
import gc
import os
import tempfile

import pytest
import torch

# Without a GPU the CuTe DSL compiles for the arch it defaults to (the cu13 flavour: sm_100a); the CPU tier
# compile-checks the H200's. Set before anything imports cutlass.
if not torch.cuda.is_available():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

# The user's own tuned tables (a sweep's --write-tuned) must not steer the tests: they read the shipped ones.
os.environ["CUTE_KERNELS_TUNED_DIR"] = tempfile.mkdtemp(prefix="cute_kernels-tests-tuned-")

import cute_kernels  # noqa: F401  (registers every entry)


# The quick GPU tier (`-m quick`): of each GPU test function, this many of its parametrizations, spread
# evenly over them (the first and the last included), so every op and variant is covered in a few minutes.
QUICK_PER_FUNCTION = 3


class _GpuFileWithoutGpu(pytest.Module):
    """A ``*_gpu.py`` file on a machine without a CUDA device: reported as one skipped module, neither imported
    nor expanded into its thousands of parametrized tests, which would all skip and cost the CPU tier their
    collection and reports one by one (docs/notes/method.md)."""

    def collect(self):
        pytest.skip(f"no CUDA device on this machine: {self.path.name} runs on a GPU", allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name.startswith("test_") and module_path.name.endswith("_gpu.py") and not torch.cuda.is_available():
        return _GpuFileWithoutGpu.from_parent(parent, path=module_path)
    return None


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run the K-th of N interleaved parts of the collected tests (the full GPU tier in parts)")
    parser.addoption("--exhaustive", action="store_true",
                     help="also run the exhaustive NVRTC compile and spill checks (deselected otherwise; CI "
                          "runs them under NVRTC 13.0, the H200's)")


def _mark_quick(items) -> None:
    by_function = collections.defaultdict(list)
    for item in items:
        if "gpu" in item.keywords:
            by_function[(item.path, getattr(item, "originalname", item.name))].append(item)
    for cases in by_function.values():
        if len(cases) <= QUICK_PER_FUNCTION:
            chosen = cases
        else:
            step = (len(cases) - 1) / (QUICK_PER_FUNCTION - 1)
            chosen = [cases[round(i * step)] for i in range(QUICK_PER_FUNCTION)]
        for item in chosen:
            item.add_marker(pytest.mark.quick)


def _shard(config, items) -> None:
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        k, n = (int(x) for x in spec.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--shard: expected K/N with 1 <= K <= N, got {spec!r}") from None
    kept = [item for i, item in enumerate(items) if i % n == k - 1]
    config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % n != k - 1])
    items[:] = kept


def _skip_exhaustive(config, items) -> None:
    # The whole-product NVRTC compile and spill checks are most of the CPU tier's time (minutes of one NVRTC
    # program each); the default tier compiles every registry entry's sample instead, and CI runs these once,
    # under the H200's NVRTC (.ci/run). Skipped with the reason, so a run that names one says what to pass.
    if config.getoption("--exhaustive"):
        return
    skip = pytest.mark.skip(reason="a whole-product NVRTC compile check: pass --exhaustive (CI's NVRTC 13.0 leg does)")
    for item in items:
        if item.get_closest_marker("exhaustive") is not None:
            item.add_marker(skip)


def _group_memory_heavy(items) -> None:
    # Tests that hold tens of GB run in one xdist group, so one worker runs them one after another
    # (`--dist loadgroup`, scripts/gpu_check.sh): side by side they ran the H200 out of memory.
    for item in items:
        if "memory_heavy" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("memory_heavy"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # tryfirst: the quick marks must exist before pytest's own -m selection runs over the items.
    _mark_quick(items)
    _group_memory_heavy(items)
    _skip_exhaustive(config, items)
    _shard(config, items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A worker keeps what its tests freed in torch's caching allocator; side by side, fourteen workers' caches
# and one memory-heavy test (tens of GB) ran the H200 out of memory. A test that leaves more than this
# reserved hands it back.
RESERVED_HANDBACK_BYTES = 4 << 30


@pytest.fixture(autouse=True)
def _hand_back_cached_memory():
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized() \
            and torch.cuda.memory_reserved() > RESERVED_HANDBACK_BYTES:
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture
def generator():
    """A seeded CUDA generator: fresh random data per test, reproducible per run."""
    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    return g


@pytest.fixture
def exact_fp32_torch():
    """torch's FP32 matmuls without TF32, so that a baseline's error is FP32's (use with pytest.mark.usefixtures)."""
    from cute_kernels.runtime import oracle

    with oracle.fp32_matmuls():
        yield
