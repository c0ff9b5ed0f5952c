"""ck.scan's host path on CPU tensors with its registry entries replaced by a stub: the op's checks, problem,
variant choice and plans run; the kernel is whatever launch the test gives."""

from __future__ import annotations

import cute_kernels as ck


class StubScanEntry:
    """A scan entry that runs every problem with the default config; ``prepare`` returns
    ``launch_for(variant, problem)``, the launch the plan calls as ``launch(x, out, [starts])``."""

    config_cls = (ck.ScanConfig, ck.ColumnScanConfig)

    def __init__(self, variant, launch_for):
        self.variant, self.launch_for = variant, launch_for

    def default_config(self, problem):
        return ck.ScanConfig()

    def why_unsupported(self, config, problem):
        return None

    def choose_config(self, problem, index):
        return ck.ScanConfig()

    def prepare(self, config, problem, inputs, out):
        return self.launch_for(self.variant, problem)


def route_scan_to_stub(monkeypatch, launch_for) -> None:
    """ck.scan's entries become ``StubScanEntry``s (for the variant the op names), on CPU tensors, with a
    fresh set of plans."""
    from cute_kernels.ops.scan import op as scan_op
    from cute_kernels.runtime import checks
    from cute_kernels.runtime.plans import CallPlans

    monkeypatch.setattr(checks, "cuda_tensor", lambda name, t: t)
    monkeypatch.setattr(scan_op.registry, "for_call", lambda op, variant: StubScanEntry(variant, launch_for))
    monkeypatch.setattr(scan_op, "shared_memory_limit", lambda index: 227 * 1024)
    monkeypatch.setattr(scan_op, "on_device", lambda index, fn, *args: fn(*args))
    monkeypatch.setattr(scan_op, "_PLANS", CallPlans("scan_stub"))
