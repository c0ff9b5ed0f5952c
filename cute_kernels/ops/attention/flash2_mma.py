"""flash2_mma: FP16/BF16 FlashAttention-2 on mma.sync tensor cores (ldmatrix, cp.async double buffering, P
kept in registers), FP32 softmax state and accumulators."""

from __future__ import annotations

import dataclasses

import torch

from ...runtime.config_fields import check_choice, check_fields
from ...runtime.device import MAX_GRID_X
from .problem import (AttentionLaunch, AttentionProblem, _largest_fitting, launch_with, padded_head_dim,
                      query_tile_launch)
from .spec import _cudnn_attention, attention_spec, flash_standard_problems

FLASH_HEAD_DIMS = (64, 128, 256)  # 64 and 128: the fast paths; other d are zero-padded up to the next one
FLASH_CPP_TYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


# The key loops of flash2_mma (attention.cu): "classic" is flash2_mma_kernel (two barriers per key tile,
# scores scaled by an FMUL and shifted by an FADD, O rescaled every tile); "lean" is flash2_lean_kernel (one
# barrier per tile, predicate-free copies of whole tiles, the scale folded into the FFMA feeding ex2, O
# rescaled only when a row's maximum grows by more than 2^8); "lean_eager" is the lean loop with O rescaled
# every tile, as the classic loop does.
FLASH_MAINLOOPS = ("classic", "lean", "lean_eager")


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    """``block_m`` query rows per CTA over ``warps`` warps (each owning block_m / warps rows, in blocks of
    16), keys ``block_n`` at a time; ``mainloop``: which key loop (FLASH_MAINLOOPS) runs the tiles."""

    block_m: int = 128
    block_n: int = 32
    warps: int = 4
    mainloop: str = "classic"

    def __post_init__(self):
        check_fields(self)
        check_choice(self, "block_m", (64, 128), "64 or 128")
        check_choice(self, "block_n", (32, 64, 128), "32, 64 or 128")
        if self.warps not in (4, 8) or self.block_m % (16 * self.warps):
            raise ValueError(f"FlashConfig.warps: expected 4 or 8 with block_m a multiple of 16 * warps, got "
                             f"{self.warps} for block_m={self.block_m}")
        check_choice(self, "mainloop", FLASH_MAINLOOPS, f"one of {FLASH_MAINLOOPS}")

    @property
    def row_blocks(self) -> int:
        """16-row blocks per warp (the kM16 of attention.cu)."""
        return self.block_m // (16 * self.warps)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def shared_bytes(self, head_dim: int) -> int:
        """attention.cu FlashTile::kSmemBytes: sQ and two buffers each of sK and sV, rows padded by 8."""
        return 2 * (self.block_m + 4 * self.block_n) * (head_dim + 8)

    def accumulators(self, head_dim: int) -> int:
        """FP32 accumulator registers per lane: O (head_dim / 2 per row block) and S (block_n / 2)."""
        return self.o_accumulators(head_dim) + self.s_accumulators

    def o_accumulators(self, head_dim: int) -> int:
        return self.row_blocks * head_dim // 2

    @property
    def s_accumulators(self) -> int:
        return self.row_blocks * self.block_n // 2


# Measured with ptxas -v (sm_90a, NVRTC 13.5): above these the 255-register budget spills (the element-wise
# copies of the slow path hold a few more registers than cp.async). 192 is FlashAttention-2's own budget:
# 128x64 tiles at d=128 and 128x128 at d=64, four warps, each warp 32 rows.
FLASH_MAX_ACCUMULATORS = {8: 192, 1: 144}
# The lean loops sit at the 255-register cap at that full budget too, and which of them fit there is what
# ptxas says, not a formula (tests/test_attention_cpu.py compiles every supported candidate and checks for
# spills; NVRTC 13.5 for sm_80/sm_90a and 13.0, the H200's, for sm_90a agree on this). At 192 accumulators,
# "lean" fits with at most 64 S accumulators per lane (128x64 at d=128) and spills with 128 (128x128 at
# d=64); "lean_eager", which rescales O every tile, spills on both. Below the full budget every tile fits.
# Value: the most S accumulators per lane a loop fits at the full budget (None: no tile).
FLASH_LEAN_S_AT_FULL_BUDGET = {"lean": 64, "lean_eager": None}
# The classic loop with windows and sinks (the per-row bounds in every tile's body) or the log-sum-exp
# output: the tiles ptxas spills (sm_90a or sm_80, NVRTC 13.x), as (block_m, block_n, warps, head dim,
# vector width). At the 255-register cap this moves with any edit, so it is measured, not derived, and the
# CPU tests compile every other candidate of these kernels and check it has no spills.
FLASH_MASKED_SPILLS = frozenset({(128, 32, 4, 128, 8), (128, 64, 4, 128, 8), (128, 128, 4, 64, 8),
                                 (64, 128, 4, 128, 1), (128, 128, 8, 128, 1)})
# The lean loops with windows and sinks or the log-sum-exp output, likewise measured on the three compilers
# the CPU tests run (NVRTC 13.5 for sm_80 and sm_90a, 13.0 for sm_90a), as (mainloop, block_m, block_n,
# warps, head dim, vector width, windowed, lse): the tiles some compiler spills.
FLASH_LEAN_MASKED_SPILLS = frozenset({("lean", 128, 64, 4, 128, 8, True, True),
                                      ("lean_eager", 128, 32, 4, 128, 8, True, True)})
# Spills that are run anyway, with the most bytes ptxas may report for them (stores, loads). "lean" at
# 128x64 over 4 warps and d=128 with the log-sum-exp: NVRTC 13.0 (sm_90a, the H200's) spills 8 / 48 bytes,
# 13.5 none. nvdisasm shows one 8-byte reload at the entry of the masked tiles' loop and one per masked tile
# (at most three per CTA), and on the H200 the call costs what it costs without the log-sum-exp (B4 H16
# S4096 causal: 775.7 vs 772.5 us), where the spill-free eight-warp tile takes 1027 us.
FLASH_TOLERATED_SPILLS = {("lean", 128, 64, 4, 128, 8, False, True): (8, 56)}


def _lean_spill_reason(config: FlashConfig, head_dim: int, budget: int) -> str | None:
    if config.mainloop not in FLASH_LEAN_S_AT_FULL_BUDGET or config.accumulators(head_dim) < budget:
        return None
    limit = FLASH_LEAN_S_AT_FULL_BUDGET[config.mainloop]
    if limit is None:
        return f"mainloop={config.mainloop!r} spills at the full {budget}-accumulator budget"
    if config.s_accumulators > limit:
        return (f"mainloop={config.mainloop!r} spills with {config.s_accumulators} S accumulators per lane at the "
                f"full {budget}-accumulator budget (at most {limit})")
    return None


def flash_why_unsupported(config: FlashConfig, problem: AttentionProblem) -> str | None:
    if problem.dtype not in FLASH_CPP_TYPES:
        return f"dtype {problem.dtype} is not float16 or bfloat16"
    if not 1 <= problem.d <= FLASH_HEAD_DIMS[-1]:
        return f"head dim {problem.d} is outside 1..{FLASH_HEAD_DIMS[-1]}"
    if problem.vector_width not in (1, 8) or (problem.vector_width == 8 and problem.d % 8):
        return f"vector width {problem.vector_width} needs d % 8 == 0 (or use 1), got d={problem.d}"
    head_dim = padded_head_dim(problem.d, FLASH_HEAD_DIMS)
    budget = FLASH_MAX_ACCUMULATORS[problem.vector_width]
    if config.accumulators(head_dim) > budget:
        return (f"{config.accumulators(head_dim)} FP32 accumulators per lane at head dim {head_dim} spill "
                f"(at most {budget} with {problem.vector_width}-element copies)")
    lean = _lean_spill_reason(config, head_dim, budget)
    if lean is not None:
        return lean
    if ((problem.windowed or problem.lse) and config.mainloop == "classic"
            and (config.block_m, config.block_n, config.warps, head_dim, problem.vector_width) in FLASH_MASKED_SPILLS):
        return (f"{config.block_m}x{config.block_n} over {config.warps} warps at head dim {head_dim} spills with a "
                "window's masks or the log-sum-exp output")
    if ((config.mainloop, config.block_m, config.block_n, config.warps, head_dim, problem.vector_width,
         problem.windowed, problem.lse) in FLASH_LEAN_MASKED_SPILLS):
        return (f"mainloop={config.mainloop!r} at {config.block_m}x{config.block_n} over {config.warps} warps and "
                f"head dim {head_dim} spills with " + " and ".join(
                    what for what, on in (("a window's masks", problem.windowed), ("the log-sum-exp output", problem.lse))
                    if on))
    if config.shared_bytes(head_dim) > problem.shared_limit:
        return f"{config.shared_bytes(head_dim)} bytes of shared memory exceed the device's {problem.shared_limit}"
    if problem.batch_heads * -(-problem.m // config.block_m) > MAX_GRID_X:
        return "more CTAs than one launch's grid holds"
    return None


def flash_candidates() -> list[FlashConfig]:
    return [FlashConfig(bm, bn, w, loop) for loop in FLASH_MAINLOOPS for bm in (64, 128) for bn in (32, 64, 128)
            for w in (4, 8) if bm % (16 * w) == 0]


def flash_default_config(problem: AttentionProblem) -> FlashConfig:
    # Where the preferred tile does not fit (less shared memory), the largest classic tile that does.
    classic = [c for c in flash_candidates() if c.mainloop == "classic"]
    return _largest_fitting(_flash_preferred(problem), classic, flash_why_unsupported, problem)


def _flash_preferred(problem: AttentionProblem) -> FlashConfig:
    head_dim = padded_head_dim(problem.d, FLASH_HEAD_DIMS)
    if problem.vector_width == 1:
        return FlashConfig(64, 32, 4)  # the slow path: element-wise copies, one 16-row block per warp
    # FlashAttention-2's tiles on sm80/sm90: 128 query rows over 4 warps (two 16-row blocks per warp, so
    # every K and V fragment read from shared memory feeds two MMAs), and the widest key tile whose S
    # accumulators still fit next to O: 64 keys at d=128, 128 at d=64. Wide key tiles spread each tile's
    # fixed costs (two barriers, the row max/sum shuffles, rescaling O) over more MMAs.
    # At d=64 and d=128 the lean key loop at 128x64 (one barrier per tile, the scale folded into the exp,
    # O rescaled only when a row max grows by 2^8) is the H200 probe's winner (scripts/probes/attention_probe.py,
    # fp16 B=4 H=16 S=4096: 1.114x torch FLASH at d=128, the classic loop 0.977x). Other head dims keep
    # the classic loop (unmeasured).
    if head_dim in (64, 128):
        # Windows, sinks and the log-sum-exp output too; where those spill the 4-warp lean tile (d=128 with
        # both), eight warps of 16 rows each.
        lean = FlashConfig(128, 64, 4, "lean")
        if (problem.windowed or problem.lse) and flash_why_unsupported(lean, problem) is not None:
            return FlashConfig(128, 64, 8, "lean")
        return lean
    return FlashConfig(64, 32, 4)


def flash_name_expression(config: FlashConfig, problem: AttentionProblem) -> str:
    head_dim = padded_head_dim(problem.d, FLASH_HEAD_DIMS)
    args = (f"{FLASH_CPP_TYPES[problem.dtype]}, {head_dim}, {config.block_m}, {config.block_n}, {config.warps}, "
            f"{problem.vector_width}")
    if config.mainloop == "classic":
        return f"attention::flash2_mma_kernel<{args}{problem.template_flags}>"
    lazy = "true" if config.mainloop == "lean" else "false"
    return f"attention::flash2_lean_kernel<{args}, {lazy}{problem.template_flags}>"


# One kernel per compiled kernel and device, a finite set (every part of the key is a template argument), so
# unbounded.
_flash_plans: dict[tuple, object] = {}


def flash_prepare(config: FlashConfig, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> AttentionLaunch:
    """The flash2_mma launch for calls with the strides of ``inputs`` ({"q", "k", "v"}) and ``out``
    (contiguous) on their device: the kernel loaded, the grid sized, the parameters packed."""
    head_dim = padded_head_dim(problem.d, FLASH_HEAD_DIMS)
    key = (config, problem.dtype, head_dim, problem.vector_width, problem.windowed, problem.lse)
    return query_tile_launch(_flash_plans, key, lambda: flash_name_expression(config, problem),
                             config.shared_bytes(head_dim), config, problem, inputs, out)


FLASH_SPEC = attention_spec(
    variant="flash2_mma",
    dtypes=(torch.float16, torch.bfloat16),
    config_cls=FlashConfig,
    default_config=flash_default_config,
    candidates=flash_candidates,
    why_unsupported=flash_why_unsupported,
    name_expression=flash_name_expression,
    launch=launch_with(flash_prepare),
    prepare=flash_prepare,
    standard_problems=flash_standard_problems,
    description="FlashAttention-2, mma.sync m16n8k16 + ldmatrix + cp.async double buffering, P in registers",
    baseline_name="torch SDPA FLASH_ATTENTION",
    other_baselines={"torch SDPA cuDNN": _cudnn_attention},
    bound="fp16",
    sweep_axes=(("block_m", "block_n"), ("warps",)),
)
