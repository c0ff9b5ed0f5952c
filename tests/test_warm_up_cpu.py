"""runtime.warm_up (CPU): the backends' imports wait for torch's CUDA initialisation, then run once in a
background thread; the switch turns them off."""

import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, **env) -> subprocess.CompletedProcess:
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True,
                          text=True, timeout=120)


def test_nothing_is_imported_before_cuda_is_initialised_then_one_thread_imports_the_backends():
    # No CUDA initialisation in this process (none on a CPU machine; on a GPU one nothing here touches it):
    # importing the package must not import TVM-FFI, whose import asks torch.cuda.is_available(). Then
    # torch.cuda's own hook as torch's _lazy_init runs it: every queued call, after the initialisation.
    done = _run("""
        import importlib.util, sys, threading, torch
        import cute_kernels
        assert not torch.cuda.is_initialized()
        assert "tvm_ffi" not in sys.modules, "imported before CUDA initialisation"
        assert not [t for t in threading.enumerate() if t.name == "cute_kernels-warm-up"]
        from torch.cuda import _queued_calls
        from cute_kernels.runtime import warm_up
        queued = [call for call, _ in _queued_calls if call is warm_up._start]
        assert len(queued) == 1
        queued[0]()
        queued[0]()  # a second start does nothing
        threads = [t for t in threading.enumerate() if t.name == "cute_kernels-warm-up"]
        assert len(threads) == 1 and not threads[0].daemon, threads
        threads[0].join(60)
        for name in warm_up.MODULES:
            if importlib.util.find_spec(name.partition(".")[0]) is not None:
                assert name in sys.modules, name
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_cuda_already_initialised_starts_it_at_once(monkeypatch):
    # torch's own _lazy_call, in a process that used the GPU before importing us: the call runs at once.
    import torch

    from cute_kernels.runtime import warm_up

    started = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(warm_up, "_start", lambda: started.append(1))
    monkeypatch.delenv("CUTE_KERNELS_WARM_UP", raising=False)
    warm_up.schedule()
    assert started == [1]


def test_the_switch_turns_it_off(monkeypatch):
    import torch

    from cute_kernels.runtime import warm_up

    scheduled = []
    monkeypatch.setattr(torch.cuda, "_lazy_call", lambda call, **kwargs: scheduled.append(call))
    monkeypatch.setenv("CUTE_KERNELS_WARM_UP", "Off")  # the disk cache's switch words (disk_cache.switched_off)
    assert not warm_up.enabled()
    monkeypatch.setenv("CUTE_KERNELS_WARM_UP", "0")
    assert not warm_up.enabled()
    warm_up.schedule()
    assert scheduled == []
    monkeypatch.setenv("CUTE_KERNELS_WARM_UP", "1")
    warm_up.schedule()
    assert scheduled == [warm_up._start]


def test_a_failing_import_is_dropped(monkeypatch):
    from cute_kernels.runtime import warm_up

    monkeypatch.setattr(warm_up, "MODULES", ("json", "cute_kernels_no_such_module.sub", "tvm_ffi.no_such_submodule"))
    warm_up._import_all()  # raises nothing: the call that needs a module reports its failure


def test_a_thread_that_cannot_start_does_not_fail_cuda_initialisation(monkeypatch):
    # torch's _lazy_init turns an exception of a queued call into a failed CUDA initialisation.
    from cute_kernels.runtime import warm_up

    class NoThreads:
        def __init__(self, *args, **kwargs):
            pass

        def start(self):
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(warm_up, "threading", types.SimpleNamespace(Thread=NoThreads))
    monkeypatch.setattr(warm_up, "_started", threading.Event())
    warm_up._start()
    assert warm_up._started.is_set()
