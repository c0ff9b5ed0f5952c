"""Pictures of a sweep CSV (see ``sweep.py``): for each problem, a heatmap of the speed-up over the vendor
baseline on the entry's two sweep axes (e.g. tile shape x pipeline depth), each cell the best over the other
knobs; and for each entry, its best time against the baseline's across problem sizes."""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import textwrap
from collections import defaultdict

from .. import registry
from .report import short_problem


def parse_fields(text: str) -> dict[str, str]:
    """``"tile_m=128 tile_n=64 ..."`` (as ``bench.describe`` writes configs and problems) -> dict."""
    return dict(tok.split("=", 1) for tok in text.split() if "=" in tok)


def heatmap_axes(spec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The heatmap's (row fields, column fields): the entry's ``sweep_axes``, where one axis (a config of one
    knob, such as the Hopper 3xTF32 GEMM's pipeline depth) makes a single column; else the config's first two
    fields."""
    if spec.sweep_axes:
        rows, *columns = spec.sweep_axes
        return tuple(rows), tuple(columns[0]) if columns else ()
    names = [f.name for f in dataclasses.fields(spec.config_cls)]
    return (names[0],), (names[1],) if len(names) > 1 else ()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:120]


def _axis_label(fields: dict[str, str], names: tuple[str, ...]) -> str:
    return "x".join(fields.get(n, "?") for n in names)


def _sort_key(label: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", label)]


def plot(csv_path: str, out_dir: str) -> list[str]:
    """Write the PNGs for every verified and timed row of ``csv_path``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["verified"] == "yes"]
    os.makedirs(out_dir, exist_ok=True)
    written = []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["op"], r["variant"], r["problem"])].append(r)
    for (op, variant, problem), group in sorted(groups.items()):
        spec = registry.get(op, variant)
        row_names, col_names = heatmap_axes(spec)
        cells: dict[tuple[str, str], float] = {}
        for r in group:
            fields = parse_fields(r["config"])
            key = (_axis_label(fields, row_names), _axis_label(fields, col_names))
            cells[key] = max(cells.get(key, 0.0), float(r["speedup"]))
        ys = sorted({k[0] for k in cells}, key=_sort_key)
        xs = sorted({k[1] for k in cells}, key=_sort_key)
        grid = [[cells.get((y, x), float("nan")) for x in xs] for y in ys]
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(xs), 1.2 + 0.45 * len(ys)))
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(xs)), xs, rotation=45, ha="right")
        ax.set_yticks(range(len(ys)), ys)
        ax.set_xlabel(" x ".join(col_names))
        ax.set_ylabel(" x ".join(row_names))
        for i, line in enumerate(grid):
            for j, value in enumerate(line):
                if value == value:  # not NaN
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="white", fontsize=7)
        fig.colorbar(image, ax=ax, label=f"speed-up over {spec.baseline_name or 'baseline'}")
        # Wrapped to the figure's width: a narrow heatmap otherwise cuts the problem off at both ends.
        title = f"{op}/{variant}: {short_problem(problem)}"
        ax.set_title("\n".join(textwrap.wrap(title, width=int(12 + 10 * len(xs)))), fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"heatmap_{_slug(op + '_' + variant + '_' + problem)}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    by_entry: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for (op, variant, problem), group in groups.items():
        best = min(group, key=lambda r: float(r["ours_us"]))
        by_entry[(op, variant)][problem] = best
    for (op, variant), best in sorted(by_entry.items()):
        spec = registry.get(op, variant)
        problems = sorted(best, key=lambda p: float(best[p]["baseline_us"]))
        ours = [float(best[p]["ours_us"]) for p in problems]
        theirs = [float(best[p]["baseline_us"]) for p in problems]
        fig, ax = plt.subplots(figsize=(2 + 1.1 * len(problems), 4))
        xs = range(len(problems))
        ax.plot(xs, theirs, "o-", label=spec.baseline_name or "baseline")
        ax.plot(xs, ours, "s-", label=f"{op}/{variant} (best config)")
        ax.set_yscale("log")
        ax.set_ylabel("GPU time per call (us)")
        ax.set_xticks(list(xs), [p.replace(" ", "\n", 3) for p in problems], fontsize=6)
        ax.legend()
        ax.set_title(f"{op}/{variant}: best config against {spec.baseline_name or 'the baseline'}", fontsize=9)
        fig.tight_layout()
        path = os.path.join(out_dir, f"sizes_{_slug(op + '_' + variant)}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
