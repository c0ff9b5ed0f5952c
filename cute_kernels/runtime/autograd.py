"""What torch's own ops do around a call that autograd must know about, done once for every op.

- An op without a backward (every op but the scan and the linear scan, whose custom ops hold one: ``torch_ops``) refuses a
  call that would need one (grad mode on and an input or ``out`` that requires grad) with an error that says so, rather than returning a result autograd silently
  treats as a constant. The eager path (``refuse_grad`` in ``torch_ops.compile_aware``) refuses before
  anything runs; the custom ops (``torch.ops.cute_kernels.*``, and so ``torch.compile``) refuse through
  their autograd registration, at the forward in eager mode and when the graph's backward is traced under
  torch.compile, with the same error.
- ``out=`` is checked as torch checks the target of an in-place write: an inference tensor outside
  inference mode is refused (torch: "Inplace update to inference tensor outside InferenceMode"); a leaf
  that requires grad is refused by the grad check above while grad mode is on, and may be written under
  ``torch.no_grad()`` (an optimizer's update), as torch allows.
- A kernel writes ``out`` through its pointer, which torch does not see: ``mark_written`` bumps its
  version counter afterwards, so autograd refuses a backward that saved the overwritten values.
"""

from __future__ import annotations

import torch


def any_requires_grad(values) -> bool:
    """Whether any of ``values`` is a tensor that requires grad: the cheap test every eager call makes."""
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


def tensors_requiring_grad(named: dict) -> list[str]:
    """The names of the tensors in ``named`` (name -> tensor or anything) that require grad."""
    return [name for name, t in named.items() if isinstance(t, torch.Tensor) and t.requires_grad]


def refuse_grad(op: str, named: dict) -> None:
    """Refuse a call of ``op`` that autograd would have to differentiate (see the module docstring)."""
    if torch.is_grad_enabled():
        names = tensors_requiring_grad(named)
        if names:
            raise_no_backward(op, names)


def raise_no_backward(op: str, names: list[str]) -> None:
    """The error of a call that needs the backward ``op`` does not have, naming the arguments (``names``)
    that require grad."""
    listed = ", ".join(names)
    raise ValueError(
        f"{listed}: requires grad, but {op} has no backward yet, so its result would carry no gradient; "
        f"call it under torch.no_grad() or pass {'detached tensors' if len(names) > 1 else listed + '.detach()'}"
    )


def check_writable(name: str, out) -> None:
    """``out`` may be written in place here (the inference-tensor rule; the grad rule is refuse_grad's)."""
    if isinstance(out, torch.Tensor) and out.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{name}: an inference tensor cannot be written outside torch.inference_mode(); "
                         "pass a normal tensor, or call inside inference mode")


def mark_written(out) -> None:
    """Bump ``out``'s version counter after a kernel wrote it (inference tensors have none)."""
    if isinstance(out, torch.Tensor):  # increment_version skips inference tensors itself
        torch.autograd.graph.increment_version(out)
