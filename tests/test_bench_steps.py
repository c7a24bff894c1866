"""`fusedmlp bench --suite steps --tiny` on the CPU, through the command's entry: one record
per variant, the fused step checked against float64, the variants' losses in agreement,
and every variant that did not run saying why."""
from __future__ import annotations


import pytest

from fusedmlp_xpu import cli
from fusedmlp_xpu.bench import results, steps as bench_steps

VARIANTS = ["eager", "compile", "fused", "fused-captured", "eager-captured"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("steps") / "steps.jsonl"
    rc = cli.main(["bench", "--suite", "steps", "--tiny", "--device", "cpu",
                   "--configs", "loop-image", "sdf-eikonal", "--out", str(out), "--run", "tiny"])
    assert rc == 0
    return results.documents(results.read(str(out)))["tiny"]


def _records(result, config):
    return {r["variant"]: r for r in result["records"] if r["config"] == config}


def test_environment_and_schema(result):
    assert result["schema"] == bench_steps.SCHEMA
    assert result["env"]["vendor"] == "cpu" and result["env"]["torch"]


@pytest.mark.parametrize("config", sorted(bench_steps.CONFIGS))
def test_one_record_per_variant(result, config):
    recs = _records(result, config)
    want = VARIANTS + (["fused-first-order"] if config == "sdf-eikonal" else [])
    assert sorted(recs) == sorted(want)
    order = [r["variant"] for r in result["records"] if r["config"] == config]
    assert order[-1] == "compile"  # nothing timed from Python runs after a compile
    # eager and fused from Python timed again in turn, each from its own step
    assert {v for v, r in recs.items() if "paired_python_ms" in r} == {"eager", "fused"}
    for r in recs.values():
        assert r["N"] == 2 ** 10 and r["dtype"] == "float32"
        if "skipped" in r:
            assert isinstance(r["skipped"], str) and len(r["skipped"]) > 10, r
        else:
            assert r["median_ms"] > 0 and r["min_ms"] <= r["median_ms"] <= r["max_ms"]
            assert r["steps"] == 20 and r["finite"]
            # the compared loss: the median of the tail; every 25th step's loss kept
            assert r["loss_tail_median"] > 0 and len(r["loss_curve"]) == 1
    # no CUDA here: the captured variants are skipped, saying so
    assert "CUDA" in recs["fused-captured"]["skipped"]
    assert "CUDA" in recs["eager-captured"]["skipped"]
    assert "skipped" not in recs["eager"] and "skipped" not in recs["fused"]


@pytest.mark.parametrize("config", sorted(bench_steps.CONFIGS))
def test_fused_checked_against_float64(result, config):
    rec = _records(result, config)["fused"]
    chk = rec["check"]
    assert chk["ok"] and chk["rows"] == rec["N"]  # checked at the timed batch
    assert len(chk["fused_errors"]) == len(chk["what"]) == len(chk["tolerances"])
    assert chk["what"][0] == "loss" and len(chk["what"]) > 3  # the loss and every gradient
    assert max(chk["fused_errors"]) <= 1e-5  # float32: the table's bound


@pytest.mark.parametrize("config", sorted(bench_steps.CONFIGS))
def test_losses_agree(result, config):
    timed = [r for v, r in _records(result, config).items()
             if "loss_final" in r and v != "fused-first-order"]
    assert len(timed) >= 2
    lo, hi = min(r["loss_final"] for r in timed), max(r["loss_final"] for r in timed)
    assert hi <= 1.02 * lo, [(r["variant"], r["loss_final"]) for r in timed]
    assert all(r["losses_agree"] for r in timed)
    # eager and fused run the same float32 math from the same seed: the same losses
    recs = _records(result, config)
    assert recs["fused"]["loss_final"] == pytest.approx(recs["eager"]["loss_final"], rel=1e-4)


def test_eikonal_is_second_order(result):
    recs = _records(result, "sdf-eikonal")
    assert recs["fused"]["second_order"] and not recs["fused-first-order"]["second_order"]
    # torch.compile either ran the double backward or says which scopes it tried
    skipped = recs["compile"].get("skipped")
    assert skipped is None or "compile of the step failed" in skipped, skipped
