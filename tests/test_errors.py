"""Every bad input raises its documented error, naming the argument."""
from __future__ import annotations

import pytest
import torch

import fusedmlp_xpu as fm

from conftest import make_params


def _args():
    ws, bs = make_params((16, 32, 8), True, torch.float32, "cpu")
    return torch.randn(5, 16), ws, bs


@pytest.mark.parametrize("mutate, exc, msg", [
    (lambda x, ws, bs: (torch.randn(5, 15), ws, bs), ValueError, r"weights\[0\]: expected in_features 15"),
    (lambda x, ws, bs: (x, [ws[0], torch.randn(8, 31)], bs), ValueError, r"weights\[1\]: expected in_features 32"),
    (lambda x, ws, bs: (x, [ws[0], torch.randn(8, 32, 1)], bs), ValueError, r"weights\[1\]: expected 2-D"),
    (lambda x, ws, bs: (x, ws, bs[:1]), ValueError, r"biases: expected one per weight \(2\), got 1"),
    (lambda x, ws, bs: (x, ws, [bs[0], torch.randn(9)]), ValueError, r"biases\[1\]: expected shape \(8,\)"),
    (lambda x, ws, bs: (x.double(), ws, bs), TypeError, r"weights\[0\]: expected dtype torch.float64"),
    (lambda x, ws, bs: (x, [ws[0].half(), ws[1]], bs), TypeError, r"weights\[0\]: expected dtype torch.float32"),
    (lambda x, ws, bs: (x.long(), ws, bs), TypeError, r"x: expected a floating dtype"),
    (lambda x, ws, bs: (x, ws[0], bs), TypeError, r"weights: expected a list"),
    (lambda x, ws, bs: (x, [], bs), TypeError, r"weights: expected a non-empty list"),
    (lambda x, ws, bs: (x.numpy(), ws, bs), TypeError, r"x: expected a torch.Tensor"),
    (lambda x, ws, bs: (torch.tensor(1.0), ws, bs), ValueError, r"x: expected at least 1 dimension"),
    (lambda x, ws, bs: (x, ws, [bs[0], torch.randn(8, device="meta")]), ValueError, r"biases\[1\]: expected device cpu"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_inputs(mutate, exc, msg):
    x, ws, bs = mutate(*_args())
    with pytest.raises(exc, match=msg):
        fm.fused_mlp(x, ws, bs)


def test_bad_activation_names():
    x, ws, bs = _args()
    with pytest.raises(ValueError, match="activation: unknown name 'mish'"):
        fm.fused_mlp(x, ws, bs, activation="mish")
    with pytest.raises(ValueError, match="unknown name 'swishy'"):
        fm.fused_mlp(x, ws, bs, output_activation="swishy")
    with pytest.raises(ValueError, match="unknown name"):
        fm.FusedMLP(4, 4, 4, 1, activation="mish")


def test_bad_backend_name():
    x, ws, bs = _args()
    with pytest.raises(ValueError, match="backend: unknown backend 'fastest'"):
        fm.fused_mlp(x, ws, bs, backend="fastest")


def test_bad_recompute():
    """recompute is None (the backend chooses), True or False: nothing else is read as
    a truth value."""
    x, ws, bs = _args()
    with pytest.raises(TypeError, match="recompute: expected None, True or False, got 'no'"):
        fm.fused_mlp(x, ws, bs, recompute="no")
    with pytest.raises(TypeError, match="recompute: expected None, True or False, got 0"):
        fm.FusedMLP(16, 8, 32, 2, recompute=0)
    for ok in (None, True, False):
        fm.fused_mlp(x, ws, bs, recompute=ok)
    # an unhashable value gets the same message (no cache keyed on the value in between)
    with pytest.raises(TypeError, match=r"recompute: expected None, True or False, got \[True\]"):
        fm.fused_mlp(x, ws, bs, recompute=[True])


def test_module_bad_input():
    m = fm.FusedMLP(16, 8, 32, 2)
    with pytest.raises(ValueError, match=r"x: expected last dimension 16 \(this module's "
                       r"in_features\), got shape \(3, 12\)"):
        m(torch.randn(3, 12))
    with pytest.raises(ValueError, match=r"x: expected last dimension 16 .*got shape \(2, 3, 12\)"):
        with torch.no_grad():
            m(torch.randn(2, 3, 12))
    g = fm.GatedMLP(16, 40)
    with pytest.raises(ValueError, match=r"x: expected last dimension 16 \(this module's "
                       r"in_features\), got shape \(3, 17\)"):
        g(torch.randn(3, 17))
    with pytest.raises(TypeError, match="expected dtype torch.float16"):
        m(torch.randn(3, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"hidden_layers: expected an int in \[0, "):
        fm.FusedMLP(16, 8, 32, -1)
    with pytest.raises(ValueError, match=r"hidden_features: expected an int in \[1, "):
        fm.FusedMLP(16, 8, 0, 1)


@pytest.mark.parametrize("op", ["mlp", "mlp_train"])
def test_ops_called_directly_check_dtype_and_device(op):
    """torch.ops.fusedmlp.* skip fused_mlp's validation; a weight or bias of another dtype
    or device is still an error naming it (a kernel would read it wrongly)."""
    x, ws, bs = _args()
    fn = getattr(torch.ops.fusedmlp, op)
    with pytest.raises(TypeError, match=r"weights\[1\]: expected dtype torch.float32"):
        fn(x, [ws[0], ws[1].half()], bs, "relu", "none", "")
    with pytest.raises(ValueError, match=r"biases\[0\]: expected device cpu"):
        fn(x, ws, [torch.randn(32, device="meta"), bs[1]], "relu", "none", "")


# --- what an adversarial user tried (each once gave an unclear error, or none) ---------
def _w(*shape):
    return torch.randn(*shape)


@pytest.mark.parametrize("build, exc, msg", [
    (lambda: fm.FusedMLP(True, 2, 4, 1), TypeError, "in_features: expected an int, got bool"),
    (lambda: fm.FusedMLP(3, 2, 4, True), TypeError, "hidden_layers: expected an int, got bool"),
    (lambda: fm.FusedMLP(3, 2, 4.0, 1), TypeError, "hidden_features: expected an int"),
    (lambda: fm.FusedMLP(3, 2, 4, 10**9), ValueError, r"hidden_layers: expected an int in \[0, "),
    (lambda: fm.FusedMLP(3, 2, 10**9, 1), ValueError, r"hidden_features: expected an int in \[1, "),
    (lambda: fm.FusedMLP(0, 2, 4, 1), ValueError, r"in_features: expected an int in \[1, "),
    (lambda: fm.FusedMLP(3, 2, 4, 1, backend=""), ValueError, "backend: expected None"),
    (lambda: fm.FusedMLP(3, 2, 4, 1, recompute="yes"), TypeError, "recompute: expected"),
    (lambda: fm.GatedMLP(True, 4), TypeError, "in_features: expected an int, got bool"),
    (lambda: fm.GatedMLP(3, 4, recompute="yes"), TypeError, "recompute: expected"),
    (lambda: fm.GatedMLP(3, 4, backend=""), ValueError, "backend: expected None"),
    (lambda: fm.fused_mlp(_w(2, 3), None), TypeError, "weights: expected a list"),
    (lambda: fm.fused_mlp(_w(2, 3), [_w(2, 3)], 5), TypeError, "biases: expected None or a list"),
    (lambda: fm.fused_mlp(_w(2, 3), [_w(2, 3)], backend=""), ValueError, "backend: expected None"),
    (lambda: fm.fused_gated_mlp(_w(2, 3), _w(4, 3), _w(4, 3), _w(3, 4), biases=5), TypeError,
     "biases: expected None or"),
    (lambda: fm.fused_gated_mlp(_w(2, 3), _w(4, 3), _w(4, 3), _w(3, 4), recompute="yes"),
     TypeError, "recompute: expected"),
    (lambda: fm.fused_gated_mlp(_w(2, 3), _w(4, 3), _w(4, 3), _w(3, 4), backend=""),
     ValueError, "backend: expected None"),
], ids=lambda v: "" if callable(v) or isinstance(v, type) else v[:40])
def test_adversarial_inputs_get_clear_errors(build, exc, msg):
    with pytest.raises(exc, match=msg):
        build()


def test_meta_device_modules_give_shapes():
    """Models built on the meta device (for deferred init, FSDP) run shape-only."""
    m = fm.FusedMLP(3, 2, 8, 2, device="meta")
    g = fm.GatedMLP(3, 8, device="meta")
    x = torch.empty(5, 7, 3, device="meta")
    assert m(x).shape == (5, 7, 2) and m(x).device.type == "meta"
    assert g(x).shape == (5, 7, 3) and g(x).device.type == "meta"


def test_triton_interpreter_from_threads():
    """Interpreted Triton launches (CPU tensors) take turns: 4 threads sharing one module
    get the single-threaded result (the interpreter patches triton.language globally)."""
    import threading

    from conftest import BACKENDS

    if ("triton", torch.device("cpu")) not in BACKENDS:
        pytest.skip("no Triton interpreter here")
    m = fm.FusedMLP(8, 4, 16, 2, backend="triton")
    x = torch.randn(9, 8)
    with torch.no_grad():
        want = m(x)
    errors, same = [], []

    def work():
        try:
            with torch.no_grad():
                same.append(torch.equal(m(x), want))
            xx = x.clone().requires_grad_()
            m(xx).sum().backward()
            same.append(xx.grad is not None and torch.isfinite(xx.grad).all().item())
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(same) == 8 and all(same)


def test_weights_as_any_iterable():
    """A generator of weights (e.g. from a module's parameters) is accepted, as before."""
    x = torch.randn(2, 3)
    ws = [torch.randn(4, 3), torch.randn(2, 4)]
    torch.testing.assert_close(fm.fused_mlp(x, (w for w in ws)), fm.fused_mlp(x, ws))
