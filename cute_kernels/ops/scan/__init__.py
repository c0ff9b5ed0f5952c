"""scan: cumulative sums, products, maxima, minima and log-sum-exps along any dim, optionally restarting at
segment starts, and first-order linear recurrences. Importing this package registers the ``scan`` op's two
variants (``legacy_cuda/scan.cu`` through NVRTC): ``lookback`` (the last dim, segmented or not) and
``columns`` (a strided dim, read in place), and the ``linear_scan`` op's ``lookback`` and ``columns``.

- ``problem``: DTYPES, OPS, ScanProblem, the access width, the op's argument checks.
- ``config``: ScanConfig and ColumnScanConfig, their sweep spaces, defaults and tuned-table keys.
- ``entry``: what both registry entries share (source, inputs, bytes, oracle and baseline fields).
- ``lookback``: the workspace, the launch plans (the first wave's ramp), launch and the registry entry (SPEC).
- ``columns``: the strided scan's launch and registry entry (COLUMNS_SPEC).
- ``zoo``: the everyday and held-out shapes, each on the variant the op runs it on.
- ``reference``: the exact reference (segmented too), its error scale, and torch's answer (the baseline).
- ``op``: the public ``scan``.
- ``linear``: the registry op ``linear_scan`` (h_t = a_t h_{t-1} + x_t) on the look-back kernel;
  ``linear_columns``: along a strided dim, on the column kernels; ``linear_op``: its public op.
"""

from .config import ColumnScanConfig, ScanConfig
from .lookback import SPEC
from .columns import COLUMNS_SPEC
from . import zoo  # noqa: F401  (registers the zoo, after both entries)
from .linear import LinearScanProblem
from . import linear_columns  # noqa: F401  (registers linear_scan's columns variant)
from .linear_op import linear_scan
from .op import scan
from .problem import DTYPES, OPS, ScanProblem

__all__ = ["scan", "linear_scan", "LinearScanProblem", "ScanConfig", "ColumnScanConfig", "ScanProblem", "DTYPES", "OPS", "SPEC", "COLUMNS_SPEC"]
