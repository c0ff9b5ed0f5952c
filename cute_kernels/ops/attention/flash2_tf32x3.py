"""flash2_tf32x3: float32 attention on tensor cores, FP32-accurate: flash2_mma's kernel with float tiles, each
product split into three TF32 products (big x big + big x small + small x big, as CUTLASS's
OpMultiplyAddFastF32 and torch's own float32 attention compute), FP32 softmax and accumulators."""

from __future__ import annotations

import dataclasses

import torch

from ...runtime.config_fields import check_choice, check_fields
from ...runtime.device import MAX_GRID_X
from .problem import (AttentionLaunch, AttentionProblem, _largest_fitting, launch_with, padded_head_dim,
                      query_tile_launch)
from .spec import attention_spec, fp32_standard_problems


@dataclasses.dataclass(frozen=True)
class Tf32x3Config:
    """``block_m`` query rows per CTA, one warp per 16 of them (a warp's S and O accumulators for two 16-row
    blocks spill at d=128); keys ``block_n`` at a time."""

    block_m: int = 128
    block_n: int = 64

    def __post_init__(self):
        check_fields(self)
        check_choice(self, "block_m", (64, 128), "64 or 128")
        check_choice(self, "block_n", (32, 64), "32 or 64")

    @property
    def warps(self) -> int:
        return self.block_m // 16

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def shared_bytes(self, head_dim: int) -> int:
        """attention.cu FlashTile<float>::kSmemBytes: sQ and two K buffers (rows padded by 16 floats), two V
        buffers (by 4)."""
        return 4 * ((self.block_m + 2 * self.block_n) * (head_dim + 16) + 2 * self.block_n * (head_dim + 4))


# ptxas -v (sm_90a, NVRTC 13.x): up to d=128 every candidate fits in 255 registers without spills
# (tests/test_attention_cpu.py compiles each and checks); at d=256 every one spills 0.7-1 KB (O and its
# per-tile P V partial are 256 registers alone), so those calls stay on fused_fp32.
TF32X3_MAX_HEAD_DIM = 128


def tf32x3_why_unsupported(config: Tf32x3Config, problem: AttentionProblem) -> str | None:
    if problem.dtype != torch.float32:
        return f"dtype {problem.dtype} is not float32"
    if problem.sm is not None and problem.sm < 80:
        return f"mma.sync TF32 needs sm_80 or newer, got sm_{problem.sm}"
    if not 1 <= problem.d <= TF32X3_MAX_HEAD_DIM:
        return f"head dim {problem.d} is outside 1..{TF32X3_MAX_HEAD_DIM} (larger ones spill)"
    if problem.vector_width not in (1, 4):
        return f"vector width {problem.vector_width} is neither 1 nor 4"
    head_dim = padded_head_dim(problem.d)
    if config.shared_bytes(head_dim) > problem.shared_limit:
        return f"{config.shared_bytes(head_dim)} bytes of shared memory exceed the device's {problem.shared_limit}"
    if problem.batch_heads * -(-problem.m // config.block_m) > MAX_GRID_X:
        return "more CTAs than one launch's grid holds"
    return None


# The default float32 entry (op.default_entry) is this one where its grid alone keeps the GPU busy, and
# fused_fp32 elsewhere: that kernel splits the keys across CTAs when the query tiles are few, this one does
# not. On the H200 (scripts/probes/attention_fp32_probe.py, docs/notes/attention.md "3xTF32"), with 128-row
# tiles B1 H16 S1024 d128 (128 CTAs) and B2 H8 S700 d64 (96) ran 1.5x faster here, B1 H1 S4096 (32 CTAs)
# 1.7x slower and B1 H4 S2500 d128 causal (80 CTAs, about half of them short) 1.1x slower.
MIN_QUERY_TILES = 96


def tf32x3_is_default_for(problem: AttentionProblem) -> bool:
    """Whether float32 calls without a variant run here: some config takes the problem, and the grid is big
    enough: query tiles of 128 rows (half of them counted when causal: those are short) at least
    MIN_QUERY_TILES."""
    tiles = problem.batch_heads * -(-problem.m // 128)
    if (tiles // 2 if problem.causal else tiles) < MIN_QUERY_TILES:
        return False
    return any(tf32x3_why_unsupported(c, problem) is None for c in tf32x3_candidates())


def tf32x3_candidates() -> list[Tf32x3Config]:
    return [Tf32x3Config(bm, bn) for bm in (64, 128) for bn in (32, 64)]


def tf32x3_default_config(problem: AttentionProblem) -> Tf32x3Config:
    return _largest_fitting(_tf32x3_preferred(problem), tf32x3_candidates(), tf32x3_why_unsupported, problem)


def _tf32x3_preferred(problem: AttentionProblem) -> Tf32x3Config:
    # The probe's winners: 64x64 at d <= 64 (twice the CTAs per SM: 2 x 4 warps), 128x64 (8 warps) at d 128,
    # where the 64-row tile's shared memory (178 KB) leaves one CTA of 4 warps per SM.
    return Tf32x3Config(64, 64) if padded_head_dim(problem.d) <= 64 else Tf32x3Config(128, 64)


def tf32x3_name_expression(config: Tf32x3Config, problem: AttentionProblem) -> str:
    head_dim = padded_head_dim(problem.d)
    return (f"attention::flash2_mma_kernel<float, {head_dim}, {config.block_m}, {config.block_n}, {config.warps}, "
            f"{problem.vector_width}{problem.template_flags}>")


def tf32x3_standard_problems() -> list[AttentionProblem]:
    """The float32 standard problems this variant is the default for, and two more that are: 16 heads of 1024
    at d 128, and a causal 2048 at d 64."""
    return [p for p in fp32_standard_problems() if tf32x3_is_default_for(p)] + [
        AttentionProblem(4, 16, 1024, 1024, 128, torch.float32), AttentionProblem(2, 16, 2048, 2048, 64, torch.float32, True)]


_tf32x3_plans: dict[tuple, object] = {}  # one kernel per compiled kernel and device: a finite set


def tf32x3_prepare(config: Tf32x3Config, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> AttentionLaunch:
    """The launch for calls with the strides of ``inputs`` ({"q", "k", "v"}) and ``out`` on their device."""
    head_dim = padded_head_dim(problem.d)
    key = (config, head_dim, problem.vector_width, problem.windowed, problem.lse)
    return query_tile_launch(_tf32x3_plans, key, lambda: tf32x3_name_expression(config, problem),
                             config.shared_bytes(head_dim), config, problem, inputs, out)


TF32X3_SPEC = attention_spec(
    variant="flash2_tf32x3",
    dtypes=(torch.float32,),
    config_cls=Tf32x3Config,
    default_config=tf32x3_default_config,
    candidates=tf32x3_candidates,
    why_unsupported=tf32x3_why_unsupported,
    name_expression=tf32x3_name_expression,
    launch=launch_with(tf32x3_prepare),
    prepare=tf32x3_prepare,
    standard_problems=tf32x3_standard_problems,
    description="FP32-accurate FlashAttention-2 on mma.sync m16n8k8 TF32, each product as three (3xTF32)",
    baseline_name="torch SDPA (efficient, fp32, TF32 off)",
    bound="tf32x3",
    sweep_axes=(("block_m", "block_n"),),
)
