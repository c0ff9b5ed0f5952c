"""The default-config heuristic the GEMM families share: a ladder of measured configs, each judged by a
model of its run time on the H200, and the problem-independent parts of the families' validity checks."""

from __future__ import annotations

from ...runtime import device as _device
from ...runtime.device import H200_SM_COUNT
from .problem import GemmProblem, index_problem
from .split_k import tile_count

__all__ = ["estimated_time", "choose_from_ladder", "smem_problem", "batch_split_problem", "warp_mma_problem"]

# An SM runs its arithmetic pipes at full rate from 8 resident warps up (the 1-CTA 8-warp configs),
# proportionally slower below (one 4-warp CTA alone on an SM cannot hide its shared-memory latency and
# barriers).
_WARPS_TO_SATURATE = 8


def estimated_time(config, ctas_per_sm: int, throughput: float, problem: GemmProblem) -> float:
    """Relative run time of ``config`` (anything with tile_m, tile_n, num_threads) on the busiest SM: the
    tiles it computes (tiles are spread over the H200's SMs), each at the rate its resident warps sustain --
    a full ``throughput`` from 8 warps up, proportionally less below. ``ctas_per_sm``: how many CTAs of the
    config one SM holds (registers and shared memory)."""
    tiles = tile_count(config, problem) * problem.batch
    per_sm = -(-tiles // H200_SM_COUNT)
    warps = min(ctas_per_sm, per_sm) * config.num_threads // 32
    rate = throughput * min(1.0, warps / _WARPS_TO_SATURATE)
    return per_sm * config.tile_m * config.tile_n / rate


def choose_from_ladder(ladder, problem: GemmProblem, *, why_unsupported, candidates, family: str, adapt=None):
    """The default-config heuristic every family shares: of ``ladder`` ((config, CTAs one SM holds,
    relative throughput), largest tile first) the supported entry with the smallest
    :func:`estimated_time`; else the first supported candidate. ``adapt(config, problem)``: a family's
    per-problem change to a ladder entry before it is judged (None: none)."""
    best = None
    for config, ctas, throughput in ladder:
        if adapt is not None:
            config = adapt(config, problem)
        if why_unsupported(config, problem) is not None:
            continue
        t = estimated_time(config, ctas, throughput, problem)
        if best is None or t < best[0]:
            best = (t, config)
    if best is not None:
        return best[1]
    for fallback in candidates():
        if why_unsupported(fallback, problem) is None:
            return fallback
    raise ValueError(f"no {family} config supports {problem}")


def smem_problem(smem: int, budget: int) -> "str | None":
    """Why ``smem`` bytes of shared memory per CTA do not fit a CTA's ``budget`` (None: they fit)."""
    if smem > budget:
        return f"needs {smem} bytes of shared memory, more than the {budget} a CTA may have"
    return None


def batch_split_problem(config, problem: GemmProblem) -> "str | None":
    """Why ``config`` cannot run ``problem`` for its batch: split-K's workspace is per (M, N), so a split
    config runs unbatched problems only (None: it can)."""
    if problem.batch > 1 and config.split_k > 1:
        return f"split-K (split_k={config.split_k}) runs unbatched problems only, the problem has a batch of {problem.batch}"
    return None


def warp_mma_problem(config, problem: GemmProblem) -> "str | None":
    """What the validity predicates of the two warp-MMA families (``hgemm_sm80``, ``sgemm_tf32x3``: a
    ``WarpMmaConfig``) check alike, after their own class and dtype checks: the shared memory, the copy
    layouts of A and B at the problem's alignments and majors, the batch rule of split-K and 32-bit
    indexing (None: ``config`` runs ``problem``). The shared memory is judged against the problem's chip
    (``problem.sm``): 99 KB on sm_86/89/120 turns the largest rungs away there."""
    why = smem_problem(config.smem_bytes(), _device.shared_optin_bytes(problem.sm))
    if why is not None:
        return why
    for operand, vector, major in (("a", problem.a_align, problem.a_major), ("b", problem.b_align, problem.b_major)):
        why = config.copy_layout_problem(operand, vector, major)
        if why is not None:
            return why
    return batch_split_problem(config, problem) or index_problem(config, problem)
