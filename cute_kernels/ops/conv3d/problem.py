"""What a conv3d call is to its configs and compile keys: the problem, the access widths, the grid, the
validity predicate, and the public op's argument checks.

``O[i, j, k] = sum_{d, r, c} V[i + d, j + r, k + c] * K[d, r, c]`` over a ``volume`` (D, H, W) or
(N, D, H, W), zero-padded as ``padding`` says, and a ``kernel`` (KD, KH, KW) of any sides: a
(D' - KD + 1, H' - KH + 1, W' - KW + 1) result over the padded sides D', H', W' (N in front when batched),
like ``torch.nn.functional.conv3d`` with one channel and TF32 off.
"""

from __future__ import annotations

import dataclasses
import operator
import torch

from ...runtime import checks
from ...runtime.checks import INT32_MAX
from ...runtime.device import SM90_SHARED_BYTES, shared_memory_limit

MAX_KERNEL_SIDE = 15  # the direct variant's unrolled sides; past them the tiled variant runs
# How far past a volume's last row or column the kernel's 32-bit coordinates run: the last CTA's tile starts
# inside the volume and addresses its whole tile plus the kernel's halo (``row = h0 + ...``, ``col = w0 + ...``
# in conv3d.cu, int), up to 1024 * thread_w = 8192 columns and 128 * thread_h = 512 rows (Conv3dConfig's
# bounds) plus 8. On a side closer to 2^31 than this a coordinate would wrap negative, and a negative one
# passes the kernel's ``row < height`` tests: reads before the volume, writes before the output.
COORD_MARGIN = 16384


def _widest_vector(*conditions) -> int:
    """The widest of 4, 2, 1 elements for which every ``condition(v)`` holds."""
    for v in (4, 2, 1):
        if all(c(v) for c in conditions):
            return v
    return 1


NO_PADS = (0, 0, 0, 0, 0, 0)


def _size(value):
    """A padding size as an int (NumPy's integers and a 0-dim integer tensor too, as torch's convolutions take
    them; not a bool or a float), the SymInt torch.compile makes of one as it is (a padding derived from a
    kernel's shape in a traced backward), or None for anything else."""
    if (isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool
            and not (value.is_floating_point() or value.is_complex())):
        return operator.index(value)
    return checks.integer(value)


def conv_pads(padding, ksides: tuple, rank: int, name: str = "padding") -> tuple[int, ...]:
    """``padding`` of a rank-``rank`` correlation with kernel sides ``ksides`` as the zeros before and after
    each of the three conv3d dims, (d_lo, d_hi, h_lo, h_hi, w_lo, w_hi) (the dims a 2-D or 1-D call lacks
    get none): ``"valid"`` none; ``"same"`` an output of the input's shape, the odd zero of an even kernel
    after (as torch pads); an int for every side (or a tuple of one, as torch takes it); a tuple of ``rank``
    ints, one per dim, on both sides; or a tuple of ``rank`` (before, after) pairs."""
    expected = f"'valid', 'same', an int, or a tuple of {rank} ints or of {rank} (before, after) pairs"
    if isinstance(padding, str):
        if padding == "valid":
            sides = [(0, 0)] * rank
        elif padding == "same":
            sides = [((k - 1) // 2, k - 1 - (k - 1) // 2) for k in ksides[-rank:]]
        else:
            raise ValueError(f"{name}: expected {expected}, got {padding!r}")
    elif _size(padding) is not None:
        sides = [(_size(padding),) * 2] * rank
    elif (isinstance(padding, (tuple, list)) and len(padding) in (1, rank)
          and all(_size(p) is not None for p in padding)):
        sides = [(_size(p), _size(p)) for p in padding] * (rank // len(padding))
    elif (isinstance(padding, (tuple, list)) and len(padding) == rank
          and all(isinstance(p, (tuple, list)) and len(p) == 2 and all(_size(v) is not None for v in p)
                  for p in padding)):
        sides = [(_size(p[0]), _size(p[1])) for p in padding]
    else:
        raise TypeError(f"{name}: expected {expected}, got {padding!r}")
    if min(v for side in sides for v in side) < 0:
        raise ValueError(f"{name}: expected non-negative sizes, got {padding!r}")
    sides = [(0, 0)] * (3 - rank) + sides
    return tuple(v for side in sides for v in side)


@dataclasses.dataclass(frozen=True)
class Conv3dProblem:
    """One conv3d call as far as a config or a compile key may depend on it.

    ``in_vector``: elements per copy of the volume (4, 2 or 1): its address and row, plane and batch strides
    are multiples of it. ``out_vector``: elements per store (the output's width and address allow it).
    0 means what fresh contiguous tensors allow."""

    batch: int
    depth: int
    height: int
    width: int
    kd: int
    kh: int
    kw: int
    batched: bool = False  # the input had a batch dim (it shapes make_inputs; the kernel does not care)
    in_vector: int = 0
    out_vector: int = 0
    shared_limit: int = SM90_SHARED_BYTES  # dynamic shared memory a CTA may use on the target device
    pads: tuple = NO_PADS  # zeros before and after D, H and W (conv_pads)

    @property
    def padded_sides(self) -> tuple[int, int, int]:
        p = self.pads
        return (self.depth + p[0] + p[1], self.height + p[2] + p[3], self.width + p[4] + p[5])

    @property
    def out_depth(self) -> int:
        return self.padded_sides[0] - self.kd + 1

    @property
    def out_height(self) -> int:
        return self.padded_sides[1] - self.kh + 1

    @property
    def out_width(self) -> int:
        return self.padded_sides[2] - self.kw + 1

    @property
    def out_shape(self) -> tuple:
        spatial = (self.out_depth, self.out_height, self.out_width)
        return (self.batch, *spatial) if self.batched else spatial

    @property
    def taps(self) -> int:
        return self.kd * self.kh * self.kw

    @property
    def in_vec(self) -> int:
        # A copy lies wholly inside the row or wholly in its left padding: the padding is whole copies.
        return self.in_vector or _widest_vector(lambda v: self.width % v == 0, lambda v: self.pads[4] % v == 0)

    @property
    def out_vec(self) -> int:
        return self.out_vector or _widest_vector(lambda v: self.out_width % v == 0)


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """An unbatched (D, H, W) tensor as a batch of one; a batched one as it is."""
    return t if t.dim() == 4 else t.unsqueeze(0)


def make_problem(volume: torch.Tensor, kernel_shape, out: torch.Tensor, batched: bool, pads: tuple = NO_PADS) -> Conv3dProblem:
    """The problem for a 4-D ``volume`` view with unit stride along W and a contiguous 4-D ``out``."""
    n, d, h, w = volume.shape
    kd, kh, kw = kernel_shape
    in_align = checks.alignment_bytes(volume)
    # Batch, plane and row strides, where they are used to step (the W stride is 1 or unused), and the
    # left padding (a copy never straddles column 0).
    strides = [s for size, s in zip(volume.shape[:3], volume.stride()[:3]) if size > 1]
    in_vec = _widest_vector(lambda v: in_align >= 4 * v, lambda v: all(s % v == 0 for s in strides),
                            lambda v: pads[4] % v == 0)
    out_align = checks.alignment_bytes(out)
    out_w = w + pads[4] + pads[5] - kw + 1
    out_vec = _widest_vector(lambda v: out_align >= 4 * v, lambda v: out_w % v == 0)
    limit = shared_memory_limit(volume.device.index) if volume.is_cuda else SM90_SHARED_BYTES
    return Conv3dProblem(n, d, h, w, kd, kh, kw, batched, in_vec, out_vec, limit, pads)


def check_conv3d_args(volume, kernel, out, config, config_cls, padding="valid") -> tuple:
    """The public op's argument checks, in the order it makes them; returns (batched, batch, kernel sides,
    output shape, pads). ``config_cls``: the config class a ``config`` must be (config.py imports this
    module)."""
    checks.tensor("volume", volume)
    checks.tensor("kernel", kernel)
    if volume.dim() not in (3, 4):
        raise ValueError(f"volume: expected a (D, H, W) or (N, D, H, W) tensor, got {volume.dim()}-D with shape "
                         f"{tuple(volume.shape)}")
    if kernel.dim() != 3:
        raise ValueError(f"kernel: expected a (KD, KH, KW) tensor, got {kernel.dim()}-D with shape {tuple(kernel.shape)}")
    checks.dtype_in("volume", volume, (torch.float32,))
    checks.dtype_in("kernel", kernel, (torch.float32,))
    ksides = tuple(kernel.shape)
    if min(ksides) < 1:
        raise ValueError(f"kernel: expected sides of at least 1, got shape {ksides}")
    pads = conv_pads(padding, ksides, 3)
    vsides = tuple(volume.shape[-3:])
    if min(vsides) == 0:
        raise ValueError(f"volume: expected non-empty (D, H, W) sides, got shape {tuple(volume.shape)}")
    padded = tuple(v + pads[2 * i] + pads[2 * i + 1] for i, v in enumerate(vsides))
    if any(k > v for k, v in zip(ksides, padded)):
        what = "volume's (D, H, W)" if pads == NO_PADS else "padded volume's (D, H, W)"
        raise ValueError(f"kernel: shape {ksides} is larger than the {what} = {padded} along some side")
    if max(padded) > INT32_MAX - COORD_MARGIN:
        what = "sides" if pads == NO_PADS else "padded sides"
        raise ValueError(f"volume: {what} {padded} past 2^31 - 1 - {COORD_MARGIN} do not fit the kernel's "
                         f"32-bit coordinates (a tile of up to {COORD_MARGIN} past the last row or column is addressed)")
    batched = volume.dim() == 4
    batch = volume.shape[0] if batched else 1
    out_spatial = tuple(v - k + 1 for v, k in zip(padded, ksides))
    out_shape = (batch, *out_spatial) if batched else out_spatial
    if out is not None:
        checks.output("out", out, shape=out_shape, dtype=torch.float32, device=volume.device,
                      inputs={"volume": volume, "kernel": kernel})
    checks.config_type(config, config_cls)
    # Device checks after the structural ones, so that those are testable with CPU tensors.
    checks.cuda_tensor("volume", volume)
    checks.cuda_tensor("kernel", kernel)
    checks.same_device(volume=volume, kernel=kernel)
    return batched, batch, ksides, out_shape, pads
