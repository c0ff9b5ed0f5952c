"""scan: prefix sums along the last dim. Importing this package registers its one variant, ``lookback``
(``legacy_cuda/scan.cu`` through NVRTC).

- ``problem``: DTYPES, ScanProblem, the access width, ``why_unsupported``, the op's argument checks.
- ``config``: ScanConfig, the sweep space, the default heuristic and the tuned-table key.
- ``lookback``: the workspace, the launch plans (the first wave's ramp), launch and the registry entry (SPEC).
- ``reference``: the exact reference, its error scale, and torch's cumsum (the baseline).
- ``op``: the public ``scan``.
"""

from .config import ScanConfig
from .lookback import SPEC
from .op import scan
from .problem import DTYPES, ScanProblem

__all__ = ["scan", "ScanConfig", "ScanProblem", "DTYPES", "SPEC"]
