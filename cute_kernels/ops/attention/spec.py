"""What attention's registry entries share: inputs, the float64 reference and its error scale, the torch
SDPA baselines, work and traffic, the tuned-table key, the standard problems, and ``attention_spec``, which
builds and registers one entry from its variant's own fields."""

from __future__ import annotations

import contextlib
import functools
import math

import torch

from cute_kernels.runtime.nvrtc import checked_compile

from ...registry import KernelSpec, log2_floor, register, settled_baseline
from ...runtime import oracle
from .problem import SOURCE, AttentionProblem


def make_inputs(problem: AttentionProblem, device, generator=None) -> dict:
    def randn(heads, rows):
        return torch.randn((problem.batch, heads, rows, problem.d), dtype=problem.dtype, device=device,
                           generator=generator)

    kv_heads = problem.kv_heads or problem.heads
    return {"q": randn(problem.heads, problem.m), "k": randn(kv_heads, problem.n), "v": randn(kv_heads, problem.n)}


def attention_mask(m: int, n: int, device, causal=False, window=None, num_sinks=0) -> torch.Tensor | None:
    """True where query i sees key j: j <= i when causal, and with a window (left, right) (a side None:
    unbounded) i - left <= j <= i + right or j < num_sinks. None: every key (no mask)."""
    if window is None and not causal:
        return None
    i = torch.arange(m, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    seen = torch.ones(m, n, dtype=torch.bool, device=device)
    if window is not None:
        left, right = window
        if left is not None:
            seen &= j >= i - left
        if right is not None:
            seen &= j <= i + right
        seen |= j < num_sinks
    if causal:
        seen &= j <= i
    return seen


def reference_and_scale(q, k, v, scale=None, causal=False, window=None, num_sinks=0) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention and its per-element error scale, sum_j p_ij |v_jc|: the size of the terms of each
    output's weighted sum, which is what rounding errors in p and in the sum are proportional to.
    Computed one (batch, head) slice at a time so the float64 scores of large problems fit in memory.
    A row that sees no key (a window past the keys) is 0, as the kernels write it."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if q.dim() > 2 and k.shape[-3] != q.shape[-3]:  # grouped-query: each key/value head serves a group
        group = q.shape[-3] // k.shape[-3]
        k, v = (t.repeat_interleave(group, dim=-3) for t in (k, v))
    q4, k4, v4 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    ref = torch.empty(q4.shape, dtype=torch.float64, device=q.device)
    mag = torch.empty_like(ref)
    mask = attention_mask(q.shape[-2], k.shape[-2], q.device, causal, window, num_sinks)
    for i in range(q4.shape[0]):
        s = (q4[i].double() @ k4[i].double().T) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        if mask is not None:  # rows that see no key: softmax over nothing is 0/0; theirs is 0
            p = torch.where(mask.any(-1, keepdim=True), p, torch.zeros((), dtype=p.dtype, device=p.device))
        ref[i] = p @ v4[i].double()
        mag[i] = p @ v4[i].double().abs()
    shape = q.shape
    return ref.reshape(shape), mag.reshape(shape).clamp_min(torch.finfo(torch.float64).tiny)


def _reference(problem: AttentionProblem, inputs: dict) -> torch.Tensor:
    return reference_and_scale(inputs["q"], inputs["k"], inputs["v"], inputs.get("scale"), problem.causal,
                               problem.window, problem.num_sinks)[0]


def _error_scale(problem: AttentionProblem, inputs: dict) -> torch.Tensor:
    return reference_and_scale(inputs["q"], inputs["k"], inputs["v"], inputs.get("scale"), problem.causal,
                               problem.window, problem.num_sinks)[1]


def sdpa_backends(dtype: torch.dtype):
    """The torch SDPA backends we compare against: FlashAttention-2 for fp16/bf16; for float32, torch's own
    choice among the backends that take it (efficient, else math), TF32 off."""
    from torch.nn.attention import SDPBackend

    if dtype == torch.float32:
        return [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return [SDPBackend.FLASH_ATTENTION]


def _window_mask(problem: AttentionProblem, device) -> torch.Tensor:
    """A windowed problem's boolean mask (causal folded in), made once per shape: SDPA's attn_mask."""
    key = (problem.m, problem.n, problem.causal, problem.window, problem.num_sinks, str(device))
    mask = _window_masks.get(key)
    if mask is None:
        _window_masks.clear()  # one at a time: a (M, N) bool tensor can be large
        mask = _window_masks[key] = attention_mask(problem.m, problem.n, device, problem.causal, problem.window,
                                                   problem.num_sinks)
    return mask


_window_masks: dict[tuple, torch.Tensor] = {}


@contextlib.contextmanager
def _baseline_settings(problem: AttentionProblem):
    """The settings torch's SDPA baseline runs under: the flash backend (16-bit) or efficient/math (float32,
    and a window's boolean mask, which the flash backend does not take), TF32 off."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if problem.windowed else sdpa_backends(problem.dtype)
    with oracle.fp32_matmuls(), sdpa_kernel(backends):
        yield


def _sdpa_call(problem: AttentionProblem, inputs: dict):
    """SDPA's call on ``inputs`` as model code makes it (a windowed problem as a boolean attn_mask), to run
    under ``_baseline_settings``."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    masking = ({"attn_mask": _window_mask(problem, q.device)} if problem.windowed else {"is_causal": problem.causal})
    kwargs = {**masking, "scale": inputs.get("scale"), **_gqa(problem)}
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)


def _baseline_caveat(problem: AttentionProblem) -> str | None:
    """A window's baseline computes every (query, key) pair and then masks: what a windowed call is worth
    against it is not a like-for-like figure."""
    if problem.windowed:
        return "for a window: the efficient backend with a dense boolean mask, every pair computed"
    return None


def _eager_baseline(problem: AttentionProblem, inputs: dict):
    """torch SDPA's call and its settings: the baseline runs it once under them (``settled_baseline``), the
    report's wall figure back to back with the settings made once around the calls."""
    return _sdpa_call(problem, inputs), functools.partial(_baseline_settings, problem)


def _cudnn_attention(problem: AttentionProblem, inputs: dict) -> torch.Tensor:
    """torch SDPA's cuDNN backend, which uses Hopper-only instructions on the H200: shown beside the
    FlashAttention-2 baseline in the report (it raises where cuDNN cannot take the problem)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if problem.windowed:
        raise ValueError("the cuDNN baseline here takes no window")
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(
            inputs["q"], inputs["k"], inputs["v"], is_causal=problem.causal, scale=inputs.get("scale"),
            **_gqa(problem))


def _gqa(problem: AttentionProblem) -> dict:
    """SDPA's grouped-query switch, passed only where k and v have fewer heads than q."""
    return {"enable_gqa": True} if problem.kv_heads and problem.kv_heads != problem.heads else {}


def unmasked_pairs(m: int, n: int, causal: bool) -> int:
    """(query, key) pairs a causal (top-left) or full attention computes: sum_i min(i + 1, n)."""
    if not causal:
        return m * n
    full = max(0, m - n)  # rows i >= n see all n keys
    ramp = min(m, n)  # rows i < n see i + 1 keys
    return ramp * (ramp + 1) // 2 + full * n


def window_pairs(problem: AttentionProblem) -> int:
    """(query, key) pairs a windowed problem's rows see (row_keys: the window and the sinks past it)."""
    from .problem import row_keys

    total = 0
    for row in range(problem.m):
        lo, hi, sinks = row_keys(problem, row)
        if hi < lo:
            total += sinks
        else:  # the window, and the sinks before and after it
            total += (hi - lo + 1) + min(sinks, lo) + max(0, sinks - 1 - hi)
    return total


def _flops(problem: AttentionProblem) -> float:
    pairs = window_pairs(problem) if problem.windowed else unmasked_pairs(problem.m, problem.n, problem.causal)
    return 4.0 * problem.batch_heads * pairs * problem.d


def _bytes(problem: AttentionProblem) -> float:
    kv_heads = problem.kv_heads or problem.heads
    return problem.batch * (2 * problem.heads * problem.m + 2 * kv_heads * problem.n) * problem.d * problem.dtype.itemsize


def shape_bucket(problem: AttentionProblem) -> str:
    """Tuned-config key: dtype, head dim, causal, vector width, and the log2 of M, N and batch * heads."""
    window = f":window{problem.window}:sinks{problem.num_sinks}" if problem.windowed else ""
    window += ":lse" if problem.lse else ""
    return (f"{str(problem.dtype).removeprefix('torch.')}:d{problem.d}:{'causal' if problem.causal else 'full'}:"
            f"vec{problem.vector_width}:m2^{log2_floor(problem.m)}:n2^{log2_floor(problem.n)}:"
            f"bh2^{log2_floor(problem.batch_heads)}{window}")


def fp32_standard_problems() -> list[AttentionProblem]:
    return [
        AttentionProblem(1, 1, 512, 256, 128, torch.float32),  # LeetGPU's size
        AttentionProblem(1, 1, 4096, 4096, 128, torch.float32),
        AttentionProblem(1, 1, 4096, 4096, 128, torch.float32, causal=True),
        AttentionProblem(4, 16, 1024, 1024, 64, torch.float32),
    ]


def flash_standard_problems() -> list[AttentionProblem]:
    return [
        AttentionProblem(4, 16, 4096, 4096, 128, torch.float16),
        AttentionProblem(4, 16, 4096, 4096, 64, torch.float16),
        AttentionProblem(4, 16, 4096, 4096, 128, torch.bfloat16),
        AttentionProblem(4, 16, 4096, 4096, 128, torch.float16, causal=True),
    ]


# The shape zoo (issue 22; registered by op.py with the op's routing): few batch x heads at prefill lengths (the grid does not fill 132 SMs), many
# short sequences, long causal sequences, both head dims the fast kernels specialise.
def flash_zoo_problems() -> list[AttentionProblem]:
    shapes = [  # (batch, heads, sequence, head dim, causal)
        (1, 8, 512, 128, False), (1, 16, 1024, 128, False), (1, 16, 2048, 64, False), (1, 8, 2048, 128, True),
        (16, 16, 256, 128, False), (16, 16, 256, 64, False),
        (1, 8, 8192, 128, True), (1, 16, 16384, 64, True),
    ]
    fp16 = [AttentionProblem(b, h, s, s, d, torch.float16, causal) for b, h, s, d, causal in shapes]
    bf16 = [AttentionProblem(b, h, s, s, d, torch.bfloat16, causal) for b, h, s, d, causal in
            ((1, 16, 1024, 128, False), (16, 16, 256, 64, False), (1, 8, 8192, 128, True))]
    # Grouped-query attention as LLMs run it: 32 query heads over 8 key/value heads.
    gqa = [AttentionProblem(1, 32, s, s, 128, dtype, causal, kv_heads=8)
           for s, causal in ((1024, False), (8192, True)) for dtype in (torch.float16, torch.bfloat16)]
    # Sliding windows (Mistral's 4096 of 32k is this at a quarter scale) and a local window with sinks.
    windows = [AttentionProblem(1, 8, 8192, 8192, 128, torch.float16, True, window=(1024, 0)),
               AttentionProblem(1, 16, 4096, 4096, 64, torch.bfloat16, False, window=(256, 256), num_sinks=4)]
    return fp16 + bf16 + gqa + windows


def fp32_zoo_problems() -> list[AttentionProblem]:
    return [AttentionProblem(b, h, s, s, d, torch.float32, causal) for b, h, s, d, causal in (
        (1, 8, 512, 64, False), (1, 16, 1024, 128, False), (16, 16, 256, 64, False), (1, 1, 4096, 64, True),
    )] + [AttentionProblem(1, 8, 4096, 4096, 64, torch.float32, True, window=(512, 0))]


def held_out_problems() -> list[AttentionProblem]:
    """Held-out shapes (registry.register_zoo): a head dim of 96 (padded to 128), 12 heads at S3000, 40 query
    heads over 8, many causal sequences of 512, and float32 at S700."""
    return [AttentionProblem(1, 12, 3000, 3000, 96, torch.float16), AttentionProblem(1, 12, 3000, 3000, 64, torch.bfloat16),
            AttentionProblem(2, 40, 1024, 1024, 128, torch.float16, kv_heads=8),
            AttentionProblem(8, 16, 512, 512, 64, torch.float16, True),
            AttentionProblem(2, 8, 700, 700, 64, torch.float32), AttentionProblem(1, 4, 2500, 2500, 128, torch.float32, True)]


def attention_spec(*, name_expression, source=SOURCE, arch_specific=False, **variant_fields) -> KernelSpec:
    """Register one attention entry: ``variant_fields`` are its own KernelSpec fields (variant, dtypes,
    configs, launch, standard problems, descriptions); ``name_expression(config, problem)`` names its
    kernel template in ``source`` (a file of legacy_cuda/), which ``compile`` builds once
    ``why_unsupported`` accepts the pair. ``arch_specific``: the kernels use instructions of sm_90a alone,
    so a compile for sm_90 (what the tools ask of an NVRTC entry) builds for sm_90a, as the launch does."""
    compile_for = checked_compile(source, variant_fields["why_unsupported"], name_expression, arch_specific)
    return register(KernelSpec(
        op="attention",
        backend="nvrtc",
        compile=compile_for,
        make_inputs=make_inputs,
        reference=_reference,
        baseline=settled_baseline(_eager_baseline),
        eager_baseline=_eager_baseline,
        baseline_caveat=_baseline_caveat,
        flops=_flops,
        bytes=_bytes,
        sources=(source,),
        error_scale=_error_scale,
        shape_bucket=shape_bucket,
        arch_specific=arch_specific,
        **variant_fields,
    ))
