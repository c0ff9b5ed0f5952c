"""Tuned defaults: the winning config per (op, variant, GPU arch, shape bucket), in small versioned JSON files
(``<op>-<variant>.json``) read by the ops. The package ships tables (``cute_kernels/tuned/``); a sweep's
``--write-tuned`` writes the user's own (``user_dir()``: ``$CUTE_KERNELS_TUNED_DIR``, else
``~/.cache/cute_kernels/tuned``), never into the installed package, and a user entry overrides the shipped
one of its arch and bucket. (To update the shipped tables, point ``CUTE_KERNELS_TUNED_DIR`` at
``cute_kernels/tuned`` of a checkout.)

``choose(spec, problem, device)`` returns the tuned config for the problem's bucket on that device's arch
when there is one and ``supports()`` accepts it for this very problem; otherwise the spec's heuristic. A
bucket is what ``spec.shape_bucket(problem)`` says (e.g. dtype and the log2 of each size): shapes in a bucket
no sweep has seen fall back to the heuristic.

A table file that is not what this version writes (not JSON, another format, an entry without its arch,
bucket or config, a field of the wrong JSON type, a config its class refuses, two entries for one bucket)
is reported once, as a ``TunedTableWarning`` naming the file, the entry and what is wrong, and that file is
ignored (the op's variant runs the other table's configs or its heuristic): a tuned table only makes an op
faster, so a bad one must not stop it, nor half-apply. Fields are never converted: ``"staged": "yes"`` or ``"threads": 256.7`` is a malformed
entry, not False or 256.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import typing
import warnings
from pathlib import Path

from .runtime import device, plans
from .runtime.disk_cache import file_lock
from .runtime.bounded import remember

FORMAT = 1
TUNED_DIR = Path(__file__).resolve().parent / "tuned"

_tables: dict[tuple[str, str], dict] = {}  # (op, variant) -> {(arch, bucket): config}; one per registry entry
# (op, variant, problem, device) -> (config, supported): what choose() decided, so that an op called again
# on the same problem (problems are frozen dataclasses) skips the table, the heuristic and supports().
# The conv3d heuristic alone costs ~240 us of Python per call. Keyed by shapes, so bounded (remember);
# cleared when a table changes.
_choices: dict[tuple, tuple] = {}
_lock = threading.Lock()


class TunedTableWarning(UserWarning):
    """A tuned-defaults file is malformed: the op runs its heuristic configs instead."""


class TunedTableError(ValueError):
    """What is wrong with a tuned-defaults file (the message names the file)."""


def user_dir() -> Path:
    """Where sweeps record winners, read on top of the shipped tables."""
    configured = os.environ.get("CUTE_KERNELS_TUNED_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "cute_kernels" / "tuned"


def path_for(spec) -> Path:
    """The shipped table of ``spec``."""
    return TUNED_DIR / f"{spec.op}-{spec.variant}.json"


def user_path_for(spec) -> Path:
    """The user's table of ``spec`` (what ``record`` writes by default)."""
    return user_dir() / f"{spec.op}-{spec.variant}.json"


def table_arch(device_index: int) -> str:
    """The chip a table entry is for: ``sm_XY`` without the ``a`` suffix (a table is keyed by the chip, not by
    the compile target); "none" in a process with no GPU, where no table applies."""
    import torch

    return device.arch(device_index) if torch.cuda.is_available() else "none"


_JSON_KINDS = {bool: "a bool (JSON true or false)", int: "an int (a JSON integer: no fraction, no exponent)",
               float: "a finite float (a JSON number)", str: "a str (a JSON string)"}


def _shown(value) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)  # a caller's Python value, not one decoded from JSON


def _from_json(kind, value):
    """``value`` as the field type ``kind`` holds it, or a TypeError saying what was expected. Nothing is
    converted: a bool field takes true or false, an int field an integer (not a bool, not 256.0, not "256"),
    a float field a finite number (not a bool), a str field a string; a tuple field takes a JSON array (the
    one form JSON has) whose items are each taken the same way."""
    if kind is bool and type(value) is bool or kind is int and type(value) is int or kind is str and type(value) is str:
        return value
    if kind is float and type(value) in (int, float) and math.isfinite(value):
        return value
    if kind is tuple or typing.get_origin(kind) is tuple:
        args = typing.get_args(kind)
        if type(value) is list:
            if not args or len(args) == 2 and args[1] is Ellipsis:
                return tuple(value if not args else (_from_json(args[0], v) for v in value))
            if len(value) == len(args):
                return tuple(_from_json(a, v) for a, v in zip(args, value))
        raise TypeError(f"expected a JSON array for {kind!r}, got {_shown(value)}")
    if kind in _JSON_KINDS:
        raise TypeError(f"expected {_JSON_KINDS[kind]}, got {_shown(value)}")
    raise TypeError(f"a field of type {kind!r}, which tuned tables cannot hold")


def config_from_fields(config_cls, fields: dict):
    """A config dataclass from the JSON fields of a tuned entry, taken as they are (``_from_json``): a
    converting reader would turn ``"yes"`` into a bool or ``256.7`` into 256 and tune with a config no sweep
    measured. Fields left out take their defaults; the dataclass's own validation runs. TypeError names a
    field of the wrong type, ValueError an unknown field or a value the dataclass refuses."""
    if type(fields) is not dict:
        raise TypeError(f"{config_cls.__name__}: expected a JSON object of fields, got {_shown(fields)}")
    names = [f.name for f in dataclasses.fields(config_cls)]
    unknown = set(fields) - set(names)
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field(s) {sorted(unknown)}")
    hints = typing.get_type_hints(config_cls)
    values = {}
    for name in names:
        if name in fields:
            try:
                values[name] = _from_json(hints.get(name), fields[name])
            except TypeError as e:
                raise TypeError(f"{config_cls.__name__}.{name}: {e}") from None
    return config_cls(**values)


def _no_duplicate_keys(pairs):
    # json.loads keeps the last of two equal keys; in a tuned entry that hides which value was meant.
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"the key(s) {repeated} appear twice in one object")
    return dict(pairs)


def read_file(path: Path) -> dict:
    """The parsed contents of a tuned file, checked as far as its structure: a TunedTableError naming the
    file when it is not a JSON object of this format with a list of entries."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TunedTableError(f"{path}: not a readable JSON file ({type(e).__name__}: {e})") from None
    if type(data) is not dict:
        raise TunedTableError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT or type(data.get("format")) is not int:
        raise TunedTableError(f"{path}: format {data.get('format')!r}, this version reads {FORMAT}")
    if type(data.get("entries", [])) is not list:
        raise TunedTableError(f"{path}: expected \"entries\" to be a list, got {data['entries']!r}")
    return data


def _parse_table(spec, path: Path) -> dict:
    data = read_file(path)
    for field, want in (("op", spec.op), ("variant", spec.variant)):
        if field in data and data[field] != want:
            raise TunedTableError(f"{path}: {field} {data[field]!r}, not {want!r}: another entry's table")
    table: dict = {}
    for i, entry in enumerate(data.get("entries", [])):
        where = f"{path}: entry {i}"
        if type(entry) is not dict:
            raise TunedTableError(f"{where}: expected a JSON object, got {json.dumps(entry)}")
        for field, kind, name in (("arch", str, "string"), ("bucket", str, "string"), ("config", dict, "object")):
            if type(entry.get(field)) is not kind:
                raise TunedTableError(f"{where}: expected {field!r} to be a JSON {name}, got "
                                      f"{json.dumps(entry.get(field))}")
        where += f" ({entry['arch']}, {entry['bucket']})"
        key = (entry["arch"], entry["bucket"])
        if key in table:
            raise TunedTableError(f"{where}: a second entry for that arch and bucket")
        try:
            table[key] = config_from_fields(spec.config_cls, entry["config"])
        except (TypeError, ValueError) as e:
            raise TunedTableError(f"{where}: {e}") from None
    return table


def _load(spec) -> dict:
    """The table of ``spec``: the shipped file's entries, overridden by the user's ({} when neither exists),
    read once. A malformed file is reported once (TunedTableWarning) and read as {}."""
    key = (spec.op, spec.variant)
    table = _tables.get(key)
    if table is not None:
        return table
    with _lock:
        table = _tables.get(key)
        if table is not None:
            return table
        table = {}
        paths = [path_for(spec), user_path_for(spec)]
        for path in dict.fromkeys(paths):  # the user's directory may be the shipped one
            if path.exists():
                try:
                    table.update(_parse_table(spec, path))
                except TunedTableError as e:
                    warnings.warn(f"{e}; {spec.op}/{spec.variant} ignores this file (its other table's configs "
                                  "or its heuristic apply)", TunedTableWarning, stacklevel=2)
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
    return remember(_choices, key, (config, spec.supports(config, problem)))


def record(spec, problem, config, arch: str, *, speedup: float, source: str, path: Path | None = None) -> Path:
    """Write ``config`` as the winner for the problem's bucket on ``arch`` (replacing an older entry) into
    ``path`` (default: the user's table)."""
    if spec.shape_bucket is None:
        raise ValueError(f"{spec.op}/{spec.variant} defines no shape_bucket: nothing to key tuned configs by")
    reason = spec.why_unsupported(config, problem)
    if reason is not None:
        raise ValueError(f"refusing to record {config} for {problem}: {reason}")
    path = path or user_path_for(spec)
    bucket = spec.shape_bucket(problem)
    # Other threads and processes (concurrent sweeps' --write-tuned) take turns on the file, so none writes
    # over an entry another recorded between its read and its write.
    with _lock, file_lock(path.with_name(path.name + ".lock")):
        # A malformed file is refused (TunedTableError), not overwritten: its other entries are someone's sweep.
        if path.exists():
            _parse_table(spec, path)
            data = read_file(path)
        else:
            data = {"format": FORMAT, "op": spec.op, "variant": spec.variant}
        data.setdefault("entries", [])
        entries = [e for e in data["entries"] if not (e["arch"] == arch and e["bucket"] == bucket)]
        entries.append({"arch": arch, "bucket": bucket, "config": dataclasses.asdict(config),
                        "speedup": round(float(speedup), 3), "source": source})
        data["entries"] = sorted(entries, key=lambda e: (e["arch"], e["bucket"]))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
        _tables.pop((spec.op, spec.variant), None)
        _choices.clear()
        plans.clear_all()  # they hold the configs chosen before
    return path
