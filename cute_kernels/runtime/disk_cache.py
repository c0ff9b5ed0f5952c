"""The on-disk cache of compiled kernels, shared between processes: one directory, one off switch.

Entries live in ``$CUTE_KERNELS_CACHE_DIR`` (default ``~/.cache/cute_kernels``), one subdirectory per
backend; ``CUTE_KERNELS_DISK_CACHE=0`` switches the cache off. An entry is a binary and a JSON record that
holds the binary's sha256: files are written through a rename (binary first), so a reader sees a whole
entry or none, and a torn or foreign binary is refused and rebuilt rather than loaded. A read-only or full
directory costs a rebuild, never a failure.

Processes that build the same key at once take turns: ``lock(key)`` is an exclusive ``fcntl.flock`` on
``locks/<subdir>/<key>.lock`` under the cache directory (beside the entries, not among them, so a directory of
entries holds binaries and records only), held around "look again, build, store", so the second process
waits and then reads the first one's entry instead of building it too. Where there is no ``fcntl``
(Windows), or the lock file cannot be made (a read-only cache), building goes on unlocked: the cost is a
duplicate build, never a torn entry, because every write is a rename. ``evict(key, data)`` removes an entry
whose binary passed the checksum but does not work (a cubin the driver refuses), so that it is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock; builds of one key may then run twice, each stored whole
    fcntl = None

_OFF = ("0", "false", "no", "off")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``path`` (created if absent) among this host's processes.
    Closing the file releases it, so a process that dies holding it frees it. Unlocked where locks are not
    to be had: Windows, a read-only directory (where nothing will be written either), a filesystem without
    flock."""
    fd = None
    if fcntl is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass
        yield
    finally:
        if fd is not None:
            os.close(fd)


def switched_off(variable: str) -> bool:
    """Whether the environment switches a feature off: ``variable`` set to 0, false, no or off (any case).
    Every on-by-default switch of the package reads it (``CUTE_KERNELS_DISK_CACHE``, ``CUTE_KERNELS_WARM_UP``)."""
    return os.environ.get(variable, "1").strip().lower() in _OFF


def cache_root() -> Path | None:
    """The cache directory, or None when the disk cache is switched off."""
    if switched_off("CUTE_KERNELS_DISK_CACHE"):
        return None
    root = os.environ.get("CUTE_KERNELS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cute_kernels"
    )
    return Path(root)


class DiskCache:
    """Binaries keyed by a hex digest, under ``cache_root() / subdir`` (``suffix``: the binaries' extension)."""

    def __init__(self, subdir: str, suffix: str) -> None:
        self.subdir = subdir
        self.suffix = suffix

    def directory(self) -> Path | None:
        root = cache_root()
        return None if root is None else root / self.subdir

    def _paths(self, root: Path, key: str) -> tuple[Path, Path]:
        return root / f"{key}.json", root / f"{key}{self.suffix}"

    def load(self, key: str) -> tuple[bytes, dict] | None:
        """(binary, record) of ``key``, or None when absent, switched off, torn or not this key's."""
        root = self.directory()
        if root is None:
            return None
        record_path, data_path = self._paths(root, key)
        try:
            record = json.loads(record_path.read_text())
            data = data_path.read_bytes()
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("key") != key:
            return None
        if hashlib.sha256(data).hexdigest() != record.get("sha256"):
            return None  # a torn or foreign file: rebuild rather than load garbage
        return data, record

    def store(self, key: str, data: bytes, record: dict) -> None:
        """Write ``data`` and ``record`` (plus the key and the data's sha256) for ``key``."""
        root = self.directory()
        if root is None:
            return
        record = dict(record, key=key, sha256=hashlib.sha256(data).hexdigest())
        try:
            root.mkdir(parents=True, exist_ok=True)
            # The binary before its record, each through a rename, so a reader never sees half an entry.
            for suffix, blob in ((self.suffix, data), (".json", json.dumps(record).encode())):
                fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{key}", suffix=suffix)
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(blob)
                    os.replace(tmp, root / f"{key}{suffix}")
                except OSError:
                    os.unlink(tmp)
                    raise
        except OSError:
            pass  # a read-only or full cache directory costs a rebuild next time, never a failure

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Hold the cross-process lock of ``key`` (see the module's docstring); unlocked where locks are not
        to be had."""
        root = cache_root()
        if root is None:
            yield
            return
        with file_lock(root / "locks" / self.subdir / f"{key}.lock"):
            yield

    def evict(self, key: str, data: bytes, *, locked: bool = False) -> bool:
        """Delete the entry of ``key`` if it still holds ``data`` (a binary that passed its checksum but did not
        work), record first, so that the next load misses and the key is rebuilt. An entry another process
        has replaced in the meantime is kept. True when an entry was deleted. ``locked``: the caller holds
        ``lock(key)`` already (a second flock of the file from this process would wait for itself)."""
        root = self.directory()
        if root is None:
            return False
        record_path, data_path = self._paths(root, key)
        with contextlib.nullcontext() if locked else self.lock(key):
            try:
                record = json.loads(record_path.read_text())
            except (OSError, ValueError):
                record = None
            if isinstance(record, dict) and record.get("sha256") not in (None, hashlib.sha256(data).hexdigest()):
                return False
            deleted = False
            for path in (record_path, data_path):
                try:
                    path.unlink()
                    deleted = True
                except FileNotFoundError:
                    pass
                except OSError:
                    return deleted  # a read-only cache: the entry stays, and loading it fails again, loudly
            return deleted
