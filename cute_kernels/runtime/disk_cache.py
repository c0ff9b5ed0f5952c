"""The on-disk cache of compiled kernels, shared between processes: one directory, one off switch.

Entries live in ``$CUTE_KERNELS_CACHE_DIR`` (default ``~/.cache/cute_kernels``), one subdirectory per
backend; ``CUTE_KERNELS_DISK_CACHE=0`` switches the cache off. An entry is a binary and a JSON record that
holds the binary's sha256: files are written through a rename (binary first), so a reader sees a whole
entry or none, and a torn or foreign binary is refused and rebuilt rather than loaded. A read-only or full
directory costs a rebuild, never a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

_OFF = ("0", "false", "no", "off")


def cache_root() -> Path | None:
    """The cache directory, or None when the disk cache is switched off."""
    if os.environ.get("CUTE_KERNELS_DISK_CACHE", "1").strip().lower() in _OFF:
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

    def load(self, key: str) -> tuple[bytes, dict] | None:
        """(binary, record) of ``key``, or None when absent, switched off, torn or not this key's."""
        root = self.directory()
        if root is None:
            return None
        try:
            record = json.loads((root / f"{key}.json").read_text())
            data = (root / f"{key}{self.suffix}").read_bytes()
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
