"""Tuned defaults: the winning config per (op, variant, GPU arch, shape bucket), written by sweeps into small
versioned JSON files inside the package (``cute_kernels/tuned/<op>-<variant>.json``) and read by the ops.

``choose(spec, problem, device)`` returns the tuned config for the problem's bucket on that device's arch
when there is one and ``supports()`` accepts it for this very problem; otherwise the spec's heuristic. A
bucket is what ``spec.shape_bucket(problem)`` says (e.g. dtype and the log2 of each size): shapes in a bucket
no sweep has seen fall back to the heuristic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import typing
from pathlib import Path

from .runtime import device

FORMAT = 1
TUNED_DIR = Path(__file__).resolve().parent / "tuned"

_tables: dict[tuple[str, str], dict] = {}  # (op, variant) -> {(arch, bucket): config}
# (op, variant, problem, device) -> (config, supported): what choose() decided, so that an op called again
# on the same problem (problems are frozen dataclasses) skips the table, the heuristic and supports().
# The conv3d heuristic alone costs ~240 us of Python per call. Cleared when a table changes.
_choices: dict[tuple, tuple] = {}
_MAX_CHOICES = 4096
_lock = threading.Lock()


def path_for(spec) -> Path:
    return TUNED_DIR / f"{spec.op}-{spec.variant}.json"


def table_arch(device_index: int) -> str:
    """The chip a table entry is for: ``sm_XY`` without the ``a`` suffix (a table is keyed by the chip, not by
    the compile target); "none" in a process with no GPU, where no table applies."""
    import torch

    return device.arch(device_index) if torch.cuda.is_available() else "none"


def config_from_fields(config_cls, fields: dict):
    """A config dataclass from JSON fields, each converted to its declared type (so "True" or 1 are read
    as the bool or int the dataclass declares); the dataclass's own validation runs."""
    hints = typing.get_type_hints(config_cls)
    values = {}
    for f in dataclasses.fields(config_cls):
        if f.name not in fields:
            continue
        raw, kind = fields[f.name], hints.get(f.name, str)
        if kind is bool:
            values[f.name] = raw if isinstance(raw, bool) else str(raw).lower() in ("true", "1")
        elif kind in (int, float, str):
            values[f.name] = kind(raw)
        else:
            values[f.name] = raw
    unknown = set(fields) - {f.name for f in dataclasses.fields(config_cls)}
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field(s) {sorted(unknown)}")
    return config_cls(**values)


def _load(spec) -> dict:
    key = (spec.op, spec.variant)
    table = _tables.get(key)
    if table is not None:
        return table
    table = {}
    path = path_for(spec)
    if path.is_file():
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: format {data.get('format')!r}, this version reads {FORMAT}")
        for entry in data.get("entries", []):
            # A malformed entry is an error in a file we ship: say so at load rather than mis-tune silently.
            table[(entry["arch"], entry["bucket"])] = config_from_fields(spec.config_cls, entry["config"])
    _tables[key] = table
    return table


def lookup(spec, problem, arch: str):
    """The tuned config for the problem's bucket on ``arch``, or None."""
    if spec.shape_bucket is None:
        return None
    return _load(spec).get((arch, spec.shape_bucket(problem)))


def choose(spec, problem, device_index: int):
    """What an op runs when the caller names no config: tuned when valid for this problem, else heuristic."""
    return choose_supported(spec, problem, device_index)[0]


def choose_supported(spec, problem, device_index: int) -> tuple:
    """(choose()'s config, whether ``spec`` supports it for ``problem``): on every op call's path, so it is
    one dict lookup after the first call on a problem."""
    key = (spec.op, spec.variant, problem, device_index)
    hit = _choices.get(key)
    if hit is not None:
        return hit
    config = None
    if spec.shape_bucket is not None and _load(spec):
        config = lookup(spec, problem, table_arch(device_index))
        if config is not None and not spec.supports(config, problem):
            config = None
    if config is None:
        config = spec.default_config(problem)
    hit = (config, spec.supports(config, problem))
    if len(_choices) >= _MAX_CHOICES:
        _choices.clear()
    _choices[key] = hit
    return hit


def record(spec, problem, config, arch: str, *, speedup: float, source: str, path: Path | None = None) -> Path:
    """Write ``config`` as the winner for the problem's bucket on ``arch`` (replacing an older entry)."""
    if spec.shape_bucket is None:
        raise ValueError(f"{spec.op}/{spec.variant} defines no shape_bucket: nothing to key tuned configs by")
    reason = spec.why_unsupported(config, problem)
    if reason is not None:
        raise ValueError(f"refusing to record {config} for {problem}: {reason}")
    path = path or path_for(spec)
    bucket = spec.shape_bucket(problem)
    with _lock:
        data = json.loads(path.read_text()) if path.is_file() else {"format": FORMAT, "op": spec.op,
                                                                      "variant": spec.variant, "entries": []}
        entries = [e for e in data["entries"] if not (e["arch"] == arch and e["bucket"] == bucket)]
        entries.append({"arch": arch, "bucket": bucket, "config": dataclasses.asdict(config),
                        "speedup": round(float(speedup), 3), "source": source})
        data["entries"] = sorted(entries, key=lambda e: (e["arch"], e["bucket"]))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
        _tables.pop((spec.op, spec.variant), None)
        _choices.clear()
    return path
