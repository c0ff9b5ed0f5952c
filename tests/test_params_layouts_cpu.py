"""Every NVRTC kernel's parameter struct against the ctypes mirror the host packs it with, field by field.

Each ``.cu`` file static_asserts its struct's size, which catches a field added or dropped on one side but
not two fields swapped or retyped at the same size (the kernel would then read one argument as another,
silently). Here every field of each ctypes ``Structure`` is asserted at its ctypes offset in the C++
struct of the same name (``__builtin_offsetof``), compiled by NVRTC along with the kernel's own source: a
mismatch fails to compile, naming the field. Newer NVRTC only (13.0 lacks ``__builtin_offsetof``; CI's
13.0 leg does not run this file)."""

from __future__ import annotations

import ctypes

import pytest

from cute_kernels.ops.attention import backward, flash3_wgmma
from cute_kernels.ops.attention import problem as attention_problem
from cute_kernels.ops.conv3d import direct, grad, tiled
from cute_kernels.ops.gemm import gemv, sgemm_sm90
from cute_kernels.runtime import nvrtc

# (source file, C++ struct, ctypes mirror)
MIRRORS = [
    ("attention.cu", "attention::Params", attention_problem.Params),
    ("attention.cu", "attention::BwdParams", backward.BwdParams),
    ("attention.cu", "attention::DeltaParams", backward.DeltaParams),
    ("attention_sm90.cu", "attention_sm90::Params", flash3_wgmma.Params),
    ("attention_sm90.cu", "attention_sm90::BwdParams", backward.Sm90BwdParams),
    ("conv3d.cu", "conv3d::Args", direct.Conv3dArgs),
    ("conv3d.cu", "conv3d::GradArgs", grad.Conv3dGradArgs),
    ("conv3d.cu", "conv3d::TiledArgs", tiled.Conv3dTiledArgs),
    ("gemv.cu", "gemv::Params", gemv.Params),
    ("sgemm_sm90.cu", "sgemm_sm90::Params", sgemm_sm90.Params),
]

_PROBE = "ck_layout_probe"


def _assertions(cpp: str, mirror) -> str:
    lines = [f'static_assert(sizeof({cpp}) == {ctypes.sizeof(mirror)}, "{cpp}: size");']
    for field in mirror._fields_:
        name = field[0]
        if name.startswith("_"):  # the mirror's explicit padding: no C++ member
            continue
        offset = getattr(mirror, name).offset
        lines.append(f'static_assert(__builtin_offsetof({cpp}, {name}) == {offset}, "{cpp}::{name} at {offset}");')
    return "\n".join(lines)


def _compile_with(source: str, extra: str):
    sources = dict(nvrtc.read_source_tree(source))
    sources[source] = f"{sources[source]}\n{extra}\n__global__ void {_PROBE}() {{}}\n"
    options = nvrtc.compile_options(source, sources)
    return nvrtc._nvrtc_compile(source, sources, options, "sm_90a", (_PROBE,), "uncached")


@pytest.fixture(scope="module", autouse=True)
def _needs_offsetof():
    if nvrtc.nvrtc_version()[:2] <= (13, 0):
        pytest.skip("NVRTC 13.0 (the H200 machines') has no __builtin_offsetof; CI's main leg, on a newer "
                    "NVRTC, runs these")


@pytest.mark.parametrize("source, cpp, mirror", MIRRORS, ids=[m[1] for m in MIRRORS])
def test_every_field_lies_where_the_host_packs_it(source, cpp, mirror):
    assert _compile_with(source, _assertions(cpp, mirror)).data[:4] == b"\x7fELF"


def test_a_misplaced_field_fails_to_compile():
    """Not vacuous: gemv's Params with two same-sized fields swapped in the mirror is refused, naming one."""
    class Swapped(ctypes.Structure):
        _fields_ = [(name, kind) for name, kind in gemv.Params._fields_]
        _fields_[0], _fields_[1] = _fields_[1], _fields_[0]

    with pytest.raises(Exception, match=r"gemv::Params::(x|w) at"):
        _compile_with("gemv.cu", _assertions("gemv::Params", Swapped))
