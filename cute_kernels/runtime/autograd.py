"""What torch's own ops do around a call that autograd must know about, done once for every op.

- Every op has a backward (its custom op's autograd registration, ``torch_ops``): an eager call that needs a
  gradient runs the custom op, which autograd records.
- ``out=`` is checked as torch checks the target of an in-place write: an inference tensor outside
  inference mode is refused (torch: "Inplace update to inference tensor outside InferenceMode"); a leaf
  that requires grad is refused while grad mode is on (``torch_ops.compile_aware``: torch's ops refuse
  out= in a differentiable call), and may be written under ``torch.no_grad()`` (an optimizer's update), as
  torch allows.
- A kernel writes ``out`` through its pointer, which torch does not see: ``mark_written`` bumps its
  version counter afterwards, so autograd refuses a backward that saved the overwritten values.
- No op has a forward-mode derivative, and torch.func's differentiating transforms cannot run the ops'
  autograd registrations: ``no_forward_ad`` refuses such calls, which would otherwise give a result without
  a tangent (or a zero one under ``torch.func.jvp``: a wrong derivative).
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _forward_ad


def check_writable(name: str, out) -> None:
    """``out`` may be written in place here (the inference-tensor rule; the grad rule is compile_aware's)."""
    if isinstance(out, torch.Tensor) and out.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{name}: an inference tensor cannot be written outside torch.inference_mode(); "
                         "pass a normal tensor, or call inside inference mode")


def mark_written(out) -> None:
    """Bump ``out``'s version counter after a kernel wrote it (inference tensors have none)."""
    if isinstance(out, torch.Tensor):  # increment_version skips inference tensors itself
        torch.autograd.graph.increment_version(out)


def no_forward_ad(op: str, values) -> None:
    """Refuse a call that forward-mode AD or a torch.func transform that differentiates sees: a tensor among
    ``values`` that carries a tangent (``torch.autograd.forward_ad``), or an active ``torch.func.jvp``
    (``jacfwd``, ``hessian``) or ``torch.func.grad`` (``vjp``, ``jacrev``). The custom ops have no jvp, so
    the tangent would be dropped, and torch.func cannot run their autograd registrations. ``vmap`` and
    ``functionalize`` pass. Called only off the plain eager path, which has checked that no transform and
    no forward-AD level is active."""
    if torch._C._are_functorch_transforms_active():
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        kinds = {interpreter.key() for interpreter in retrieve_all_functorch_interpreters()}
        if TransformType.Jvp in kinds:
            raise _forward_ad_error(op)
        if TransformType.Grad in kinds:
            raise NotImplementedError(f"{op}: torch.func.grad, vjp and jacrev are not supported (torch.func "
                                      "cannot run the op's autograd registration); use torch.autograd (backward() "
                                      "or torch.autograd.grad), which the op supports")
    if _forward_ad._current_level >= 0:
        for v in values:
            if isinstance(v, torch.Tensor) and _forward_ad.unpack_dual(v).tangent is not None:
                raise _forward_ad_error(op)


def _forward_ad_error(op: str) -> NotImplementedError:
    return NotImplementedError(f"{op}: forward-mode AD (jvp) is not supported; the op has no forward-mode "
                               "derivative, so its result would carry no tangent (a wrong derivative); use "
                               "reverse mode (backward() or torch.autograd.grad)")
