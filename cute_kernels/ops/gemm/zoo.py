"""The GEMMs' shape zoo: the everyday shapes users run, beside the report's large squares (issue 22).

Skinny M (a decode step: 1 to 128 rows) against LLM-sized N and K, the transposed case (skinny N), a
wave-quantised square (3072^3: 288 tiles of 128^2 on 132 SMs), small problems, and ragged shapes that are
multiples of no tile, one with rows no 16-byte access can take (K odd), and decode steps through a
transposed weight (``F.linear``'s layout). Problems are those of contiguous operands (alignments as such
tensors have them). The ops register them with their routing
(``registry.register_zoo``): the HGEMM shapes split between its two entries as a call with no config goes.
"""

from __future__ import annotations

import dataclasses

from .problem import GemmProblem, widest_dividing, widest_vector

__all__ = ["contiguous_problem", "hgemm_shapes", "sgemm_shapes", "hgemm_zoo", "sgemm_zoo", "hgemm_held_out",
           "sgemm_held_out"]

_DECODE_ROWS = (1, 16, 64, 128)
# (N, K): attention out, MLP up, MLP up (70B), MLP down, a grouped-query model's key or value projection.
_LLM_PROJECTIONS = ((4096, 4096), (11008, 4096), (14336, 4096), (4096, 11008), (1024, 4096))
_COMMON = [
    (4096, 16, 4096), (4096, 128, 4096),  # skinny N: the transposed decode
    (3072, 3072, 3072),  # wave-quantised
    (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),  # small
    (1000, 1000, 1000), (2047, 2049, 1023),  # ragged: no tile divides them
    (2048, 2048, 2047),  # K odd: A's rows are not 16-byte aligned
]


def contiguous_problem(m: int, n: int, k: int, dtype: str, beta_zero: bool = True) -> GemmProblem:
    """The problem of contiguous (M, K) and (K, N) operands: each alignment is the widest vector (16 bytes
    at most) that the row length allows, as ``make_problem`` measures it on fresh tensors."""
    widest = widest_vector(dtype)
    return GemmProblem(m=m, n=n, k=k, dtype=dtype, beta_zero=beta_zero, a_align=widest_dividing(k, widest),
                       b_align=widest_dividing(n, widest), c_align=widest_dividing(n, widest))


def hgemm_shapes() -> list[tuple[int, int, int]]:
    """(M, N, K) of the HGEMM zoo, float16; a smaller sample of it runs in bfloat16 (``hgemm_zoo``)."""
    # 32 decode rows against 6144 x 4096 was held out until the routing of rows 17-32 was fitted on it.
    return [(m, n, k) for m in _DECODE_ROWS for n, k in _LLM_PROJECTIONS] + _COMMON + [(32, 6144, 4096)]


def sgemm_shapes() -> list[tuple[int, int, int]]:
    # 64x2048x2048 was held out until the few-tiles rung was fitted on it (sgemm.default_config).
    return [(m, 4096, 4096) for m in (1, 16, 64, 128)] + [(64, 2048, 2048), (16, 4096, 11008)] + _COMMON


# Decode steps as F.linear runs them: x (M, K) times the transpose of a row-major (N, K) weight, the layout
# the GEMV variant streams (the shapes above take a row-major b).
_WEIGHT_DECODE = ((1, 4096, 4096), (16, 4096, 4096), (16, 14336, 4096))


def weight_problem(m: int, n: int, k: int, dtype: str) -> GemmProblem:
    """The problem of ``x @ w.t()`` for a contiguous x (M, K) and a contiguous weight w (N, K): b is
    column-major, aligned along its rows of K."""
    return dataclasses.replace(contiguous_problem(m, n, k, dtype), b_major="k",
                               b_align=widest_dividing(k, widest_vector(dtype)))


def hgemm_zoo() -> list[GemmProblem]:
    fp16 = [contiguous_problem(m, n, k, "float16") for m, n, k in hgemm_shapes()]
    fp16 += [weight_problem(m, n, k, "float16") for m, n, k in _WEIGHT_DECODE]
    bf16 = [contiguous_problem(m, n, k, "bfloat16") for m, n, k in
            ((1, 4096, 4096), (64, 11008, 4096), (3072, 3072, 3072), (1000, 1000, 1000), (2048, 2048, 2047))]
    return fp16 + bf16


def sgemm_zoo() -> list[GemmProblem]:
    return [contiguous_problem(m, n, k, "float32") for m, n, k in sgemm_shapes()]


# Held out (registry.register_zoo): everyday shapes of the same kinds that the default heuristics were not
# fitted on (the split-K and decode choices were read off the zoo above) and no tuned table holds: other
# decode widths and projections, a skinny N of 32 (of 4 on the SGEMM), other small and ragged squares,
# unaligned N.
_HELD_OUT = [(8, 5120, 5120), (4, 8192, 8192), (24, 5120, 5120), (2, 28672, 8192), (8192, 32, 8192),
             (1536, 2560, 1536), (6000, 2000, 700), (12, 1000, 999), (777, 3001, 2000)]


def hgemm_held_out() -> list[GemmProblem]:
    return ([contiguous_problem(m, n, k, "float16") for m, n, k in _HELD_OUT]
            + [contiguous_problem(m, n, k, "bfloat16") for m, n, k in ((8, 5120, 5120), (1536, 2560, 1536))])


def sgemm_held_out() -> list[GemmProblem]:
    return [contiguous_problem(m, n, k, "float32") for m, n, k in
            ((8, 4096, 8192), (48, 2048, 4096), (8192, 64, 4096), (1536, 1536, 1536), (6000, 2000, 700),
             (777, 3001, 2000), (8192, 4, 4096))]
