"""conv3d's shape zoo (issue 22): the everyday shapes, each on the variant the op runs it on (``tiled``
as ``op.variant_for`` picks it)."""

from __future__ import annotations

from ...registry import register_zoo
from .direct import SPEC
from .problem import Conv3dProblem
from .tiled import TILED_SPEC


def spec_for(problem: Conv3dProblem):
    from .op import variant_for

    return TILED_SPEC if variant_for(None, (problem.kd, problem.kh, problem.kw), problem.out_height) == "tiled" else SPEC


def zoo_problems() -> list[Conv3dProblem]:
    """The shape zoo (issue 22): small volumes, batched volumes, every kernel side 1..7 on one volume,
    kernels that are not cubes, sides past 7 and a "same"-padded image."""
    small = [Conv3dProblem(1, 16, 16, 16, 5, 5, 5), Conv3dProblem(1, 32, 32, 32, 3, 3, 3)]
    batched = [Conv3dProblem(8, 64, 64, 64, 3, 3, 3, batched=True), Conv3dProblem(4, 32, 32, 32, 7, 7, 7, batched=True)]
    sides = [Conv3dProblem(1, 64, 64, 64, s, s, s) for s in range(1, 8)]
    uneven = [Conv3dProblem(1, 64, 96, 128, 1, 3, 7), Conv3dProblem(1, 96, 64, 100, 7, 1, 3)]
    # Issue 26's targets: a 15x15 blur of a 3072^2 image, 9^3 over 128^3, 15^3 over 64^3, 7 and 15 taps over
    # 2^24 samples, 3x3 and 5x5 ("same") over 4096^2 images.
    large = [Conv3dProblem(1, 1, 3072, 3072, 1, 15, 15), Conv3dProblem(1, 128, 128, 128, 9, 9, 9),
             Conv3dProblem(1, 64, 64, 64, 15, 15, 15), Conv3dProblem(1, 1, 1, 1 << 24, 1, 1, 7),
             Conv3dProblem(1, 1, 1, 1 << 24, 1, 1, 15)]
    padded = [Conv3dProblem(1, 1, 4096, 4096, 1, 3, 3), Conv3dProblem(1, 1, 4096, 4096, 1, 5, 5, pads=(0, 0, 2, 2, 2, 2))]
    # Past side 15 (the tiled variant): a 2047-tap filter, a 31x31 blur with "same" padding.
    tiled = [Conv3dProblem(1, 1, 1, 1_500_000, 1, 1, 2047),
             Conv3dProblem(1, 1, 1024, 1024, 1, 31, 31, pads=(0, 0, 15, 15, 15, 15))]
    return small + batched + sides + uneven + large + padded + tiled


def held_out_problems() -> list[Conv3dProblem]:
    """Held-out shapes (registry.register_zoo): a 100^3 volume with an even kernel, an uneven batched one."""
    return [Conv3dProblem(1, 100, 100, 100, 4, 4, 4), Conv3dProblem(2, 40, 60, 80, 3, 5, 7, batched=True)]



register_zoo(SPEC.op, zoo_problems, spec_for, held_out_problems)
