"""The dispatcher's choices and explanations."""
from __future__ import annotations

import os

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


def test_envvars_reads_what_os_environ_holds(monkeypatch):
    """The per-call environment reads (envvars.get) see every change at once, set or
    unset, with os.environ.get's defaults."""
    from fusedmlp_xpu import envvars

    name = "FUSEDMLP_TEST_SWITCH"
    monkeypatch.delenv(name, raising=False)
    assert envvars.get(name) is None and envvars.get(name, "1") == "1"
    for value in ("0", "", "triton", "é"):
        monkeypatch.setenv(name, value)
        assert envvars.get(name) == os.environ.get(name) == value
    monkeypatch.delenv(name)
    assert envvars.get(name, "x") == "x"
