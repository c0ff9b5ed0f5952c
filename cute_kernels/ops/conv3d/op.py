"""The public ``conv3d`` op: a call of a structure seen before runs its plan; a new one is checked, given
a variant, a config and a packed launch, and becomes a plan (``runtime.plans``)."""

from __future__ import annotations

import torch

from ... import registry
from ...runtime import checks
from ...runtime.autograd import check_writable, mark_written
from ...runtime.device import on_device
from ...runtime.plans import CallPlans
from .config import Conv3dConfig
from .tiled import TiledConvConfig
from .problem import MAX_KERNEL_SIDE, check_conv3d_args, as_4d, make_problem

_PLANS = CallPlans("conv3d")


class Conv3dPlan:
    """Every call of one structure: the result's shape and device, whether the volume (W not unit-stride)
    or the kernel (not contiguous) is copied first, and the variant's packed launch (None: an empty
    batch). Per call it checks which memory ``out`` overlaps and whether it may be written, allocates the
    result and launches."""

    __slots__ = ("out_shape", "device", "device_index", "copy_volume", "copy_kernel", "launch", "out_guard")

    def __init__(self, out_shape, device, copy_volume, copy_kernel, launch, name="volume"):
        self.out_shape, self.device, self.device_index = tuple(out_shape), device, device.index
        self.copy_volume, self.copy_kernel, self.launch = copy_volume, copy_kernel, launch
        self.out_guard = checks.PlanOverlaps((name, "kernel"))

    def __call__(self, volume, kernel, out):
        if out is None:
            result = torch.empty(*self.out_shape, dtype=torch.float32, device=self.device)
        else:
            self.out_guard.check(out, volume, kernel)
            check_writable("out", out)
            result = out
        if self.launch is None:
            return result
        volume_run = volume.contiguous() if self.copy_volume else volume
        kernel_run = kernel.contiguous() if self.copy_kernel else kernel
        on_device(self.device_index, self.launch, volume_run, kernel_run, result)
        if out is not None:
            mark_written(out)
        return result


# Past this many taps the unrolled kernel's code outgrows the instruction cache (probed: direct 2.6x slower
# than tiled at 13^3, 1.3x at 11^3, 2x faster at 9^3; docs/notes/conv3d.md).
MAX_UNROLLED_TAPS = 1024


def variant_for(config, ksides: tuple, out_height: int) -> str:
    """The variant a call without ``variant=`` runs: the config's own (``direct`` for a Conv3dConfig, whose
    checks then say why a kernel it cannot take is refused); without one, ``tiled`` for a side past the
    unrolled kernel's, more taps than ``MAX_UNROLLED_TAPS``, or one output row per plane (a signal: the
    direct kernel's tiles are at least 8 rows high, the tiled kernel's one); ``direct`` otherwise."""
    if isinstance(config, Conv3dConfig):
        return "direct"
    taps = ksides[0] * ksides[1] * ksides[2]
    if isinstance(config, TiledConvConfig) or max(ksides) > MAX_KERNEL_SIDE or taps > MAX_UNROLLED_TAPS:
        return "tiled"
    return "tiled" if out_height == 1 and config is None else "direct"


def prepare_conv3d(volume, kernel, out, config, variant, padding="valid", name="volume") -> Conv3dPlan:
    """The plan of a conv3d call, after every check of it (nothing allocated or written before they
    pass): the problem measured, the config chosen (or the given one checked), the kernel loaded and its
    launch packed for this volume's strides. ``name``: what the plan's errors call the volume (conv2d's
    image, conv1d's signal)."""
    checks.no_fake(volume=volume, kernel=kernel, out=out)  # before anything reads a pointer
    check_writable("out", out)  # as torch refuses an in-place write to an inference tensor: first
    batched, batch, ksides, out_shape, pads = check_conv3d_args(volume, kernel, out, config,
                                                                (Conv3dConfig, TiledConvConfig), padding)
    spec = registry.for_call("conv3d", variant if variant is not None else variant_for(config, ksides, out_shape[-2]))
    checks.config_type(config, spec.config_cls)
    copy_volume = volume.stride(-1) != 1 and volume.shape[-1] > 1
    copy_kernel = not kernel.is_contiguous()
    # An empty batch launches nothing, but its config and variant pass the checks a full one would.
    volume4 = as_4d(volume.contiguous() if copy_volume and batch else volume)
    result = out if out is not None else torch.empty(out_shape, dtype=torch.float32, device=volume.device)
    out4 = as_4d(result)
    problem = make_problem(volume4, ksides, out4, batched, pads)
    if config is not None:
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    else:
        try:
            config = spec.choose_config(problem, volume.device.index)
        except ValueError as e:  # no tile runs it (the default heuristic says why)
            raise ValueError(f"{name}: shape {tuple(volume.shape)} with a {ksides} kernel: {e}") from None
    if batch == 0:
        return Conv3dPlan(out_shape, volume.device, copy_volume, copy_kernel, None, name)
    launch = on_device(volume.device.index, spec.prepare, config, problem,
                       {"volume": volume4, "kernel": kernel.contiguous()}, out4)
    return Conv3dPlan(out_shape, volume.device, copy_volume, copy_kernel, launch, name)


def conv3d(volume: torch.Tensor, kernel: torch.Tensor, *, padding="valid", out: torch.Tensor | None = None,
           config: Conv3dConfig | None = None, variant: str | None = None) -> torch.Tensor:
    """3-D cross-correlation of ``volume`` (D, H, W) or (N, D, H, W) with ``kernel`` (KD, KH, KW), like
    ``torch.nn.functional.conv3d`` with one channel.

    float32 in and out, FP32 arithmetic. Any kernel sides, none longer than the padded volume's: up to 15
    each, a fully unrolled kernel compiled per shape (a 15^3 one takes ~30 s of NVRTC on first use); past
    that, a kernel that walks the weights in blocks through shared memory (the ``tiled`` variant).
    ``padding``: ``"valid"`` (none), ``"same"`` (the output has the volume's shape; an even side's extra zero
    goes after, as torch pads), an int for every side, a tuple (pd, ph, pw) (or of one int for all), or a
    tuple of (before, after) pairs per dim; the zeros are never stored (the kernel reads them as zero-filled
    copies). The volume may be any strided view; one whose last dim is
    not unit-stride is copied to a contiguous tensor first. ``out``: a contiguous float32 tensor of the
    result's shape, not overlapping the inputs. Errors name the argument; nothing is written on an error.
    """
    return run_conv3d(volume, kernel, padding, out, config, variant)


def run_conv3d(volume, kernel, padding, out, config, variant, name="volume") -> torch.Tensor:
    """conv3d, its repeated calls' errors calling the volume ``name`` (conv2d and conv1d pass their views
    through here)."""
    # padding by repr: the plans key ints by type alone, and padding=True must not find padding=1's plan.
    plan = _PLANS.plan((volume, kernel, out, config, variant, repr(padding), name), prepare_conv3d, volume, kernel,
                       out, config, variant, padding, name)
    return plan(volume, kernel, out)
