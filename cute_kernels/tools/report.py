"""The benchmark report's tables and pictures: Markdown, CSV, the speed-up chart, and the dispatch-cost table
(what a call costs the host on a problem too small for the GPU time to matter)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import torch

from .. import registry
from .bench import Row, interleaved_times, interleaved_walls, wall_us_per_call


def markdown_table(rows: list[Row]) -> str:
    head = ("| op | variant | problem | config | ours (us) | baseline | baseline (us) | speed-up | throughput | "
            "% of ceiling | wall/call ours (us) | wall/call baseline (us) | verified |")
    lines = [head, "|" + " --- |" * 13]
    for r in rows:
        if not r.verified:
            lines.append(f"| {r.op} | {r.variant} | {r.problem} | {r.config} | - | {r.baseline_name} | - | - | - | - "
                         f"| - | - | FAILED: {r.error} |")
            continue
        lines.append(
            f"| {r.op} | {r.variant} | {r.problem} | {r.config} | {r.ours_us:.1f} | {r.baseline_name} | "
            f"{r.baseline_us:.1f} | {r.speedup:.2f}x | {r.throughput} | {100 * r.ceiling_fraction:.0f}% | "
            f"{r.wall_us:.1f} | {r.baseline_wall_us:.1f} | yes |"
        )
    others = [(r, name, us) for r in rows if r.verified for name, us in r.others_us.items()]
    if others:
        lines += ["", "Other libraries, timed in the same loop on the same inputs:", "",
                  "| op | variant | problem | library | time (us) | ours vs it |", "| --- | --- | --- | --- | --- | --- |"]
        for r, name, us in others:
            shown = "not run (refused the problem, or answered it with non-finite values)" if us != us else f"{us:.1f}"
            ratio = "-" if us != us else f"{us / r.ours_us:.2f}x"
            lines.append(f"| {r.op} | {r.variant} | {short_problem(r.problem)} | {name} | {shown} | {ratio} |")
    return "\n".join(lines)


CSV_FIELDS = ("op", "variant", "problem", "config", "ours_us", "baseline_name", "baseline_us", "speedup",
              "gbps", "tflops", "ceiling_pct", "wall_us", "baseline_wall_us", "verified", "error")


def write_csv(rows: list[Row], path: str) -> None:
    """The report's rows as a CSV (one per measured problem), for plotting and diffing between runs."""
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in rows:
            writer.writerow({
                "op": r.op, "variant": r.variant, "problem": r.problem, "config": r.config,
                "ours_us": f"{r.ours_us:.2f}", "baseline_name": r.baseline_name, "baseline_us": f"{r.baseline_us:.2f}",
                "speedup": f"{r.speedup:.3f}" if r.verified else "", "gbps": f"{r.gbps:.1f}",
                "tflops": f"{r.tflops:.2f}", "ceiling_pct": f"{100 * r.ceiling_fraction:.1f}" if r.verified else "",
                "wall_us": f"{r.wall_us:.2f}", "baseline_wall_us": f"{r.baseline_wall_us:.2f}",
                "verified": "yes" if r.verified else "NO", "error": r.error,
            })


def speedup_chart(rows: list[Row], path: str, title: str = "") -> str:
    """A horizontal bar per verified row: speed-up over the vendor baseline (1.0 marked), grouped by op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.verified]
    labels = [f"{r.op}/{r.variant}  {short_problem(r.problem)}" for r in shown]
    values = [r.speedup for r in shown]
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(shown) + 1.2))
    colors = ["#2a9d8f" if v >= 1.0 else "#e76f51" for v in values]
    ax.barh(range(len(shown)), values, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(shown)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("speed-up over the vendor baseline, same run (log scale)")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}x", va="center", fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def short_problem(problem: str) -> str:
    """A problem's description without the fields that only matter to compile keys."""
    hidden = ("shared_limit=", "vector=", "in_vector=", "out_vector=", "a_align=", "b_align=", "c_align=", "sm=",
              "batched=", "beta_zero=True", "exclusive=False")
    return " ".join(part for part in problem.split() if not part.startswith(hidden))


def tiny_calls():
    """(op, problem, ours eager, same op through torch.ops, torch's equivalent), on freshly made inputs."""
    import torch.nn.functional as F

    import cute_kernels as ck

    def randn(*shape, dtype=torch.float32):
        return torch.randn(shape, device="cuda", dtype=dtype)

    ops = torch.ops.cute_kernels
    a, b = randn(64, 64), randn(64, 64)
    h1, h2 = randn(64, 64, dtype=torch.float16), randn(64, 64, dtype=torch.float16)
    q, k, v = (randn(1, 1, 64, 64, dtype=torch.float16) for _ in range(3))
    vol, ker = randn(16, 16, 16), randn(3, 3, 3)
    x = randn(1024)
    # torch has no linear recurrence: its side is the registry's baseline, the chunked doubling in torch ops.
    recurrence = registry.get("linear_scan")
    small = dataclasses.replace(recurrence.standard_problems()[0], rows=8, length=128)
    steps_in = recurrence.make_inputs(small, "cuda")
    decay, steps = steps_in["a"], steps_in["x"]
    return [
        ("sgemm", "64^3 fp32", lambda: ck.sgemm(a, b), lambda: ops.sgemm(a, b, None, 1.0, 0.0), lambda: a @ b),
        ("hgemm", "64^3 fp16", lambda: ck.hgemm(h1, h2), lambda: ops.hgemm(h1, h2, None, 1.0, 0.0), lambda: h1 @ h2),
        ("attention", "1x1x64x64 fp16", lambda: ck.attention(q, k, v), lambda: ops.attention(q, k, v, None, False),
         lambda: F.scaled_dot_product_attention(q, k, v)),
        ("conv3d", "16^3, 3^3", lambda: ck.conv3d(vol, ker), lambda: ops.conv3d(vol, ker),
         lambda: F.conv3d(vol[None, None], ker[None, None])),
        ("scan", "1024 fp32", lambda: ck.scan(x), lambda: ops.scan(x, False), lambda: torch.cumsum(x, -1)),
        ("linear_scan", "8x128 fp32", lambda: ck.linear_scan(decay, steps), lambda: ops.linear_scan(decay, steps),
         lambda: recurrence.baseline(small, steps_in)),
    ]


def _graph_replay_us(fn, calls: int = 200) -> float:
    """Host time per replay of a CUDA graph holding one call of ``fn`` (warmed up first)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return wall_us_per_call(graph.replay, calls=calls)


def dispatch_table() -> str:
    """Host microseconds per call on tiny problems: our op eager, through its torch.ops custom op, replayed
    from a CUDA graph, and torch's own equivalent eager; GPU time of our kernel beside them."""
    lines = ["| op | problem | GPU time (us) | eager wall/call (us) | torch.ops wall/call (us) | graph replay (us) "
             "| torch eager (us) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for op, problem, eager, custom, torch_fn in tiny_calls():
        gpu = statistics.median(interleaved_times({"ours": lambda rep: eager()}, reps=50)["ours"])
        # Each wall the median of three runs taken in turn, as the report's wall/call columns: one run of
        # 200 calls on a shared host catches a hiccup now and then, which would move one op's ratio alone.
        ours, through_ops, theirs = interleaved_walls((eager, custom, torch_fn), calls=200)
        lines.append(f"| {op} | {problem} | {gpu:.1f} | {ours:.1f} | {through_ops:.1f} "
                     f"| {_graph_replay_us(eager):.1f} | {theirs:.1f} |")
    return "\n".join(lines)


def host_sections(remember=None) -> str:
    """The report's host figures as Markdown: the dispatch table and the first call in a new process, each
    under its heading and the paragraph saying how it is measured. ``remember(section, key, measure)``: a
    table or row an earlier run measured, else ``measure()``'s (the report's checkpoint)."""
    from . import first_call

    keep = remember or (lambda section, key, measure: measure())
    return ("## Dispatch cost\n\nHost time per call on problems too small for the GPU to matter (back-to-back "
            "calls, one synchronisation at the end; each figure the median of three runs, ours, through torch.ops "
            "and torch's in turn): what Python, argument checks and the launch cost.\n\n"
            + keep("dispatch", "table", dispatch_table)
            + "\n\n## First call in a new process\n\nEach op's first call in a fresh Python process (inputs made "
            "and the CUDA context up before the clock starts; stopped after a synchronisation), with an empty disk "
            "cache (cold) and with the cache the cold run filled (warm), beside torch's first call of its "
            "equivalent in a fresh process; the second call of the same process is the steady state.\n\n"
            + first_call.markdown(first_call.measure(remember=lambda key, measure: keep("first call", key, measure))))


def _dtype_of(problem: str) -> str:
    """The dtype a row's problem names (GEMM problems say ``dtype=float16``; conv3d is float32 only)."""
    for part in problem.split():
        if part.startswith("dtype="):
            return part[len("dtype="):]
    return "float32"


def _geomean(values: list[float]) -> float:
    import math

    return math.exp(sum(math.log(v) for v in values) / len(values))


def zoo_summary(rows: list[Row], label: str = "zoo") -> list[str]:
    """Per (op, dtype) of the shape-zoo rows: the geomean and worst ratio against the vendor baseline, in
    GPU time and in eager wall per call, as lines of the form
    ``zoo geomean hgemm/float16: 1.07x (worst 0.93x over 14 shapes); wall/call 1.02x (worst 0.88x)``.
    A row that failed its check counts as a failure of its group, named on its line. ``label``: the lines'
    first word ("held-out" for the held-out shapes)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.op, _dtype_of(r.problem)), []).append(r)
    lines = []
    for (op, dtype), group in sorted(groups.items()):
        verified = [r for r in group if r.verified]
        good = [r for r in verified if r.like_for_like]
        failed = len(group) - len(verified)
        tail = f"; {failed} of {len(group)} FAILED their check" if failed else ""
        if len(verified) > len(good):
            tail += (f"; {len(verified) - len(good)} shape(s) left out, their baseline doing more than the "
                     "problem needs (named in the table)")
        if not good:
            lines.append(f"{label} geomean {op}/{dtype}: no verified like-for-like shape{tail}")
            continue
        gpu = [r.speedup for r in good]
        wall = [r.baseline_wall_us / r.wall_us for r in good]
        lines.append(f"{label} geomean {op}/{dtype}: {_geomean(gpu):.2f}x (worst {min(gpu):.2f}x over {len(good)} shapes); "
                     f"wall/call {_geomean(wall):.2f}x (worst {min(wall):.2f}x){tail}")
        lines += _other_library_lines(label, op, dtype, good)
    return lines


def _other_library_lines(label: str, op: str, dtype: str, rows: list[Row]) -> list[str]:
    """The same summary against each other library the rows were timed beside (attention's cuDNN backend),
    in GPU time, over the shapes it ran; the shapes it refused or answered with non-finite values are
    counted on the line."""
    names = sorted({name for r in rows for name in r.others_us})
    lines = []
    for name in names:
        ratios = [r.others_us[name] / r.ours_us for r in rows  # NaN: the library refused or answered wrong
                  if name in r.others_us and not math.isnan(r.others_us[name])]
        skipped = sum(1 for r in rows if name in r.others_us) - len(ratios)
        tail = f"; {skipped} shape(s) it did not run" if skipped else ""
        if ratios:
            lines.append(f"{label} geomean {op}/{dtype} against {name}: {_geomean(ratios):.2f}x (worst "
                         f"{min(ratios):.2f}x over {len(ratios)} shapes){tail}")
        else:
            lines.append(f"{label} geomean {op}/{dtype} against {name}: it ran none of the {skipped} shape(s)")
    return lines


def zoo_chart(rows: list[Row], path: str, title: str = "") -> str:
    """Speed-up against problem size (work: flops, or bytes for bandwidth-bound ops), one panel per op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.verified]
    ops = sorted({r.op for r in shown})
    fig, axes = plt.subplots(1, max(len(ops), 1), figsize=(3.2 * max(len(ops), 1), 3.2), squeeze=False)
    for ax, op in zip(axes[0], ops):
        mine = [r for r in shown if r.op == op]
        work = [(r.gbps * 1e9 if r.bound == "bandwidth" else r.tflops * 1e12) * r.ours_us * 1e-6 for r in mine]
        ax.scatter(work, [r.speedup for r in mine], s=14, c=["#2a9d8f" if r.speedup >= 1 else "#e76f51" for r in mine])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("bytes" if mine[0].bound == "bandwidth" else "flops", fontsize=8)
    axes[0][0].set_ylabel("speed-up over the vendor baseline", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
