"""Regenerate the README's results table from docs/benchmarks.md (never typed by hand).

    python scripts/readme_results.py [docs/benchmarks.md] [README.md]

Takes the report's main table, keeps op, variant, the problem's sizes, our time, the baseline's, the
speed-up, the throughput and the share of the H200 ceiling, and writes it between the README's
``<!-- results:begin -->`` and ``<!-- results:end -->`` markers with the report's date and commit.
"""

from __future__ import annotations

import argparse
import re
import sys

from cute_kernels.tools.bench import CEILINGS
from cute_kernels.tools.report import short_problem

def report_rows(text: str) -> tuple[dict, list[dict]]:
    meta = dict(re.findall(r"^- (date|commit|GPU): (.*)$", text, flags=re.M))
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) != len(header):
            break  # the next table (dispatch cost) starts
        rows.append(dict(zip(header, cells)))
    return meta, rows


def results_table(meta: dict, rows: list[dict]) -> str:
    gpu = meta.get('GPU', 'GPU').split(';')[0]
    # bench.CEILINGS are the H200's; an H100 SXM shares its compute peaks but not its DRAM bandwidth.
    ceilings = ""
    if "H200" not in gpu:
        ceilings = (f"; the ceilings are the H200's ({CEILINGS['bandwidth_GBps']:.0f} GB/s measured copy, "
                    f"{CEILINGS['fp16_TFLOPs']:.0f} TFLOP/s dense fp16)")
        if "H100" in gpu:
            ceilings += (", whose compute peaks the H100 SXM shares but whose DRAM peak is 4.8 TB/s against its "
                         "3.35, so its bandwidth shares read low")
    out = [f"Measured on the {gpu} on {meta.get('date', '?')}, commit "
           f"{meta.get('commit', '?')} ([`docs/benchmarks.md`](docs/benchmarks.md) has every column{ceilings}):", "",
           "| op | variant | problem | ours (us) | baseline (us) | speed-up | throughput | % of H200 ceiling |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.get("verified") != "yes":
            continue
        problem = short_problem(r["problem"])
        out.append(f"| {r['op']} | {r['variant']} | {problem} | {r['ours (us)']} | {r['baseline (us)']} "
                   f"({r['baseline']}) | {r['speed-up']} | {r['throughput']} | {r['% of ceiling']} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", default="docs/benchmarks.md", help="the report (bench --write)")
    parser.add_argument("readme", nargs="?", default="README.md", help="the README whose results section it fills")
    args = parser.parse_args(argv[1:])
    report, readme = args.report, args.readme
    with open(report) as f:
        meta, rows = report_rows(f.read())
    with open(readme) as f:
        text = f.read()
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"{readme} has no {begin} ... {end} section")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(readme, "w") as f:
        f.write(f"{head}{begin}\n{results_table(meta, rows)}\n{end}{tail}")
    print(f"wrote {len(rows)} rows into {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
