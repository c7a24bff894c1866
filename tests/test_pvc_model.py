"""The static Max 1550 model (fusedmlp_xpu/bench/pvc.py): the committed model run is what
the model makes of its listings, the calibration against Intel's Table I, the model's
direction (more gathers, fewer threads: slower), bad input named, docs/intel.md showing
the committed table; and, where ocloc and the sycl runtime are here (CI: required with
FUSEDMLP_REQUIRE_OCLOC=1), the kernels as they are now compiled and modelled: a standard
configuration more than 10% slower than the committed table fails."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from fusedmlp_xpu.bench import pvc
from fusedmlp_xpu.bench.configs import CONFIGS

ROOT = Path(__file__).resolve().parents[1]
WORSE = 1.10  # issue 61: CI fails past 10% worse


@pytest.fixture(scope="module")
def committed():
    return pvc.committed_model()


def test_committed_rows_are_the_model_of_their_listings(committed):
    for r in committed["rows"]:
        k = {"kernel": r["kernel"], **r["listing"]}
        m = pvc.model(k, CONFIGS[r["config"]], r["rows"], r["shape"])
        assert m["model_s"] == pytest.approx(r["model_s"], rel=1e-9), r["config"]
        assert r["model_over_floor"] == pytest.approx(r["model_s"] / r["floor_s"])


def test_calibration_is_intels_kernel_against_its_83_us(committed):
    cal = pvc.calibration()
    assert pvc.INTEL_TABLE1_S == pytest.approx(83e-6)
    assert cal["ratio"] == pytest.approx(cal["model_s"] / 83e-6)
    assert cal["ratio"] == pytest.approx(committed["meta"]["calibration"]["ratio"])
    # Intel's listing: 12.3 instructions a dpas, no gathers, 192 dpas a thread at width 64
    assert cal["instructions_per_dpas"] == pytest.approx(12.3, abs=0.05)
    assert cal["dpas_per_thread"] == 12 * 16 and cal["gather_share"] == 0


def _listing(gathers=0, inst=1000, grf=256):
    return {"kernel": "k", "grf": grf, "inst_count": inst, "dpas": 48, "gathers": gathers,
            "sends": {"global_load": 40, "global_store": 20, "slm_load": 10, "slm_store": 0}}


def test_the_model_moves_the_right_way():
    cfg, n = CONFIGS["narrow-w64"], 2**22
    shape = {"rows_per_thread": 16, "work_group": 16, "slm_bytes": 0}
    base = pvc.model(_listing(), cfg, n, shape)
    assert pvc.model(_listing(gathers=60), cfg, n, shape)["l1_s"] > base["l1_s"]
    assert pvc.model(_listing(inst=5000), cfg, n, shape)["issue_s"] == \
        pytest.approx(5 * base["issue_s"])
    # 128 KiB of SLM a work-group of 16: 2 threads an engine, half the overlap
    slm = pvc.model(_listing(), cfg, n, {**shape, "slm_bytes": 128 * 1024})
    assert slm["threads_per_engine"] == 2 and slm["xmx_s"] == pytest.approx(2 * base["xmx_s"])
    # the XMX term at 4 threads is the matrix peak: 2^22 rows x 10 dpas x 8 clocks / 1024
    assert base["xmx_s"] == pytest.approx(2**22 * 10 * 8 / 1024 / 1.6e9)


def test_bad_input_names_the_argument(capsys):
    with pytest.raises(ValueError, match="isa: no forward kernel"):
        pvc.model_rows({"kernels": []})
    with pytest.raises(SystemExit):
        pvc.main(["--out", "x.json"])
    assert "--out" in capsys.readouterr().err
    with pytest.raises(ValueError, match="run: no model run"):
        pvc.committed_model("no-such-run")


def test_docs_show_the_committed_model(committed):
    page = (ROOT / "docs" / "intel.md").read_text()
    table = pvc.rows_markdown(committed["rows"], committed["meta"]["calibration"])
    assert table in page
    m = re.search(r"model run `([A-Za-z0-9._+-]+)`", page)
    assert m and pvc.committed_model(m.group(1)) == committed


def test_docs_show_the_committed_isa_table():
    """docs/intel.md's ISA table is pvc.isa_markdown of the runs it names, every row's
    counts from the committed table (not typed by hand)."""
    page = (ROOT / "docs" / "intel.md").read_text()
    now = re.search(r"From run `([A-Za-z0-9._+-]+)`", page)
    before = re.search(r"`before` is run `([A-Za-z0-9._+-]+)`", page)
    assert now and before, "docs/intel.md names no ISA run (From run `...`, `before` is run `...`)"
    table = pvc.isa_markdown(pvc.load_isa(run=now.group(1)), pvc.load_isa(run=before.group(1)))
    assert table in page


_HAVE_TOOLS = shutil.which(os.environ.get("OCLOC", "ocloc")) is not None


@pytest.mark.skipif(not _HAVE_TOOLS and os.environ.get("FUSEDMLP_REQUIRE_OCLOC") != "1",
                    reason="ocloc not installed (Debian's intel-opencl-icd)")
def test_standard_configs_no_more_than_10_percent_worse_than_committed(committed, tmp_path):
    isa = pvc.compile_isa(workdir=tmp_path)
    now = {r["config"]: r for r in pvc.model_rows(isa)}
    worse = [f"{r['config']}: {now[r['config']]['model_s'] * 1e6:.1f} us modelled, "
             f"committed {r['model_s'] * 1e6:.1f} us" for r in committed["rows"]
             if now[r["config"]]["model_s"] > WORSE * r["model_s"]]
    assert not worse, ("modelled more than 10% slower than benchmarks/results/pvc.jsonl "
                       "(regenerate with python -m fusedmlp_xpu.bench.pvc --model --compile "
                       "--out F if intended): " + "; ".join(worse))
