"""The Intel dispatch rules (sycl on a Max 1550, else triton, else reference), with mocked
XPU device properties, and the sycl backend's behaviour when its dependencies are absent.
No XPU, dpctl or SYCL runtime is needed here: availability is mocked where it matters."""
from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest
import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch

sycl = importlib.import_module("fusedmlp_xpu.backends.sycl")

XPU = torch.device("xpu", 0)
NARROW = fm.MLPSpec((64, 64, 64, 16), "relu", "none", True, torch.float16)


class FakeTriton(fm.dispatch.Backend):
    """Stands in for the triton backend (another branch) so the xpu order can be checked."""

    name, device_types = "triton", ("cuda", "xpu")

    def available(self):
        return True, "test stand-in"

    def supports(self, spec, device):
        return True, "test stand-in: any spec"


@pytest.fixture
def xpu_named(monkeypatch):
    """Pretend an XPU of a given name is present, with sycl available; returns a setter."""
    monkeypatch.setattr(dispatch, "_decisions", {})
    monkeypatch.setitem(dispatch.REGISTRY, "sycl", sycl.SyclBackend())
    monkeypatch.setitem(dispatch._availability, "sycl", (True, "mocked available"))

    def set_name(name):
        props = types.SimpleNamespace(name=name, total_memory=128 << 30)
        monkeypatch.setattr(torch.xpu, "get_device_properties", lambda device=None: props)

    return set_name


@pytest.fixture
def with_triton(monkeypatch):
    monkeypatch.setitem(dispatch.REGISTRY, "triton", FakeTriton())
    monkeypatch.setitem(dispatch._availability, "triton", (True, "test stand-in"))


@pytest.fixture
def without_triton(monkeypatch):
    monkeypatch.delitem(dispatch.REGISTRY, "triton", raising=False)


@pytest.mark.parametrize("name", ["Intel(R) Data Center GPU Max 1550",
                                  "Intel(R) Data Center GPU Max 1100"])
def test_max_gpu_picks_sycl(xpu_named, with_triton, name):
    xpu_named(name)
    ex = dispatch.explain_choice(XPU, NARROW)
    assert ex.backend == "sycl", str(ex)
    assert dispatch.choose(XPU, NARROW) is dispatch.REGISTRY["sycl"]
    assert name in str(ex)


@pytest.mark.parametrize("name", ["Intel(R) Arc(TM) A770 Graphics",
                                  "Intel(R) Data Center GPU Flex 170", ""])
def test_other_xpu_picks_triton_with_reason(xpu_named, with_triton, name):
    xpu_named(name)
    ex = dispatch.explain_choice(XPU, NARROW)
    assert ex.backend == "triton", str(ex)
    why = {c.name: c.reason for c in ex.considered}["sycl"]
    assert "not a Max 1550" in why


def test_other_xpu_without_triton_picks_reference(xpu_named, without_triton):
    xpu_named("Intel(R) Arc(TM) A770 Graphics")
    ex = dispatch.explain_choice(XPU, NARROW)
    assert ex.backend == "reference", str(ex)
    assert any(c.name == "triton" and "not part of this installation" in c.reason
               for c in ex.considered)


def test_max_1550_too_wide_falls_back(xpu_named, with_triton):
    """Past the fused kernel's width limit a Max 1550 falls back, saying why."""
    xpu_named("Intel(R) Data Center GPU Max 1550")
    wide = fm.MLPSpec((4096, 14336, 4096), "silu", "none", False, torch.bfloat16)
    ex = dispatch.explain_choice(XPU, wide)
    assert ex.backend == "triton"
    assert "over the fused kernel's limit" in {c.name: c.reason for c in ex.considered}["sycl"]


def test_max_1550_float64_falls_back(xpu_named, without_triton):
    xpu_named("Intel(R) Data Center GPU Max 1550")
    spec = fm.MLPSpec((16, 16), dtype=torch.float64)
    assert dispatch.explain_choice(XPU, spec).backend == "reference"


def test_sycl_unavailable_on_max_1550_falls_back(xpu_named, with_triton, monkeypatch):
    xpu_named("Intel(R) Data Center GPU Max 1550")
    monkeypatch.setitem(dispatch._availability, "sycl", (False, "sycl backend: missing g++"))
    ex = dispatch.explain_choice(XPU, NARROW)
    assert ex.backend == "triton"
    assert {c.name: c.reason for c in ex.considered}["sycl"] == "sycl backend: missing g++"


def test_cpu_never_picks_sycl_automatically(monkeypatch):
    monkeypatch.setitem(dispatch.REGISTRY, "sycl", sycl.SyclBackend())
    monkeypatch.setitem(dispatch._availability, "sycl", (True, "mocked available"))
    assert dispatch.ORDER["cpu"] == ("reference",)
    ex = dispatch.explain_choice(torch.device("cpu"), NARROW)
    assert ex.backend == "reference"
    assert {c.name: c.reason for c in ex.considered}["sycl"] == "not used automatically on cpu"


def test_toolchain_missing_names_what(monkeypatch):
    """available() says which piece is missing, instead of failing later."""
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    ok, why = sycl.SyclBackend().available()
    assert not ok and "no-such-compiler-xyz" in why


def test_import_and_cpu_use_without_dpctl():
    """With dpctl unimportable the package imports, the reference runs, sycl says why not."""
    code = (
        "import sys; sys.modules['dpctl'] = None\n"
        "import torch, fusedmlp_xpu as fm\n"
        "from fusedmlp_xpu import dispatch\n"
        "be = dispatch.REGISTRY['sycl']\n"
        "ok, why = dispatch.availability('sycl')\n"
        "xpu = hasattr(torch, 'xpu') and torch.xpu.is_available()\n"
        "assert xpu or not ok or not be.supports(fm.MLPSpec((8, 8)), torch.device('cpu'))[0]\n"
        "print(why if not ok else be.supports(fm.MLPSpec((8, 8)), torch.device('cpu'))[1])\n"
        "y = fm.fused_mlp(torch.randn(3, 8), [torch.randn(4, 8)])\n"
        "assert y.shape == (3, 4)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "dpctl" in res.stdout or "intel-sycl-rt" in res.stdout or "missing" in res.stdout
