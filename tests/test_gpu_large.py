"""More than 2^31 elements in x (int64 offsets): GPU only, forward checked on rows at the end."""
import pytest
import torch

import fusedmlp_xpu as fm

from conftest import BACKENDS, assert_close, reference, tolerance

GPU = [(n, d) for n, d in BACKENDS if d.type != "cpu" and n != "reference"]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU, ids=[f"{n}-{d.type}" for n, d in GPU])
def test_more_than_2_pow_31_elements(backend):
    name, dev = backend
    rows = 2 ** 25 + 37  # x: 2^31 + 2368 fp16 elements, 4.3 GB
    m = fm.FusedMLP(64, 16, 64, 2, device=dev, dtype=torch.float16, backend=name)
    x = torch.randn(rows, 64, device=dev, dtype=torch.float16)
    assert x.numel() > 2 ** 31
    with torch.no_grad():
        y = m(x)
    tail = slice(rows - 4096, rows)
    assert_close(y[tail], reference(x[tail], m.weights(), m.biases(), "relu", "none"),
                 tolerance(name, torch.float16))
