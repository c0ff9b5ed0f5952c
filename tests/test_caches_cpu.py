"""CPU tier: the in-memory caches keyed by what callers pass (shapes, strides, scalars, streams, runtime knobs)
are bounded, through the one helper (runtime.bounded.remember); the caches keyed by a finite set are named
below with the reason; and the disk cache's lock degrades to no lock where locks are not to be had."""

import ast
import os
from pathlib import Path

import pytest
import torch

import cute_kernels
from cute_kernels import tuned
from cute_kernels.runtime import bounded, disk_cache
from cute_kernels.runtime.bounded import remember
from cute_kernels.runtime.cute_compile import CompileCache

PACKAGE = Path(cute_kernels.__file__).resolve().parent

# Module-level caches filled only through remember(): keyed by shapes, strides, scalars, streams or runtime
# knobs, so they would grow with every new value a long-running process sees.
BOUNDED = {
    ("ops/attention/fused_fp32.py", "_causal_plans"),
    ("runtime/workspace.py", "_buffers"),
    ("runtime/workspace.py", "_staging"),
    ("ops/scan/lookback.py", "_plans"),
    ("ops/scan/lookback.py", "_workspaces"),
    ("runtime/nvrtc.py", "_header_memo"),
    ("runtime/checks.py", "_float32_values"),
    ("ops/attention/problem.py", "_checked_scales"),
    ("ops/attention/flash3_wgmma.py", "_registry_launches"),
    ("ops/gemm/spec.py", "_kept_launches"),
    ("tuned.py", "_choices"),
}
# Module-level dicts keyed by a finite set, and why it is finite.
FINITE = {
    ("ops/attention/flash2_mma.py", "_flash_plans"): "one per compiled kernel and device",
    ("ops/attention/flash2_tf32x3.py", "_tf32x3_plans"): "one per compiled kernel and device",
    ("ops/attention/fused_fp32.py", "_fp32_plans"): "one per compiled kernel (config, head dim, vector) and device",
    ("ops/conv3d/direct.py", "_plans"): "one per compiled kernel and device",
    ("registry.py", "_REGISTRY"): "one per registered entry",
    ("registry.py", "_DEFAULT"): "one per op",
    ("registry.py", "_ZOOS"): "one per op",
    ("runtime/config_fields.py", "_checkers"): "one per config class",
    ("runtime/device.py", "_shared_limits"): "one per device",
    ("runtime/device.py", "_capabilities"): "one per device",
    ("runtime/device.py", "_sm_counts"): "one per device",
    ("ops/attention/spec.py", "_window_masks"): "at most one: cleared before each new mask",
    ("ops/gemm/spec.py", "_zeros"): "one per dtype and device",
    ("runtime/nvrtc.py", "_header_packages"): "one per CUDA include directory",
    ("runtime/nvrtc.py", "_memory_cache"): "one per compiled instantiation",
    ("runtime/nvrtc.py", "_include_dir_cache"): "one entry",
    ("runtime/nvrtc.py", "_loaded"): "one per compiled instantiation and device",
    ("runtime/nvrtc.py", "_by_name"): "one per compiled instantiation and device",
    ("runtime/nvrtc.py", "_primary_contexts"): "one per device",
    ("tuned.py", "_tables"): "one per registry entry",
    ("torch_ops.py", "_BODIES"): "one per custom op",
}


def _module_dicts():
    """{(path under cute_kernels, name): ast module} of every module-level name bound to an empty dict."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            value = node.value
            empty = isinstance(value, ast.Dict) and not value.keys
            made = isinstance(value, ast.Call) and getattr(value.func, "id", None) in ("dict", "defaultdict",
                                                                                        "OrderedDict")
            if empty or made:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    found[(path.relative_to(PACKAGE).as_posix(), ast.unparse(target))] = tree
    return found


def test_every_module_level_cache_is_bounded_or_finite():
    found = _module_dicts()
    unknown = set(found) - BOUNDED - set(FINITE)
    assert not unknown, (f"module-level dicts {sorted(unknown)} are neither filled through runtime.bounded.remember "
                         "nor listed as keyed by a finite set (with the reason) in this test")
    assert BOUNDED | set(FINITE) <= set(found), "a cache listed here is gone: update the lists"


@pytest.mark.parametrize("where", sorted(BOUNDED), ids=lambda w: f"{w[0]}:{w[1]}")
def test_a_bounded_cache_is_filled_only_through_remember(where):
    tree = _module_dicts()[where]
    name = where[1]
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
              and ast.unparse(n.value) == name]
    assert not stores, f"{where}: {name}[...] = ... grows it without a bound; use remember({name}, key, value)"
    # remember() itself, or kept_launch(), which fills its cache through remember() (tested below).
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) in ("remember", "kept_launch")
             and n.args and ast.unparse(n.args[0]) == name]
    assert calls, f"{where}: {name} is never filled through remember()"
    for n in ast.walk(tree):  # nor grown some other way
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) == name:
            assert n.func.attr in ("get", "clear", "pop", "items", "values", "keys"), ast.unparse(n)


# ---- the helper --------------------------------------------------------------------------------------------


def test_remember_clears_a_full_cache_before_a_new_key():
    cache = {}
    for i in range(5):
        assert remember(cache, i, i * i, max_entries=3) == i * i
    assert cache == {3: 9, 4: 16}  # cleared when the fourth key came
    remember(cache, 5, 25, max_entries=3)
    assert remember(cache, 5, 26, max_entries=3) == 26 and cache == {3: 9, 4: 16, 5: 26}  # a known key: no clear
    remember(cache, 6, 36, max_entries=3)
    assert cache == {6: 36}


def test_the_default_bound_is_read_at_each_call(monkeypatch):
    monkeypatch.setattr(bounded, "MAX_ENTRIES", 2)
    cache = {}
    for i in range(3):
        remember(cache, i, i)
    assert cache == {2: 2}
    assert bounded.MAX_STREAM_ENTRIES < 4096


# ---- each bounded cache, driven through its own code path --------------------------------------------------


@pytest.fixture
def small_bound(monkeypatch):
    monkeypatch.setattr(bounded, "MAX_ENTRIES", 8)
    return 8


def test_causal_plans_are_bounded(small_bound, monkeypatch):
    from cute_kernels.ops.attention import fused_fp32
    from cute_kernels.ops.attention.problem import AttentionProblem

    monkeypatch.setattr(fused_fp32, "_causal_plans", {})
    config = fused_fp32.Fp32Config(32, 32, 2)
    plans = []
    for m in range(100, 130):
        problem = AttentionProblem(1, 2, m, m + 7, 64, causal=True)
        plans.append(fused_fp32.fp32_split_plan(config, problem, 132, 2))
        assert len(fused_fp32._causal_plans) <= small_bound
    # The same answers as computed afresh: the bound costs recomputation, never a different plan.
    fused_fp32._causal_plans.clear()
    assert plans == [fused_fp32.fp32_split_plan(config, AttentionProblem(1, 2, m, m + 7, 64, causal=True), 132, 2)
                     for m in range(100, 130)]


def test_memoised_scalar_checks_are_bounded(small_bound, monkeypatch):
    """The float32 conversions and scale checks every call makes remember the values seen (a plan's
    repeat skips the work); a caller sweeping the values must not grow them without end."""
    from cute_kernels.ops.attention import problem as attention_problem
    from cute_kernels.runtime import checks

    monkeypatch.setattr(checks, "_float32_values", {})
    monkeypatch.setattr(attention_problem, "_checked_scales", {})
    for i in range(1, 30):
        assert checks.float32_scalar("alpha", i / 7) == checks.round_float32(i / 7)
        assert attention_problem._check_scale(i / 7) == i / 7
        assert len(checks._float32_values) <= small_bound and len(attention_problem._checked_scales) <= small_bound


def test_tuned_choices_are_bounded(small_bound, monkeypatch):
    from cute_kernels import registry
    from cute_kernels.ops.scan import ScanProblem

    monkeypatch.setattr(tuned, "_choices", {})
    spec = registry.get("scan")
    for n in range(1000, 1030):
        problem = ScanProblem(1, n, torch.float32)
        assert tuned.choose(spec, problem, 0) == spec.choose_config(problem, 0)
        assert len(tuned._choices) <= small_bound


def test_compile_cache_problems_are_bounded(small_bound):
    cache = CompileCache()
    for i in range(30):
        cache.remember_problem(("config", i, "sm_90a"), f"binary{i % 2}", cache.generation)
        assert len(cache.by_problem) <= small_bound
    cache.remember_problem(("config", 99, "sm_90a"), "stale", cache.generation - 1)  # raced with a clear()
    assert ("config", 99, "sm_90a") not in cache.by_problem


def test_scan_plans_are_bounded_across_ramps(small_bound, monkeypatch):
    from cute_kernels.ops.scan import ScanConfig, ScanProblem
    from cute_kernels.ops.scan import lookback

    monkeypatch.setattr(lookback, "_plans", {})
    monkeypatch.setattr(lookback.nvrtc, "kernel_for", lambda source, name, device: ("kernel", name))
    monkeypatch.setattr(lookback, "first_wave_ctas", lambda kernel, config, shared_bytes, device: 264)
    problem = ScanProblem(1, 1 << 20, torch.float32)
    for ramp in range(0, 3000, 100):
        plan = lookback._plan(ScanConfig(256, 16, ramp_ns=ramp), problem, 0)
        assert plan[-1] == 264 and len(lookback._plans) <= small_bound


def test_scan_workspaces_are_bounded_across_streams(monkeypatch):
    from cute_kernels.ops.scan import lookback

    monkeypatch.setattr(lookback, "_workspaces", {})
    monkeypatch.setattr(lookback, "MAX_STREAM_ENTRIES", 4)
    monkeypatch.setattr(lookback, "stream_capturing", lambda: False)
    monkeypatch.setattr(lookback, "_zeroed_workspace", lambda nbytes, dtype, device: lookback._Workspace(
        torch.zeros(nbytes // 8, dtype=torch.int64), lookback.state_capacity(nbytes, dtype)))
    first = lookback._workspace((None, 1, True), 10, torch.float32)
    assert lookback._workspace((None, 1, True), 10, torch.float32) is first  # reused on its stream
    for stream in range(2, 12):
        lookback._workspace((None, stream, True), 10, torch.float32)
        assert len(lookback._workspaces) <= 4


# ---- the disk cache's lock where there is none to take -----------------------------------------------------


def test_lock_is_skipped_without_fcntl(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    monkeypatch.setattr(disk_cache, "fcntl", None)
    cache = disk_cache.DiskCache("test", ".bin")
    with cache.lock("k"):
        cache.store("k", b"data", {})
    assert cache.load("k")[0] == b"data" and not (tmp_path / "locks").exists()


def test_lock_is_skipped_where_the_lock_file_cannot_be_made(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    (tmp_path / "locks").write_text("a file where the lock directory belongs")
    cache = disk_cache.DiskCache("test", ".bin")
    with cache.lock("k"):
        cache.store("k", b"data", {})
    assert cache.load("k")[0] == b"data"


def test_lock_is_released_when_the_body_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache = disk_cache.DiskCache("test", ".bin")
    with pytest.raises(KeyError):
        with cache.lock("k"):
            raise KeyError("in the body")
    fcntl = pytest.importorskip("fcntl")
    fd = os.open(tmp_path / "locks" / "test" / "k.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again: raises BlockingIOError if still held
    finally:
        os.close(fd)


def test_lock_with_the_disk_cache_off_is_no_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "0")
    cache = disk_cache.DiskCache("test", ".bin")
    with cache.lock("k"):
        pass
    assert not any(tmp_path.iterdir())
    assert cache.evict("k", b"") is False


def test_kept_launch_prepares_once_per_layout_through_remember(monkeypatch):
    made = []
    monkeypatch.setattr(bounded, "MAX_ENTRIES", 2)
    cache = {}
    prepare = lambda config, problem, inputs, out: made.append(out.shape) or len(made)  # noqa: E731
    a, out, wide = torch.empty(4, 8), torch.empty(4, 8), torch.empty(4, 10)[:, :8]
    assert [bounded.kept_launch(cache, prepare, "c", "p", {}, o, (a, o)) for o in (out, out, wide, out)] == [1, 1, 2, 1]
    bounded.kept_launch(cache, prepare, "c", "p", {}, torch.empty(5, 8), (a,))  # a third layout: the cache is full
    assert len(cache) == 1 and len(made) == 3


def test_a_shared_stream_buffer_grows_and_capture_takes_a_fresh_one(monkeypatch):
    """The shared buffer of a (device, stream, kind): at least 16 Ki elements, the same tensor for every
    request it holds, a larger one (and from then on that one) for a request past it, zeroed for counters;
    under graph capture a fresh tensor of the request's size, the kept one untouched. CPU tensors stand in."""
    from cute_kernels.runtime import workspace

    capturing = [False]
    monkeypatch.setattr(workspace, "stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(workspace, "_buffers", {})
    small = workspace.stream_buffer("arrivals", "cpu", 3, 10)
    assert small.numel() == 1 << 14 and small.dtype == torch.int32 and not small.any()
    assert workspace.stream_buffer("arrivals", "cpu", 3, 1 << 14) is small
    assert workspace.stream_buffer("arrivals", "cpu", 4, 10) is not small  # another stream
    grown = workspace.stream_buffer("arrivals", "cpu", 3, (1 << 14) + 1)
    assert grown is not small and grown.numel() == (1 << 14) + 1 and not grown.any()
    assert workspace.stream_buffer("arrivals", "cpu", 3, 10) is grown
    capturing[0] = True
    fresh = workspace.stream_buffer("partials", "cpu", 3, 5)
    assert fresh.numel() == 5 and fresh.dtype == torch.float32
    assert workspace.stream_buffer("arrivals", "cpu", 3, 10) is not grown
    capturing[0] = False
    assert workspace.stream_buffer("arrivals", "cpu", 3, 10) is grown


def test_per_thread_stream_buffers_are_the_threads_own_and_go_with_it(monkeypatch):
    """A call that uses a buffer across two launches takes its thread's own (another thread's launch on the
    stream could come between them); the shared ones stay one per stream. CPU tensors stand in."""
    import gc
    import threading
    import weakref

    from cute_kernels.runtime import workspace

    monkeypatch.setattr(workspace, "stream_capturing", lambda: False)
    monkeypatch.setattr(workspace, "_buffers", {})
    shared = workspace.stream_buffer("partials", "cpu", 7, 100)
    assert workspace.stream_buffer("partials", "cpu", 7, 50) is shared
    mine = workspace.stream_buffer("partials", "cpu", 7, 100, per_thread=True)
    assert mine is not shared and workspace.stream_buffer("partials", "cpu", 7, 10, per_thread=True) is mine
    theirs = []
    worker = threading.Thread(target=lambda: theirs.append(
        weakref.ref(workspace.stream_buffer("partials", "cpu", 7, 100, per_thread=True))))
    worker.start()
    worker.join()
    gc.collect()
    assert theirs[0]() is None  # the thread's buffer went with it
    assert workspace.stream_buffer("partials", "cpu", 7, 100, per_thread=True) is mine
