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


@pytest.mark.gpu
@pytest.mark.parametrize("widths", [(64, 64, 64, 64, 16), (64, 256, 64)], ids=["narrow", "wide"])
@pytest.mark.parametrize("backend", GPU, ids=[f"{n}-{d.type}" for n, d in GPU])
def test_train_step_in_a_cuda_graph(backend, widths):
    """A whole train step (forward + backward) captured in a CUDA graph, replayed on new
    data: no host syncs or host-side state in the hot path, allocations from the graph's pool."""
    name, dev = backend
    if dev.type != "cuda":
        pytest.skip("CUDA graphs")
    dt = torch.float16
    m = fm.FusedMLP(widths[0], widths[-1], widths[1], len(widths) - 2, activation="silu",
                    output_activation="tanh", device=dev, dtype=dt, backend=name)
    static_x = torch.randn(1037, widths[0], device=dev, dtype=dt, requires_grad=True)
    static_gy = torch.randn(1037, widths[-1], device=dev, dtype=dt)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compile, tune, allocate
        for _ in range(3):
            m.zero_grad(set_to_none=True)
            static_x.grad = None
            m(static_x).backward(static_gy)
    torch.cuda.current_stream().wait_stream(side)
    m.zero_grad(set_to_none=True)
    static_x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = m(static_x)
        static_y.backward(static_gy)
    for _ in range(2):  # fresh data each replay, copied into the captured inputs
        with torch.no_grad():
            static_x.copy_(torch.randn_like(static_x))
            static_gy.copy_(torch.randn_like(static_gy))
        graph.replay()
        torch.cuda.synchronize()
        ry, rgx, rgw, rgb = reference(static_x, m.weights(), m.biases(), "silu", "tanh",
                                      grad_y=static_gy)
        tol = tolerance(name, dt)
        assert_close(static_y, ry, tol)
        assert_close(static_x.grad, rgx, tol, "grad x")
        for i, (w, b) in enumerate(zip(m.weights(), m.biases())):
            assert_close(w.grad, rgw[i], tol, f"grad weights[{i}]")
            assert_close(b.grad, rgb[i], tol, f"grad biases[{i}]")
