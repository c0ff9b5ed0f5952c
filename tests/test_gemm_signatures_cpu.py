"""The CuTe GEMMs' compiled functions against the arguments their launches pass, on the CPU.

A compiled TVM-FFI function checks every tensor it is given against the signature it was compiled for
(rank, shape relations, unit strides, the divisibility of leading dimensions and batch strides, pointer
alignment, dtype, device) before it launches. Without a GPU it can still be called: CPU tensors relabelled
as CUDA tensors (a DLPack capsule whose device field says CUDA) pass the device check, and a call whose
arguments pass every check then stops at the CUDA runtime, for want of a driver. So each test here runs the
real launch classes (``compile.gemm_launch``: plain, batched, split-K) on tensors laid out as the op hands
them over, and asserts that the compiled function got as far as the runtime: the host side of a launch,
verified on the CPU. A call with a wrong view fails with the function's own "Mismatched ..." message.

Skipped where a CUDA driver is present (or torch sees a GPU): there the call would launch on host pointers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is imported anywhere

import pytest
import torch

from cute_kernels.ops.gemm import compile as compile_module
from cute_kernels.ops.gemm import hgemm_sm80, hgemm_sm90, sgemm, sgemm_tf32x3
from cute_kernels.ops.gemm.hgemm_sm80_config import HgemmConfig
from cute_kernels.ops.gemm.hgemm_sm90_config import HgemmSm90Config
from cute_kernels.ops.gemm.problem import GemmProblem
from cute_kernels.ops.gemm.sgemm_tf32x3_config import Tf32x3GemmConfig

ARCH = "sm_90a"


def _driver_present() -> bool:
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if name:
            try:
                ctypes.CDLL(name)
                return True
            except OSError:
                pass
    return False


pytestmark = pytest.mark.skipif(torch.cuda.is_available() or _driver_present(),
                                reason="a CUDA driver is present: the call would launch on host pointers (the GPU "
                                       "tier runs these launches)")


# DLPack's C structs, as far as the device field (dlpack.h: DLManagedTensor starts with its DLTensor).
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


_DL_CUDA = 2
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _LabelledCuda:
    """A CPU tensor's DLPack export with its device field set to CUDA device 0."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __dlpack_device__(self):
        return (_DL_CUDA, 0)

    def __dlpack__(self, stream=None, **kwargs):
        capsule = self.tensor.__dlpack__()
        _DLTensorHead.from_address(_capsule_pointer(capsule, b"dltensor")).device.device_type = _DL_CUDA
        return capsule


class _Checked:
    """Stands in for a compiled function inside a launch object: calls the real one with every tensor
    relabelled, and records whether the call reached the CUDA runtime (every argument check passed)."""

    def __init__(self, compiled):
        self.compiled, self.calls = compiled, 0

    def __call__(self, *args):
        import tvm_ffi

        labelled = [tvm_ffi.from_dlpack(_LabelledCuda(a)) if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(RuntimeError, match="(?i)cuda"):
            self.compiled(*labelled)
        self.calls += 1


def _matrix(rows, cols, *, column_major=False, batch=1, dtype=torch.float16):
    """(rows, cols), or (batch, rows, cols), row-major or a column-major view (``w.t()``'s layout)."""
    lead = (batch,) if batch > 1 else ()
    if column_major:
        return torch.zeros(*lead, cols, rows, dtype=dtype).transpose(-1, -2)
    return torch.zeros(*lead, rows, cols, dtype=dtype)


def _run(module, config, problem, extra=(), monkeypatch=None, c_is_a_row=False):
    """Compile ``config`` for ``problem``, wrap it in its launch (``compile.gemm_launch``) and launch it on
    tensors laid out as the op passes them: a (M, K) (column-major when A is M-major), b (K, N)
    (column-major when B is K-major), c and out (M, N) row-major; each with a leading batch mode when the
    problem has one. ``c_is_a_row``: c is a bias row's expansion (leading dimension and batch stride 0), as
    the op passes a broadcast (N,) c."""
    dtype = getattr(torch, problem.dtype)
    checked = _Checked(module.compile(config, problem, ARCH))
    if config.split_k > 1:
        # The split launch takes its stream's workspace: CPU buffers here, of the kinds it asks for.
        kinds = {"partials": torch.float32, "arrivals": torch.int32}
        monkeypatch.setattr(compile_module, "current_stream_handle", lambda index: 0)
        monkeypatch.setattr(compile_module, "stream_buffer",
                            lambda kind, dev, stream, numel: torch.zeros(max(numel, 1 << 14), dtype=kinds[kind]))
    launch = compile_module.gemm_launch(checked, config, problem, 0, extra)
    m, n, k, batch = problem.m, problem.n, problem.k, problem.batch
    a = _matrix(m, k, column_major=problem.a_major == "m", batch=batch, dtype=dtype)
    b = _matrix(k, n, column_major=problem.b_major == "k", batch=batch, dtype=dtype)
    c = None if problem.beta_zero else _matrix(m, n, batch=batch, dtype=dtype)
    if c_is_a_row:
        c = torch.zeros(n, dtype=dtype).expand(c.shape)
    out = _matrix(m, n, batch=batch, dtype=dtype)
    launch(a, b, c, out, 1.0, 0.0 if problem.beta_zero else 0.5)
    assert checked.calls == 1


def _problem(dtype, **changes):
    """A problem of contiguous operands (16-byte alignments) with ``changes``."""
    widest = 4 if dtype == "float32" else 8
    problem = GemmProblem(m=200, n=136, k=264, dtype=dtype, a_align=widest, b_align=widest, c_align=widest, sm=90)
    return dataclasses.replace(problem, **changes)


LAYOUTS = [("k", "n"), ("m", "k")]


@pytest.mark.parametrize("a_major, b_major", LAYOUTS, ids=["NN", "TT"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("beta_zero", [True, False], ids=["beta0", "beta"])
def test_hopper_hgemm(a_major, b_major, batch, beta_zero):
    problem = _problem("float16", a_major=a_major, b_major=b_major, batch=batch, beta_zero=beta_zero)
    _run(hgemm_sm90, HgemmSm90Config(), problem, extra=(132,))


def test_hopper_hgemm_split_k(monkeypatch):
    config = HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6, split_k=4)
    _run(hgemm_sm90, config, _problem("float16", m=64, k=4096), extra=(132,), monkeypatch=monkeypatch)


@pytest.mark.parametrize("a_major, b_major", LAYOUTS, ids=["NN", "TT"])
@pytest.mark.parametrize("batch", [1, 3])
def test_sm80_hgemm(a_major, b_major, batch):
    problem = _problem("bfloat16", a_major=a_major, b_major=b_major, batch=batch, beta_zero=False)
    _run(hgemm_sm80, HgemmConfig(), problem)


def test_sm80_hgemm_split_k(monkeypatch):
    config = HgemmConfig(split_k=4)
    _run(hgemm_sm80, config, _problem("float16", m=64, k=4096), monkeypatch=monkeypatch)


@pytest.mark.parametrize("a_major, b_major", LAYOUTS, ids=["NN", "TT"])
@pytest.mark.parametrize("batch", [1, 3])
def test_simt_sgemm(a_major, b_major, batch):
    problem = _problem("float32", a_major=a_major, b_major=b_major, batch=batch, beta_zero=False)
    _run(sgemm, sgemm.default_config(problem), problem)


@pytest.mark.parametrize("a_major, b_major", LAYOUTS, ids=["NN", "TT"])
@pytest.mark.parametrize("batch", [1, 3])
def test_tf32x3_sgemm(a_major, b_major, batch):
    problem = _problem("float32", a_major=a_major, b_major=b_major, batch=batch, beta_zero=False)
    _run(sgemm_tf32x3, Tf32x3GemmConfig(), problem)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("family", ["hopper", "sm80", "simt", "tf32x3"])
def test_a_bias_row_is_read_as_its_expansion(family, batch, monkeypatch):
    """A bias row (N,) reaches every compiled function as its expansion, a view with leading dimension 0
    (and batch stride 0): the op makes no copy of it (``problem.expansion_is_rows``), so each function's
    signature must take that stride; split-K too, whose last CTA reads C."""
    dtype = "float32" if family in ("simt", "tf32x3") else "float16"
    problem = _problem(dtype, batch=batch, beta_zero=False)
    module, config, extra = {"hopper": lambda: (hgemm_sm90, HgemmSm90Config(), (132,)),
                             "sm80": lambda: (hgemm_sm80, HgemmConfig(), ()),
                             "simt": lambda: (sgemm, sgemm.default_config(problem), ()),
                             "tf32x3": lambda: (sgemm_tf32x3, Tf32x3GemmConfig(), ())}[family]()
    _run(module, config, problem, extra=extra, c_is_a_row=True)
    if batch == 1 and family in ("hopper", "sm80"):
        split = (HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6, split_k=4)
                 if family == "hopper" else HgemmConfig(split_k=4))
        _run(module, split, _problem(dtype, m=64, k=4096, beta_zero=False), extra=extra, monkeypatch=monkeypatch,
             c_is_a_row=True)


@pytest.mark.parametrize("c_kind", ["none", "full", "bias"])
@pytest.mark.parametrize("split", [False, True], ids=["plain", "split-k"])
def test_the_in_place_swap_passes_what_its_kernel_was_compiled_for(c_kind, split, monkeypatch):
    """x (M, K) @ w.t() run as out^T = w @ x^T in place on the Hopper config's transposed twin: the call's
    x, w.t(), c and out as they lie (c a full c with a leading dimension past N, or a bias repeated over the
    rows), each accepted by the compiled function's own checks, with split-K's workspace that of the product
    it runs, (N, M, S) (``hgemm_sm90.prepare`` sizes it from ``GemmProblem.transposed``). The swapped
    problem's views (w as A, x^T as a K-major B, out^T as a column-major D), which the function makes
    itself, are refused."""
    m, n, k = 24, 136, 264
    call = GemmProblem(m=m, n=n, k=k, dtype="float16", beta_zero=c_kind == "none", a_align=8, b_align=8,
                       c_align=8, b_major="k")
    config = (HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=4) if split
              else HgemmSm90Config(tile_m=128, tile_n=64, consumer_warpgroups=1))
    config = dataclasses.replace(config, transposed=True)
    assert hgemm_sm90.why_unsupported(config, call) is None
    if split:
        kinds = {"partials": torch.float32, "arrivals": torch.int32}
        monkeypatch.setattr(compile_module, "current_stream_handle", lambda index: 0)
        monkeypatch.setattr(compile_module, "stream_buffer",
                            lambda kind, dev, stream, numel: torch.zeros(max(numel, 1 << 14), dtype=kinds[kind]))
    checked = _Checked(hgemm_sm90.compile(config, call, ARCH))
    launch = compile_module.gemm_launch(checked, config, call.transposed(), 0, (132,))
    if split:
        assert (launch.m, launch.n) == (n, m)
    x, w = torch.zeros(m, k, dtype=torch.float16), torch.zeros(n, k, dtype=torch.float16)
    c = {"none": None, "full": torch.zeros(m, n + 8, dtype=torch.float16)[:, :n],
         "bias": torch.zeros(n, dtype=torch.float16).expand(m, n)}[c_kind]
    out = torch.zeros(m, n + 16, dtype=torch.float16)[:, :n]
    launch(x, w.t(), c, out, 1.0, 0.0 if c is None else 0.5)
    assert checked.calls == 1
    if not split and c is None:
        import tvm_ffi

        wrong = tvm_ffi.from_dlpack(_LabelledCuda(out.t()))
        with pytest.raises(Exception, match="Mismatched|Invalid mC.strides"):
            checked.compiled(tvm_ffi.from_dlpack(_LabelledCuda(w)), tvm_ffi.from_dlpack(_LabelledCuda(x.t())),
                             wrong, wrong, 1.0, 0.0, 132)


def test_a_view_the_function_refuses_fails_with_its_message():
    """The harness is not vacuous: B passed as its (N, K) view (the kernel's order) rather than the (K, N)
    tensor the function was compiled for is refused by the compiled function's own checks before any
    launch."""
    import tvm_ffi

    problem = _problem("float16")
    compiled = hgemm_sm80.compile(HgemmConfig(), problem, ARCH)
    a, b, out = _matrix(200, 264), _matrix(264, 136), _matrix(200, 136)
    labelled = [tvm_ffi.from_dlpack(_LabelledCuda(t)) for t in (a, b.t(), out, out)]
    with pytest.raises(ValueError, match="Mismatched mB"):
        compiled(*labelled, 1.0, 0.0)
