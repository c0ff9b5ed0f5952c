"""The bad-input suite: for every public op, calls a careless user could make, and what each must do.

A case either computes the right answer (compared with torch on the same inputs, float64 where torch can)
or raises a ``TypeError``/``ValueError`` whose message starts with the argument's name, leaving ``out``
exactly as it was. ``run_case`` returns how the call ended; ``report()`` runs them all and renders the
table that docs record. tests/test_bad_inputs.py runs every case on the GPU.

    python -m cute_kernels.tools.bad_inputs      # the table, on a GPU machine
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

import cute_kernels as ck


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    name: str
    call: Callable[[], tuple]  # -> (thunk running the op, out tensor or None, torch reference thunk or None)
    expect: str  # "ok" or the argument the error must name


def _t(*shape, dtype=torch.float32, device="cuda"):
    return torch.randn(shape, dtype=dtype, device=device)


def _offset1(*shape, dtype=torch.float32):
    """A tensor whose data starts one element past an allocation (misaligned for vector loads)."""
    n = 1
    for s in shape:
        n *= s
    return _t(n + 1, dtype=dtype)[1:].view(shape)


def _gemm_cases(op: str, dtype) -> list[Case]:
    fn = getattr(ck, op)
    other = torch.float64 if dtype == torch.float32 else torch.float32

    def mm(a, b, c=None, alpha=1.0, beta=0.0):
        ref = alpha * (a.double() @ b.double())
        return ref + beta * c.double() if c is not None and beta != 0 else ref

    def case(name, expect, make):
        return Case(op, name, make, expect)

    def simple(a, b, **kw):
        return lambda: (lambda: fn(a, b, **kw), kw.get("out"), lambda: mm(a, b, kw.get("c"), kw.get("alpha", 1.0),
                                                                            kw.get("beta", 0.0)))

    return [
        case("wrong dtype", "a", lambda: simple(_t(8, 8, dtype=other), _t(8, 8, dtype=dtype))()),
        case("CPU tensor", "a", lambda: simple(_t(8, 8, dtype=dtype, device="cpu"), _t(8, 8, dtype=dtype))()),
        case("mismatched K", "b", lambda: simple(_t(8, 5, dtype=dtype), _t(6, 8, dtype=dtype))()),
        case("zero-size M", "ok", lambda: simple(_t(0, 8, dtype=dtype), _t(8, 9, dtype=dtype))()),
        case("K = 0, beta != 0", "ok", lambda: simple(_t(7, 0, dtype=dtype), _t(0, 9, dtype=dtype),
                                                        c=_t(7, 9, dtype=dtype), beta=0.5)()),
        case("transposed a (column-major)", "ok", lambda: simple(_t(16, 8, dtype=dtype).t(), _t(16, 8, dtype=dtype))()),
        case("misaligned a (offset 1)", "ok", lambda: simple(_offset1(33, 17, dtype=dtype), _t(17, 9, dtype=dtype))()),
        case("sliced columns of b", "ok", lambda: simple(_t(33, 17, dtype=dtype), _t(17, 12, dtype=dtype)[:, 1:10])()),
        case("out overlaps a", "out", lambda: (lambda a: simple(a[:, :8], _t(8, 8, dtype=dtype), out=a[:, 8:])())(
            _t(8, 16, dtype=dtype))),
        case("out wrong shape", "out", lambda: simple(_t(8, 8, dtype=dtype), _t(8, 8, dtype=dtype),
                                                      out=_t(8, 9, dtype=dtype))()),
        case("out wrong dtype", "out", lambda: simple(_t(8, 8, dtype=dtype), _t(8, 8, dtype=dtype),
                                                      out=_t(8, 8, dtype=other))()),
        case("c missing with beta != 0", "c", lambda: simple(_t(8, 8, dtype=dtype), _t(8, 8, dtype=dtype), beta=1.0)()),
        case("NaN and Inf in a", "ok", lambda: simple(
            _t(16, 16, dtype=dtype).index_fill_(1, torch.tensor([3], device="cuda"), float("nan"))
            .index_fill_(0, torch.tensor([5], device="cuda"), float("inf")), _t(16, 16, dtype=dtype))()),
        case("NaN in c, beta = 0", "ok", lambda: simple(_t(8, 8, dtype=dtype), _t(8, 8, dtype=dtype),
                                                        c=torch.full((8, 8), float("nan"), device="cuda", dtype=dtype))()),
        case("a is a list", "a", lambda: simple([[1.0]], _t(1, 1, dtype=dtype))()),
    ]


def _attention_cases() -> list[Case]:
    def sdpa(q, k, v, causal=False):
        # Tools reach ops only through the registry and the public ops (tests/test_layout_cpu.py), so the
        # float64 reference is torch's, with grouped-query heads expanded here.
        if q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            group = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)

    def call(q, k, v, out=None, causal=False):
        return lambda: (lambda: ck.attention(q, k, v, out=out, causal=causal), out, lambda: sdpa(q, k, v, causal))

    h = torch.float16
    return [
        Case("attention", "wrong dtype (int)", lambda: call(torch.ones(1, 1, 8, 64, dtype=torch.int32, device="cuda"),
                                                            _t(1, 1, 8, 64), _t(1, 1, 8, 64))(), "q"),
        Case("attention", "mixed dtypes", lambda: call(_t(1, 1, 8, 64, dtype=h), _t(1, 1, 8, 64), _t(1, 1, 8, 64, dtype=h))(), "k"),
        Case("attention", "CPU tensor", lambda: call(_t(8, 64, device="cpu"), _t(8, 64), _t(8, 64))(), "q"),
        Case("attention", "3-D (H, S, d) input", lambda: call(_t(2, 8, 64), _t(2, 8, 64), _t(2, 8, 64))(), "ok"),
        Case("attention", "grouped-query heads (8 q over 2 kv)", lambda: call(_t(1, 8, 8, 64), _t(1, 2, 8, 64),
                                                                             _t(1, 2, 8, 64))(), "ok"),
        Case("attention", "kv heads that do not divide q's", lambda: call(_t(1, 8, 8, 64), _t(1, 3, 8, 64),
                                                                         _t(1, 3, 8, 64))(), "k"),
        Case("attention", "k and v heads differ", lambda: call(_t(1, 8, 8, 64), _t(1, 2, 8, 64), _t(1, 4, 8, 64))(), "v"),
        Case("attention", "head dims differ", lambda: call(_t(1, 1, 8, 64), _t(1, 1, 8, 32), _t(1, 1, 8, 64))(), "k"),
        Case("attention", "k and v lengths differ", lambda: call(_t(1, 1, 8, 64), _t(1, 1, 9, 64), _t(1, 1, 8, 64))(), "v"),
        Case("attention", "zero queries", lambda: call(_t(1, 1, 0, 64), _t(1, 1, 8, 64), _t(1, 1, 8, 64))(), "ok"),
        Case("attention", "transposed heads/rows view", lambda: call(_t(1, 8, 2, 64).transpose(1, 2),
                                                                     _t(1, 8, 2, 64).transpose(1, 2),
                                                                     _t(1, 8, 2, 64).transpose(1, 2))(), "ok"),
        Case("attention", "misaligned q (offset 1), fp16", lambda: call(_offset1(1, 2, 17, 64, dtype=h),
                                                                        _t(1, 2, 33, 64, dtype=h), _t(1, 2, 33, 64, dtype=h))(), "ok"),
        Case("attention", "stride 2 in the head dim", lambda: call(_t(1, 1, 8, 128)[..., ::2], _t(1, 1, 8, 64),
                                                                   _t(1, 1, 8, 64))(), "q"),
        Case("attention", "out overlaps q", lambda: (lambda q: call(q, _t(8, 64), _t(8, 64), out=q)())(_t(8, 64)), "out"),
        Case("attention", "NaN in one key", lambda: call(_t(1, 1, 8, 64),
                                                         _t(1, 1, 8, 64).index_fill_(2, torch.tensor([3], device="cuda"), float("nan")),
                                                         _t(1, 1, 8, 64))(), "ok"),
    ]


def _conv3d_cases() -> list[Case]:
    def conv(vol, ker):
        v5 = vol.double().reshape(-1, 1, *vol.shape[-3:])
        out = F.conv3d(v5, ker.double()[None, None])
        return out.reshape(*vol.shape[:-3], *out.shape[-3:])

    def call(vol, ker, out=None):
        return lambda: (lambda: ck.conv3d(vol, ker, out=out), out, lambda: conv(vol, ker))

    return [
        Case("conv3d", "wrong dtype", lambda: call(_t(8, 8, 8, dtype=torch.float64), _t(3, 3, 3))(), "volume"),
        Case("conv3d", "CPU kernel", lambda: call(_t(8, 8, 8), _t(3, 3, 3, device="cpu"))(), "kernel"),
        Case("conv3d", "kernel larger than the volume", lambda: call(_t(4, 8, 8), _t(5, 3, 3))(), "kernel"),
        Case("conv3d", "kernel side 8 (past the tiled kernels)", lambda: call(_t(9, 9, 9), _t(8, 1, 1))(), "ok"),
        Case("conv3d", "2-D volume", lambda: call(_t(8, 8), _t(3, 3, 3))(), "volume"),
        Case("conv3d", "empty volume side", lambda: call(_t(0, 8, 8), _t(1, 1, 1))(), "volume"),
        Case("conv3d", "empty batch", lambda: call(_t(0, 8, 8, 8), _t(3, 3, 3))(), "ok"),
        Case("conv3d", "misaligned volume (offset 1)", lambda: call(_offset1(9, 10, 11), _t(3, 2, 5))(), "ok"),
        Case("conv3d", "transposed volume view", lambda: call(_t(10, 11, 12).transpose(0, 2), _t(3, 3, 3))(), "ok"),
        Case("conv3d", "non-contiguous kernel", lambda: call(_t(9, 9, 9), _t(3, 3, 3).transpose(0, 1))(), "ok"),
        Case("conv3d", "out overlaps volume", lambda: (lambda v: call(v, _t(1, 1, 1), out=v)())(_t(6, 6, 6)), "out"),
        Case("conv3d", "Inf in the volume", lambda: call(_t(6, 6, 6).index_fill_(0, torch.tensor([2], device="cuda"),
                                                                                   float("inf")), _t(2, 2, 2))(), "ok"),
    ]


def _scan_cases() -> list[Case]:
    def call(x, out=None, exclusive=False):
        def ref():
            s = torch.cumsum(x.double() if x.dtype.is_floating_point else x.long(), -1)
            return s - (x.double() if x.dtype.is_floating_point else x.long()) if exclusive else s

        return lambda: (lambda: ck.scan(x, out=out, exclusive=exclusive), out, ref)

    def raises(fn):
        return lambda: (fn, None, None)

    return [
        Case("scan", "wrong dtype (complex64)", raises(lambda: ck.scan(_t(100).to(torch.complex64))), "x"),
        Case("scan", "a uint8 x (an int64 sum)", lambda: call((_t(100) * 40).to(torch.uint8))(), "ok"),
        Case("scan", "logsumexp of integers", raises(lambda: ck.scan(_t(100).int(), op="logsumexp")), "x"),
        Case("scan", "unknown op ('mean')", raises(lambda: ck.scan(_t(100), op="mean")), "op"),
        Case("scan", "dim out of range", raises(lambda: ck.scan(_t(4, 5), dim=2)), "dim"),
        Case("scan", "reverse=1 (an int)", raises(lambda: ck.scan(_t(100), reverse=1)), "reverse"),
        Case("scan", "dim 0 of a transposed view", lambda: (lambda x: (
            lambda: ck.scan(x, dim=0), None, lambda: torch.cumsum(x.double(), 0)))(_t(100, 37).t()), "ok"),
        Case("scan", "reverse max of a misaligned view", lambda: (lambda x: (
            lambda: ck.scan(x, op="max", reverse=True), None,
            lambda: torch.cummax(x.flip(0), 0).values.flip(0).double()))(_offset1(4097)), "ok"),
        Case("scan", "CPU tensor", lambda: call(_t(100, device="cpu"))(), "x"),
        Case("scan", "zero-length rows", lambda: call(_t(5, 0))(), "ok"),
        Case("scan", "0-D tensor", lambda: call(torch.tensor(3.0, device="cuda"))(), "ok"),
        Case("scan", "transposed view", lambda: call(_t(100, 37).t())(), "ok"),
        Case("scan", "misaligned (offset 1)", lambda: call(_offset1(4097))(), "ok"),
        Case("scan", "out wrong dtype", lambda: call(torch.ones(10, device="cuda"),
                                                     out=torch.empty(10, dtype=torch.bool, device="cuda"))(), "out"),
        Case("scan", "out overlaps x, shifted", lambda: (lambda x: call(x[:-1], out=x[1:])())(_t(1001)), "out"),
        Case("scan", "in place (out is x)", lambda: (lambda x: call(x, out=x)())(_t(3000)), "ok"),
        Case("scan", "NaN and Inf", lambda: call(_t(5000).index_fill_(0, torch.tensor([10], device="cuda"), float("inf"))
                                                 .index_fill_(0, torch.tensor([4000], device="cuda"), float("nan")))(),
             "ok"),
    ]


def _kernel_choice_cases() -> list[Case]:
    """The arguments that pick the kernel: an unknown ``variant`` name, a ``config`` of the wrong type (a
    string, or another variant's config class)."""
    h = torch.float16

    def raises(fn):
        return lambda: (fn, None, None)

    def qkv(dtype=h):
        return [_t(1, 1, 8, 64, dtype=dtype) for _ in range(3)]

    return [
        Case("sgemm", "config of another op", raises(lambda: ck.sgemm(_t(8, 8), _t(8, 8), config=ck.ScanConfig())), "config"),
        Case("hgemm", "config as a string", raises(lambda: ck.hgemm(_t(8, 8, dtype=h), _t(8, 8, dtype=h), config="x")), "config"),
        Case("attention", "unknown variant", raises(lambda: ck.attention(*qkv(), variant="nope")), "variant"),
        Case("attention", "fp32 variant's config for fp16", raises(lambda: ck.attention(*qkv(), config=ck.Fp32Config())),
             "config"),
        Case("attention", "config as a string", raises(lambda: ck.attention(*qkv(), config="x")), "config"),
        Case("conv3d", "unknown variant", raises(lambda: ck.conv3d(_t(8, 8, 8), _t(3, 3, 3), variant="nope")), "variant"),
        Case("conv3d", "config as a string", raises(lambda: ck.conv3d(_t(8, 8, 8), _t(3, 3, 3), config="x")), "config"),
        Case("scan", "unknown variant", raises(lambda: ck.scan(_t(100), variant="nope")), "variant"),
        Case("scan", "config of another op", raises(lambda: ck.scan(_t(100), config=ck.Conv3dConfig())), "config"),
    ]


def _silent_wrong_answer_cases() -> list[Case]:
    """The classes that once gave a silent wrong answer: scalars judged in float64 but used in float32,
    outputs aliased through another storage object, coerced flags, negated views, config fields of the
    wrong type, and calls that would need a backward."""
    h = torch.float16

    def raises(fn, out=None):
        return lambda: (fn, out, None)

    def gemm_beta_tiny():
        a, b = _t(16, 8), _t(8, 12)
        c = torch.full((16, 12), float("nan"), device="cuda")  # beta rounds to 0 in float32: c is never read
        return (lambda: ck.sgemm(a, b, c, beta=1e-50), None, lambda: a.double() @ b.double())

    def dlpack_alias():
        base, b = _t(65, 64), _t(64, 64)
        a = base[:64]
        out = torch.from_dlpack(base[1:])  # a's memory, one row on, through another storage object
        return (lambda: ck.sgemm(a, b, out=out), out, None)

    def inference_out():
        with torch.inference_mode():
            out = torch.full((8, 8), float("nan"), device="cuda")
        return (lambda: ck.sgemm(_t(8, 8), _t(8, 8), out=out), out, None)

    return [
        Case("sgemm", "beta=1e-50 (0 in float32), NaN in c", gemm_beta_tiny, "ok"),
        Case("sgemm", "alpha=1e39 (past float32)", raises(lambda: ck.sgemm(_t(8, 8), _t(8, 8), alpha=1e39)), "alpha"),
        Case("attention", "scale=1e39 (past float32)", raises(lambda: ck.attention(*[_t(1, 1, 8, 64, dtype=h)
                                                                                  for _ in range(3)], scale=1e39)),
             "scale"),
        Case("sgemm", "out is a DLPack view of a", dlpack_alias, "out"),
        Case("scan", "exclusive='False' (a string)", raises(lambda: ck.scan(_t(100), exclusive="False")), "exclusive"),
        Case("attention", "causal=1 (an int)", raises(lambda: ck.attention(*[_t(8, 64) for _ in range(3)], causal=1)),
             "causal"),
        Case("scan", "negated view (torch._neg_view)", raises(lambda: ck.scan(torch._neg_view(_t(100)))), "x"),
        Case("conv3d", "config field of the wrong type", raises(lambda: ck.conv3d(_t(8, 8, 8), _t(3, 3, 3),
                                                                               config=ck.Conv3dConfig(depth=True))),
             "Conv3dConfig.depth"),
        Case("scan", "input that requires grad, with out=", raises(lambda: ck.scan(_t(100).requires_grad_(),
                                                                                 out=_t(100))), "out"),
        Case("sgemm", "inference-tensor out outside inference mode", inference_out, "out"),
    ]


def cases() -> list[Case]:
    return (_gemm_cases("sgemm", torch.float32) + _gemm_cases("hgemm", torch.float16) + _attention_cases()
            + _conv3d_cases() + _scan_cases() + _kernel_choice_cases() + _silent_wrong_answer_cases())


def _same(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """The op's answer against torch's: same shape, NaN where torch has NaN, same infinities, and finite
    values within a tolerance fit for the output dtype (the families' own tests hold the tight oracles)."""
    if tuple(got.shape) != tuple(ref.shape):
        return False
    g, r = got.double(), ref.double()
    if not torch.equal(torch.isnan(g), torch.isnan(r)):
        return False
    inf = torch.isinf(r)
    if not torch.equal(g[inf], r[inf]):
        return False
    finite = torch.isfinite(r)
    tol = 1e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-4
    return bool(((g[finite] - r[finite]).abs() <= tol * (1 + r[finite].abs())).all())


def run_case(case: Case) -> str:
    """How ``case`` ended: "ok", "error: <message>", or "WRONG: <why>" where it broke its promise."""
    thunk, out, reference = case.call()
    before = out.clone() if isinstance(out, torch.Tensor) else None
    # The reference first: an in-place call overwrites its input.
    expected = reference() if case.expect == "ok" else None
    try:
        result = thunk()
    except (TypeError, ValueError) as e:
        message = str(e)
        if case.expect == "ok":
            return f"WRONG: raised {type(e).__name__}: {message}"
        if not message.startswith(f"{case.expect}:"):
            return f"WRONG: the error does not name {case.expect}: {message}"
        if before is not None and not torch.equal(torch.nan_to_num(out, 7.0), torch.nan_to_num(before, 7.0)):
            return "WRONG: out was written before the error"
        return f"error: {type(e).__name__}: {message}"
    except Exception as e:  # noqa: BLE001 - anything else is a broken promise, reported as such
        return f"WRONG: {type(e).__name__}: {e}"
    if case.expect != "ok":
        return f"WRONG: computed a result where an error naming {case.expect} was expected"
    torch.cuda.synchronize()
    if not _same(result, expected):
        return "WRONG: differs from torch"
    return "ok"


def report() -> str:
    lines = ["| op | case | expected | outcome |", "| --- | --- | --- | --- |"]
    tally: dict[str, int] = {}
    for case in cases():
        outcome = run_case(case)
        kind = outcome.split(":")[0]
        tally[kind] = tally.get(kind, 0) + 1
        shown = outcome.replace("|", "\\|")[:160]
        lines.append(f"| {case.op} | {case.name} | {'result' if case.expect == 'ok' else 'error naming ' + case.expect} "
                     f"| {shown} |")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(tally.items()))
    return f"{sum(tally.values())} cases: {summary}.\n\n" + "\n".join(lines)


if __name__ == "__main__":
    import sys

    text = report()
    print(text)
    sys.exit(1 if "WRONG" in text else 0)
