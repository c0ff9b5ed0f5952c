"""Call plans: a repeated op call runs from what its first call of the same structure worked out.

An op call's structure is what its checks, its problem, its config choice and its compile or kernel lookup
read: each tensor's dtype, device, shape, strides, pointer alignment (mod 32) and negative bit, the types
of its scalars, its flags, config and variant. (Gradients are not the ops' business: the public functions
refuse a call that needs one before the op sees it, and the custom ops through their autograd
registration; see ``runtime.autograd``.) The
first call of a structure runs every check in order and builds a *plan*: an object with the op's own
signature that holds the chosen kernel (the compiled CuTe function, or an NVRTC launch with its arguments
packed), the result's allocation and the views the kernel takes. A later call of that structure is one key
build and one dict lookup, then the plan, which checks only what depends on the values (the scalars, which
memory ``out`` overlaps, whether ``out`` may be written) and launches.

Plans hold kernels and configs, so whatever replaces those (a tuned table written, a compile or kernel
cache cleared) clears every op's plans (:func:`clear_all`). Nothing here launches or checks: the ops do.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["CallPlans", "clear_all"]

from .checks import PLAIN_TENSOR_TYPES

_TENSOR, _PARAMETER = PLAIN_TENSOR_TYPES
_ALL: "weakref.WeakSet[CallPlans]" = weakref.WeakSet()
_dispatch_stack_len = torch._C._len_torch_dispatch_stack


class CallPlans:
    """One op's plans by call structure (bounded: a new structure past ``max_entries`` clears them)."""

    def __init__(self, op: str, max_entries: int = 4096):
        self.op = op
        self._plans: dict = {}
        self._max_entries = max_entries
        _ALL.add(self)

    @staticmethod
    def key(*values):
        """The structure of a call's argument values (the op passes them in its signature's order), or None
        when something in it has no structure a plan can stand for: a tensor subclass (a FakeTensor among
        them), a tensor of another layout than torch.strided (sparse, mkldnn, nested: reading its strides
        or data pointer raises) or an unhashable value; such calls take the full path, whose checks name
        what is wrong.

        Tensors: dtype, device, shape, strides, data pointer mod 32 (the widest access any kernel assumes:
        the scan's 8-byte outputs of a 16-byte input vector) and negative bit (refused by the full checks,
        so a negated view must not find a plain view's plan). Python ints and floats: their type only
        (plans check the values). None: itself. bools and strings: type and value (``True == 1`` must not
        match). Anything else (a config): type and itself. The parts go into one flat tuple, unambiguously:
        each value's first part names its kind (a dtype, the type float or int, None, another type), and
        the kind fixes how many parts follow.
        """
        parts = []
        try:
            for v in values:
                t = type(v)
                if t is _TENSOR or t is _PARAMETER:
                    parts += (v.dtype, v.device, v.shape, v.stride(), v.data_ptr() & 31, v.is_neg())
                elif t is float or t is int:
                    parts.append(t)
                elif v is None:
                    parts.append(None)
                elif isinstance(v, torch.Tensor):
                    return None
                else:  # bool, str, a config, ...
                    parts += (t, v)
        except RuntimeError:
            # A torch.Tensor without strides or storage (sparse, mkldnn, nested): no plan; the full checks
            # refuse its layout by name. Caught rather than tested: a layout test on every tensor of every
            # call costs more than a try that never fires.
            return None
        return tuple(parts)

    def plan(self, key_values: tuple, prepare, *args):
        """The plan of a call: the one its structure (``key_values``, see :meth:`key`) has, else
        ``prepare(*args)`` (every check, in order), kept for the next call of that structure. Under a
        dispatch mode nothing is looked up or kept: the full path decides (it refuses a fake mode)."""
        if _dispatch_stack_len():
            return prepare(*args)
        key = self.key(*key_values)
        plan = self.get(key)
        if plan is None:
            plan = prepare(*args)
            self.remember(key, plan)
        return plan

    def keyed(self, key: tuple, prepare, *args):
        """:meth:`plan` with the key already built: an op's own key of its commonest call, written out where
        the generic loop of :meth:`key` costs a tiny call's host path measurably (about 0.8 us of a GEMM's
        eight arguments). Such a key starts with a marker of its own (no generic key starts with one), holds
        every part :meth:`key` would for its call, so it stands for the same structure, and is hashable."""
        if _dispatch_stack_len():
            return prepare(*args)
        plan = self._plans.get(key)
        if plan is None:
            plan = prepare(*args)
            self.remember(key, plan)
        return plan

    def get(self, key):
        if key is None:
            return None
        try:
            return self._plans.get(key)
        except TypeError:  # an unhashable argument: no plan, the full path
            return None

    def remember(self, key, plan) -> None:
        if key is None:
            return
        try:
            if len(self._plans) >= self._max_entries and key not in self._plans:
                self._plans.clear()
            self._plans[key] = plan
        except TypeError:
            pass

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


def clear_all() -> None:
    """Drop every op's plans (their kernels or configs were replaced)."""
    for plans in _ALL:
        plans.clear()
