"""Every op on the second GPU (cuda:1), called while cuda:0 is current: the kernels must run on the
tensors' device and give the same answers as on cuda:0. Skipped on machines with one GPU (the H200 x2
machine runs it)."""

import pytest
import torch

import cute_kernels as ck

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]


def _calls(device):
    g = torch.Generator(device="cpu").manual_seed(3)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(shape, generator=g).to(device=device, dtype=dtype)

    a, b = randn(300, 200), randn(200, 100)
    h1, h2 = randn(512, 256, dtype=torch.float16), randn(256, 512, dtype=torch.float16)
    q, k, v = (randn(2, 3, 129, 64, dtype=torch.float16) for _ in range(3))
    vol, ker = randn(20, 21, 22), randn(3, 3, 3)
    x = randn(4, 100_000)
    return {
        "sgemm": lambda: ck.sgemm(a, b),
        "hgemm": lambda: ck.hgemm(h1, h2),
        "attention": lambda: ck.attention(q, k, v, causal=True),
        "conv3d": lambda: ck.conv3d(vol, ker),
        "scan": lambda: ck.scan(x.double()),
    }


@pytest.mark.parametrize("op", ["sgemm", "hgemm", "attention", "conv3d", "scan"])
def test_second_gpu_matches_the_first(op):
    torch.cuda.set_device(0)
    on0 = _calls("cuda:0")[op]()
    on1 = _calls("cuda:1")[op]()  # cuda:0 is still the current device
    torch.cuda.synchronize("cuda:1")
    assert on1.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    torch.testing.assert_close(on1.cpu(), on0.cpu(), rtol=1e-5, atol=1e-5)
