"""The dispatcher's choices and explanations."""
from __future__ import annotations

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch


def test_backends_table_lists_reference():
    table = {b.name: b for b in fm.backends()}
    assert table["reference"].available and table["reference"].reason
    for b in table.values():
        assert isinstance(b.available, bool) and b.reason


def test_cpu_picks_reference_and_explains():
    m = fm.FusedMLP(16, 8, 32, 2)
    ex = fm.explain(m, torch.randn(2, 16))
    assert ex.backend == "reference"
    text = str(ex)
    assert "chosen: reference" in text
    for b in fm.backends():
        assert b.name in text  # every known backend is listed with its reason


def test_order_per_device_type():
    assert dispatch.ORDER["cuda"][-1] == "reference" and dispatch.ORDER["xpu"][-1] == "reference"
    assert dispatch.ORDER["cuda"].index("cuda") < dispatch.ORDER["cuda"].index("triton")
    assert dispatch.ORDER["xpu"].index("sycl") < dispatch.ORDER["xpu"].index("triton")


def test_decisions_are_cached():
    spec = fm.MLPSpec((16, 16), dtype=torch.float32)
    dispatch._decisions.clear()
    a = dispatch.choose(torch.device("cpu"), spec)
    assert len(dispatch._decisions) == 1
    assert dispatch.choose(torch.device("cpu"), spec) is a and len(dispatch._decisions) == 1
