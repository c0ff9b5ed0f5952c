"""The backends' imports, run in a background thread once torch has initialised CUDA, so that a process's
first kernel call does not wait for them.

A process's first call of an op whose kernel is in the disk cache is mostly imports: TVM-FFI for the CuTe
kernels (the kept shared libraries load through it), cuda-python's driver bindings for the NVRTC ones
(docs/notes/host-path.md, "Where the warm first call goes"). Torch initialises CUDA at the process's first
CUDA call (a tensor made on the GPU, a model moved there) and creates the device's context in the calls that
follow, releasing the GIL while the driver works; the imports run beside that. A kernel call that comes
sooner waits for the import it needs, which it would have run itself; Python work of the main thread in
that window shares the GIL with the imports.

Nothing here runs before torch's CUDA initialisation (``torch.cuda._lazy_call``): TVM-FFI's import asks
``torch.cuda.is_available()``, which would initialise CUDA at ``import cute_kernels`` and pin the devices
before a script sets ``CUDA_VISIBLE_DEVICES``. The imports have no other effect, and their failures are the
first call's to report: here they are dropped. ``CUTE_KERNELS_WARM_UP=0`` (or false, no, off) switches it off.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading

from .disk_cache import switched_off

__all__ = ["MODULES", "schedule", "enabled"]

# What the first calls import: TVM-FFI (``cute_disk``'s loads), the driver bindings (``nvrtc.get_kernel``).
MODULES = ("tvm_ffi", "cuda.bindings.driver")

_started = threading.Event()


def enabled() -> bool:
    return not switched_off("CUTE_KERNELS_WARM_UP")


def _import_all() -> None:
    for name in MODULES:
        try:
            if importlib.util.find_spec(name.partition(".")[0]) is not None:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the call that needs the module imports it again and reports
            pass


def _start() -> None:
    """Torch's CUDA initialisation calls this (or ``schedule`` does, where CUDA is up already): one thread
    per process. Not a daemon, so that an interpreter that exits mid-import waits for it rather than
    finalising under it."""
    if _started.is_set():
        return
    _started.set()
    try:
        threading.Thread(target=_import_all, name="cute_kernels-warm-up").start()
    except Exception:  # noqa: BLE001 - torch would fail its CUDA initialisation on a queued call's exception
        pass


def schedule() -> None:
    """Run the imports in a background thread once torch initialises CUDA (at once if it has); nothing
    where the switch is off or torch has no CUDA initialisation hook."""
    if not enabled():
        return
    try:
        from torch.cuda import _lazy_call
    except ImportError:
        return
    _lazy_call(_start)
