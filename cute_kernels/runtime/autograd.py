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
"""

from __future__ import annotations

import torch


def check_writable(name: str, out) -> None:
    """``out`` may be written in place here (the inference-tensor rule; the grad rule is compile_aware's)."""
    if isinstance(out, torch.Tensor) and out.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{name}: an inference tensor cannot be written outside torch.inference_mode(); "
                         "pass a normal tensor, or call inside inference mode")


def mark_written(out) -> None:
    """Bump ``out``'s version counter after a kernel wrote it (inference tensors have none)."""
    if isinstance(out, torch.Tensor):  # increment_version skips inference tensors itself
        torch.autograd.graph.increment_version(out)
