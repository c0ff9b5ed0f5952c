"""A report that survives being cut: each unit of ``bench`` (a standard or zoo row, a backward problem, a
first-call case, the dispatch table) is written to a JSON-lines file the moment it is measured, and a later
run with the same file measures only what is missing, then writes the whole report.

A lent GPU machine stops a command at 10 minutes and a cold zoo report takes longer, so the report runs as
several commands, each resuming the last one's file (``scripts/gpu_check.sh``, ``GPU_CHECK_CHECKPOINT``).
Every row's own figures come from one loop in one process (ours and the baseline interleaved), so rows
measured in different runs stay comparable as ratios; the file refuses a run whose GPU, commit, reps or
selection differ from the runs that started it, so rows from two machines never mix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

import torch


class CheckpointMismatch(RuntimeError):
    """The checkpoint was started by a run that measured something else (GPU, commit, reps, selection)."""


class Checkpoint:
    """Units measured so far, by (section, key); ``path`` None keeps nothing (every unit is measured)."""

    def __init__(self, path: str | None, identity: dict):
        self.path = path
        self.units: dict[tuple[str, str], Any] = {}
        self.runs = 1
        # What this run measured: (section, seconds) per unit, the last unit's seconds (None when it came
        # from the file). The report's time by section says which part to cut when it outgrows a call.
        self.measured: list[tuple[str, float]] = []
        self.last_seconds: float | None = None
        if path is None:
            return
        if os.path.exists(path):
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
            started = next((line["identity"] for line in lines if "identity" in line), None)
            if started is not None and started != identity:
                differing = sorted(k for k in set(started) | set(identity) if started.get(k) != identity.get(k))
                what = ", ".join(f"{k}: {started.get(k)!r} there, {identity.get(k)!r} here" for k in differing)
                raise CheckpointMismatch(f"checkpoint {path} was started by another run ({what}); delete it or "
                                         "name another file")
            self.runs = 1 + sum(1 for line in lines if "identity" in line)
            for line in lines:
                if "section" in line:
                    self.units[(line["section"], line["key"])] = line["value"]
        self._append({"identity": identity})

    def _append(self, line: dict) -> None:
        # One line per unit, flushed and synced: a command killed mid-report keeps every unit it finished.
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def remember(self, section: str, key: str, measure: Callable[[], Any], codec: "Codec | None" = None) -> Any:
        """The unit's value from an earlier run, else ``measure()``'s, written down before it is returned."""
        codec = codec or PLAIN
        if (section, key) in self.units:
            self.last_seconds = None
            return codec.decode(self.units[(section, key)])
        start = time.perf_counter()
        value = measure()
        self.last_seconds = time.perf_counter() - start
        self.measured.append((section, self.last_seconds))
        if self.path is not None:
            encoded = codec.encode(value)
            self.units[(section, key)] = encoded
            self._append({"section": section, "key": key, "value": encoded, "seconds": round(self.last_seconds, 2)})
        return value

    def time_by_section(self) -> str:
        """``section: N units in S s`` for each section this run measured, in the order first measured."""
        totals: dict[str, list] = {}
        for section, seconds in self.measured:
            total = totals.setdefault(section, [0, 0.0])
            total[0] += 1
            total[1] += seconds
        return "; ".join(f"{section}: {n} in {seconds:.0f} s" for section, (n, seconds) in totals.items())

    def holds(self, section: str, key: str) -> bool:
        """Whether an earlier run measured the unit (``remember`` then returns its value unmeasured)."""
        return (section, key) in self.units

    @property
    def resumed(self) -> bool:
        return self.runs > 1


@dataclasses.dataclass(frozen=True)
class Codec:
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


PLAIN = Codec(lambda value: value, lambda value: value)


def dataclass_codec(cls, tuples: tuple[str, ...] = (), dtypes: tuple[str, ...] = ()) -> Codec:
    """A dataclass row as a JSON object: ``tuples`` name fields JSON turns into lists (made tuples again),
    ``dtypes`` fields holding a torch dtype (kept by name). NaN times round-trip (Python's json writes NaN)."""

    def encode(row):
        fields = dataclasses.asdict(row)
        for name in dtypes:
            fields[name] = str(fields[name]).removeprefix("torch.")
        return fields

    def decode(fields):
        fields = dict(fields)
        for name in tuples:
            fields[name] = tuple(fields[name])
        for name in dtypes:
            fields[name] = getattr(torch, fields[name])
        return cls(**fields)

    return Codec(encode, decode)
