"""Per-tile timeline of one scan launch: when each tile was claimed, published its aggregate, knew its prefix
and had issued its stores, from %globaltimer (32 ns steps on the H200) and clock64, with the SM it ran on.

A text copy of legacy_cuda/scan.cu gets four stamp stores (thread 0, or lane 0 of the look-back warp) and is
compiled for the device with the trace buffer's address baked in; the package's kernels are not touched.
The warp-0 schedules (inline, early) are instrumented; the dedicated look-back warp is not.

The traced kernel is launched as ``ops.scan.lookback.launch`` launches the plain one: the same grid, block,
dynamic shared memory and arguments (scan.cu's parameter list, ``lookback.KERNEL_SIGNATURE``; the dry run checks
it against scan.cu), the first wave from the traced kernel's own occupancy (its stamps may cost registers)
and the ramp step ``lookback.ramp_step_ns`` gives, on a freshly zeroed workspace of
``lookback.workspace_bytes`` (epoch 1, as the first launch on a new workspace). The result is judged by the
registry's oracle (``spec.verify``). Prints the phases' percentiles, how the look-back's wait splits (a
predecessor's aggregate still missing, or the hops to a prefix once all are out), and claims per time
bucket, the view that shows whether the waves move in step (docs/notes/scan.md).

    PYTHONPATH=. python scripts/probes/scan_trace.py --log2 24 [--config 512x32:regs:early:3200] [--out DIR]
    PYTHONPATH=. python scripts/probes/scan_trace.py --dry-run   # no GPU: NVRTC-compile the instrumented kernels
"""

from __future__ import annotations

import argparse
import ctypes
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cute_kernels import registry  # noqa: E402
from cute_kernels.ops.scan import ScanConfig, ScanProblem  # noqa: E402
from cute_kernels.ops.scan import lookback  # noqa: E402
from cute_kernels.runtime.device import arch, current_stream_handle  # noqa: E402
from cute_kernels.runtime import nvrtc  # noqa: E402

STAMPS = ("claim", "aggregate", "prefix", "stored")
# The schedules whose warp 0 looks back (scan_tile_warp0_looks_back), and their kernels in scan.cu.
INSTRUMENTED = {"inline": "scan_kernel", "early": "scan_kernel_early_aggregate"}
WORDS = 10  # per tile: 4 globaltimer stamps, 4 clock64 stamps, the SM, one spare
SIGNATURE = lookback.KERNEL_SIGNATURE  # the op's own argument types, checked against scan.cu by --dry-run

# (anchor in scan.cu, what follows it): each anchor must occur once in scan_tile_warp0_looks_back.
_HOOKS = (
    ("  const long long tile = s_tile;\n",
     "  if (threadIdx.x == 0) { CK_STAMP(tile, 0); CK_TRACE(tile)[8] = ck_trace_smid(); }\n"),
    ("publish(tile, early_aggregate.head ? kStatusP : kStatusA, early_aggregate.value);\n",
     "      CK_STAMP(tile, 1);\n"),
    ("    if (!kEarlyAggregate && lane == 0) states.publish(tile, aggregate_is_prefix ? kStatusP : kStatusA, "
     "tile_aggregate.value);\n",
     "    if (!kEarlyAggregate && lane == 0) CK_STAMP(tile, 1);\n"),
    ("    if (lane == 0) s_tile_prefix = prefix;\n",
     "    if (lane == 0) CK_STAMP(tile, 2);\n"),
    ("  T::store(y, n, first, full, stage, row_pos, row_len, warp_prefix, vector_prefix, s_tile_prefix);\n}",
     None),  # replaced below: the stamp goes before the closing brace
)


def instrumented_source(trace_address: int) -> str:
    """scan.cu with its headers inlined and the stamps added; raises if scan.cu no longer has an anchor."""
    texts = nvrtc.read_source_tree(lookback.SOURCE)
    text = texts[lookback.SOURCE]
    for header, header_text in texts.items():
        text = text.replace(f'#include "{header}"', header_text)
    helpers = f"""
#define CK_TRACE(tile) (reinterpret_cast<unsigned long long*>({trace_address:#x}ULL) + (tile) * {WORDS})
__device__ __forceinline__ unsigned long long ck_trace_now() {{
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }}
__device__ __forceinline__ unsigned ck_trace_smid() {{
  unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }}
#define CK_STAMP(tile, k) (CK_TRACE(tile)[(k)] = ck_trace_now(), CK_TRACE(tile)[4 + (k)] = clock64())
"""
    text = text.replace("namespace scan {", helpers + "namespace scan {", 1)
    # The body of scan_tile_warp0_looks_back alone (it ends at the first column-0 brace): the dedicated
    # kernel after it repeats some anchors, and a stamp must not land there unnoticed.
    start = text.index("__device__ __forceinline__ void scan_tile_warp0_looks_back(")
    end = text.index("\n}\n", start) + 3
    head, body, tail = text[:start], text[start:end], text[end:]
    for anchor, after in _HOOKS:
        if body.count(anchor) != 1:
            raise RuntimeError(f"scan_trace: scan_tile_warp0_looks_back holds {anchor.strip()!r} "
                               f"{body.count(anchor)} times, not once; update _HOOKS")
        if after is None:
            body = body.replace(anchor, anchor[:-1] + "  if (threadIdx.x == 0) CK_STAMP(tile, 3);\n}", 1)
        else:
            body = body.replace(anchor, anchor + after, 1)
    return head + body + tail


def kernel_signature(kernel: str) -> tuple:
    """The ctypes of ``kernel``'s parameters in scan.cu: pointers, ``long long`` and ``unsigned``."""
    text = nvrtc.read_source_tree(lookback.SOURCE)[lookback.SOURCE]
    params = re.search(rf"\n{kernel}\(([^)]*)\)", text)
    if params is None:
        raise RuntimeError(f"scan_trace: no kernel {kernel} in {lookback.SOURCE}")
    types = []
    for param in params.group(1).split(","):
        declaration = " ".join(param.split()[:-1]) if "*" not in param else "*"
        types.append({"*": ctypes.c_void_p, "long long": ctypes.c_int64, "unsigned": ctypes.c_uint32}.get(
            declaration, declaration))
    return tuple(types)


def check_signature() -> None:
    """SIGNATURE must match every instrumented kernel's parameters, or the traced launch passes garbage."""
    for kernel in INSTRUMENTED.values():
        found = kernel_signature(kernel)
        if found != SIGNATURE:
            raise RuntimeError(f"scan_trace: {kernel} in {lookback.SOURCE} takes {found}, not SIGNATURE "
                               f"{SIGNATURE}; update SIGNATURE and launch_traced")


def parse_config(text: str) -> ScanConfig:
    """'512x32:regs:early:3200' -> ScanConfig(512, 32, staged=False, lookback='early', ramp_ns=3200)."""
    shape, where, schedule, *ramp = text.split(":")
    threads, items = (int(v) for v in shape.split("x"))
    if where not in ("regs", "smem"):
        raise ValueError(f"--config: the stage is 'regs' or 'smem', got {where!r}")
    if schedule not in INSTRUMENTED:
        raise ValueError(f"--config: scan_trace instruments the {tuple(INSTRUMENTED)} schedules, not {schedule!r}")
    return ScanConfig(threads, items, where == "smem", schedule, int(ramp[0]) if ramp else 0)


def launch_traced(kernel: nvrtc.LoadedKernel, config: ScanConfig, problem: ScanProblem, x: torch.Tensor,
                  out: torch.Tensor) -> torch.Tensor:
    """One launch of the traced ``kernel`` as lookback.launch makes one, on torch's current stream; returns
    the workspace, which must stay referenced until the launch has run."""
    device = x.device.index
    tiles = -(-problem.numel // config.tile)
    shared_bytes = config.shared_bytes(problem.dtype)
    first_wave = lookback.first_wave_ctas(kernel, config, shared_bytes, device)
    # Zeroed: every tile state reads as not yet published, whatever the epoch.
    nbytes = lookback.workspace_bytes(tiles, problem.dtype)[0]
    workspace = torch.zeros(-(-nbytes // 8), dtype=torch.int64, device=device)
    ws = workspace.data_ptr()
    args = (x.data_ptr(), out.data_ptr(), problem.numel, problem.length, ws, ws + lookback.WORKSPACE_HEADER_BYTES,
            1, first_wave, lookback.ramp_step_ns(config, tiles, first_wave))
    nvrtc.launch(kernel, (tiles, 1, 1), (config.block_threads, 1, 1), args, SIGNATURE, shared_mem=shared_bytes,
                 stream_handle=current_stream_handle(device))
    return workspace


def trace(problem: ScanProblem, config: ScanConfig, device: int, runs: int = 5):
    """Runs the instrumented kernel ``runs`` times; the last run's stamps, (tiles, WORDS)."""
    if config.lookback not in INSTRUMENTED:
        raise ValueError(f"scan_trace instruments the {tuple(INSTRUMENTED)} schedules, not {config.lookback!r}")
    spec = registry.get("scan", "lookback")
    reason = spec.why_unsupported(config, problem)
    if reason is not None:
        raise ValueError(f"{config} does not support {problem}: {reason}")
    check_signature()
    x = torch.randn(problem.numel, device=device)
    out = torch.empty_like(x)
    tiles = -(-problem.numel // config.tile)
    stamps = torch.zeros(tiles * WORDS, dtype=torch.int64, device=device)
    expression = lookback.name_expression(config, problem)
    cubin = nvrtc.compile_text("scan_trace.cu", instrumented_source(stamps.data_ptr()), [expression], arch(device))
    traced = nvrtc.get_kernel(cubin, expression, device)
    for _ in range(runs):
        workspace = launch_traced(traced, config, problem, x, out)
        torch.cuda.synchronize(device)
        del workspace
    verdict = spec.verify(problem, {"x": x}, out)
    if not verdict:
        raise RuntimeError(f"the instrumented kernel gave a wrong scan: {verdict.detail}")
    stamps = stamps.view(tiles, WORDS).cpu().numpy()
    if not stamps[:, :4].all():
        raise RuntimeError("some tiles left no stamps: the launch did not run the instrumented kernel")
    return stamps


def summary(t: np.ndarray, buckets: int = 10) -> str:
    """Markdown: phase percentiles, the look-back's wait split, claims and residency per time bucket."""
    us = (t[:, :4] - t[:, 0].min()) / 1000.0
    claim, aggregate, prefix, stored = us.T
    all_out = np.maximum.accumulate(aggregate)  # when every aggregate up to this tile had been published

    def pct(a):
        return " / ".join(f"{np.percentile(a, p):.2f}" for p in (10, 50, 90, 99))

    lines = [f"{len(t)} tiles on {len(np.unique(t[:, 8]))} SMs, {stored.max():.1f} us from the first claim to "
             "the last store issued", "",
             "| phase (us) | p10 / p50 / p90 / p99 |", "| --- | --- |",
             f"| claim -> aggregate published | {pct(aggregate - claim)} |",
             f"| aggregate -> prefix known | {pct(prefix - aggregate)} |",
             f"| of which: a predecessor's aggregate still missing | {pct(all_out - aggregate)} |",
             f"| of which: all out, hops to a prefix | {pct(prefix - all_out)} |",
             f"| prefix -> stores issued | {pct(stored - prefix)} |", "",
             "| time (us) | tiles claimed | CTAs resident (mid-bucket) |", "| --- | --- | --- |"]
    span = stored.max()
    for b in range(buckets):
        lo, hi = span * b / buckets, span * (b + 1) / buckets
        mid = (lo + hi) / 2
        claimed = int(((claim >= lo) & (claim < hi)).sum())
        lines.append(f"| {lo:.1f}-{hi:.1f} | {claimed} | {int(((claim <= mid) & (stored >= mid)).sum())} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2", type=int, default=24, help="float32 elements, as a power of two")
    parser.add_argument("--config", help="threads x items : regs|smem : inline|early [: ramp ns]; default: the "
                        "op's choice")
    parser.add_argument("--out", help="also save the stamps as trace-<log2>.npy here")
    parser.add_argument("--dry-run", action="store_true", help="compile the instrumented kernels for sm_90a")
    args = parser.parse_args(argv)
    problem = ScanProblem(1, 1 << args.log2, torch.float32)
    spec = registry.get("scan", "lookback")
    if args.dry_run:
        check_signature()
        configs = [parse_config(args.config)] if args.config else [
            ScanConfig(t, i, staged, schedule) for t, i, staged in ((512, 32, False), (384, 48, True))
            for schedule in INSTRUMENTED]
        for config in configs:
            expression = lookback.name_expression(config, problem)
            nvrtc.compile_text("scan_trace.cu", instrumented_source(0x7F0000000000), [expression], "sm_90a")
            print(f"compiled {expression}")
        return 0
    device = torch.cuda.current_device()
    config = parse_config(args.config) if args.config else spec.choose_config(problem, device)
    stamps = trace(problem, config, device)
    print(f"## float32 2^{args.log2}, {config}\n\n{summary(stamps)}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        np.save(Path(args.out) / f"trace-{args.log2}.npy", stamps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
