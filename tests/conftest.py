import importlib

import pytest
import torch

import cute_kernels

# Register the families that are in the tree but not yet public (see cute_kernels.UNVERIFIED_FAMILIES), so
# that every registry-wide test covers them too.
for _module in cute_kernels.UNVERIFIED_FAMILIES:
    importlib.import_module(_module)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped where there is none)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def generator():
    """A seeded CUDA generator: fresh random data per test, reproducible per run."""
    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    return g


@pytest.fixture
def exact_fp32_torch():
    """torch's FP32 matmuls without TF32, so that a baseline's error is FP32's (use with pytest.mark.usefixtures)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous
