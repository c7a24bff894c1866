"""The results tables (benchmarks/results/<machine>.jsonl) stay data: every record parses
and says its run, date and environment; every run the pages cite as `run <id>` is in a
table; the folder stays small; the writer appends and never rewrites. CPU only."""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

import pytest

from fusedmlp_xpu.bench import results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
TABLES = sorted(glob.glob(os.path.join(RESULTS, "*" + results.SUFFIX)))
#: the pages whose figures must stay traceable to a run
PAGES = ["README.md", "docs/**/*.md", "benchmarks/**/*.md", "kernels/**/*.md"]
CITED = re.compile(r"`run ([A-Za-z0-9][A-Za-z0-9._+-]*)`")
MAX_FILES = 40


@pytest.fixture(scope="module")
def records():
    return {os.path.basename(t): results.read(t) for t in TABLES}


def test_there_are_tables_and_few_files():
    assert {"h200.jsonl", "cpu.jsonl"} <= {os.path.basename(t) for t in TABLES}, TABLES
    files = [p for p in glob.glob(os.path.join(RESULTS, "**", "*"), recursive=True)
             if os.path.isfile(p)]
    assert len(files) <= MAX_FILES, (f"{len(files)} files under benchmarks/results (at most "
                                     f"{MAX_FILES}): append runs to the machine's table")


def test_every_record_has_run_date_env(records):
    for name, recs in records.items():
        assert recs, f"{name} is empty"
        for r in recs:
            assert r["run"] and r["date"] and isinstance(r["env"], dict), (name, r["run"])
            assert r["kind"] in results.KINDS, (name, r["run"], r["kind"])
            assert re.match(r"\d{4}-\d\d-\d\d", r["date"]), (name, r["run"], r["date"])
            assert r["machine"] == name[:-len(results.SUFFIX)], (name, r["run"])
        runs = {r["run"] for r in recs if r["kind"] == "run"}
        measured = {r["run"] for r in recs if r["kind"] == "measurement"}
        assert measured <= runs, f"{name}: measurements without their run record: " \
                                 f"{sorted(measured - runs)[:5]}"


def test_run_ids_are_unique_per_table(records):
    for name, recs in records.items():
        ids = [r["run"] for r in recs if r["kind"] == "run"]
        assert len(ids) == len(set(ids)), f"{name}: a run id twice"


def test_every_cited_run_is_in_a_table(records):
    have = {r["run"] for recs in records.values() for r in recs}
    missing = {}
    for pattern in PAGES:
        for page in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            for run in CITED.findall(open(page, encoding="utf-8").read()):
                if run not in have:
                    missing.setdefault(os.path.relpath(page, ROOT), []).append(run)
    assert not missing, f"pages cite runs that no table holds: {missing}"


#: a result file named in code or kernel comments (the constant it justified): its stem
#: is the run id the file became
CODE_CITED = re.compile(r"\b((?:h200|cpu)-[A-Za-z0-9_.+-]*?2026\d{4}[a-z0-9]*(?:-[a-z0-9-]+?)?)"
                        r"\.(?:json|txt|log|csv)\b")


def test_result_files_the_code_cites_are_runs(records):
    have = {r["run"] for recs in records.values() for r in recs}
    missing, n = {}, 0
    for pattern in ("fusedmlp_xpu/**/*.py", "kernels/**/*.*", "ci/*.py"):
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            for run in CODE_CITED.findall(open(path, encoding="utf-8", errors="replace").read()):
                n += 1
                if run not in have:
                    missing.setdefault(os.path.relpath(path, ROOT), []).append(run)
    assert n > 10, "no citation found: the pattern no longer matches the code's"
    assert not missing, f"code cites result files that are no run in a table: {missing}"


def test_the_runs_the_report_and_code_cite_are_there(records):
    have = {r["run"] for recs in records.values() for r in recs}
    for run in ("h200-narrow-suite-20261202", "h200-wide-20261202d", "cpu-quick-20261130",
                "h200-sweep-one-kernel-20261201d", "h200-steps-loop-image-20261204b"):
        assert run in have, run


def test_the_index_is_the_tables():
    with open(os.path.join(RESULTS, "INDEX.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed.strip() == results.index(TABLES).strip(), (
        "benchmarks/results/INDEX.md is stale: python -m fusedmlp_xpu.bench.results index "
        "benchmarks/results/*.jsonl > benchmarks/results/INDEX.md")


# --- the writer, on a table of its own ------------------------------------------------
def _doc(n, env=None):
    return {"schema": "fusedmlp-bench/1", "env": env or {"vendor": "cpu", "date": "2026-12-05T00:00:00+00:00"},
            "ceilings": {"copy_GBps": None}, "notes": ["a note"],
            "records": [{"config": "narrow-w64", "N": 2 ** i, "median_ms": 0.1 * i}
                        for i in range(n)]}


def test_the_writer_appends_and_never_rewrites(tmp_path):
    table = str(tmp_path / "cpu.jsonl")
    first = results.RunWriter(table, "a", "the first")
    doc = _doc(1)
    first.write(doc)
    doc["records"] += _doc(3)["records"][1:]
    first.write(doc, final=True)
    before = open(table, "rb").read()
    results.RunWriter(table, "b", "the second").write(_doc(2), final=True)
    after = open(table, "rb").read()
    assert after.startswith(before) and len(after) > len(before)
    docs = results.documents(results.read(table))
    assert list(docs) == ["a", "b"]
    a = docs["a"]
    assert [r["N"] for r in a["records"]] == [1, 2, 4]  # each measurement once
    assert a["ceilings"] == {"copy_GBps": None} and a["notes"] == ["a note"]
    assert a["what"] == "the first" and a["env"]["vendor"] == "cpu"
    assert len(docs["b"]["records"]) == 2
    with pytest.raises(ValueError, match="already in"):
        results.RunWriter(table, "a", "again").write(_doc(1), final=True)
    with pytest.raises(RuntimeError, match="finished"):
        first.write(doc)
    assert open(table, "rb").read() == after


def test_fusedmlp_bench_appends_to_the_table(tmp_path, monkeypatch):
    """Two `fusedmlp bench` runs into one table: the first run's lines stay as they were."""
    from fusedmlp_xpu.bench import narrow

    def bench_one(cfg, N, dtype, mode, *args, **kwargs):
        return [{"config": cfg.name, "N": N, "dtype": dtype, "mode": mode, "backend": "eager",
                 "timing": "python", "pass": 1, "median_ms": 1.0, "x_floor": None,
                 "max_rel_error": None}]

    monkeypatch.setattr(narrow, "bench_one", bench_one)
    monkeypatch.setattr(narrow, "host_overhead_us", lambda m, device, dtype: (10.0, 5.0))
    p = argparse.ArgumentParser()
    narrow._add_arguments(p)
    table = tmp_path / "cpu.jsonl"
    sizes = []
    for run in ("one", "two"):
        args = p.parse_args(["--device", "cpu", "--config", "narrow-w32", "--mode", "inference",
                             "--compile", "none", "--out", str(table), "--run", run])
        assert narrow.cmd_bench(args) == 0
        sizes.append(table.read_bytes())
    assert sizes[1].startswith(sizes[0]) and len(sizes[1]) > len(sizes[0])
    docs = results.documents(results.read(str(table)))
    assert list(docs) == ["one", "two"]
    for d in docs.values():
        assert d["schema"] == "fusedmlp-bench/1" and d["env"]["date"] and d["env"]["vendor"] == "cpu"
        assert "commit" in d["env"]
        assert [r["timing"] for r in d["records"]] == ["python", "host"]
        assert d["what"].startswith("fusedmlp bench --suite narrow")


def test_round_trip_of_other_harnesses():
    """A result whose measurements sit under another key, or that has none, comes back
    whole."""
    for doc in ({"schema": "fusedmlp-sweep/1", "env": {"vendor": "nvidia", "device": "NVIDIA H200",
                                                       "date": "2026-12-01"},
                 "args": {"x": 1}, "rows": [{"a": 1}, {"a": 2}]},
                {"env": {"vendor": "nvidia", "device": "NVIDIA H200", "date": "2026-12-01"},
                 "train_host_us": {"eager": 30.0}}):
        recs = results.to_records(doc, "r")
        assert all(r["machine"] == "h200" for r in recs)
        back = results.documents(json.loads(json.dumps(recs)))["r"]
        for k, v in doc.items():
            assert back[k] == v, k


def test_bad_tables_and_ids_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"--out: expected a results table ending in \.jsonl"):
        results.RunWriter(str(tmp_path / "x.json"), None, "w")
    with pytest.raises(ValueError, match="run: expected letters"):
        results.RunWriter(str(tmp_path / "x.jsonl"), "has space", "w")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"run": "a", "kind": "run", "date": "2026-12-05", "env": {}}\n[1]\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: expected a JSON object"):
        results.read(str(bad))
    bad.write_text('{"run": "a", "kind": "run", "env": {}}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: .*missing or bad: \['date'\]"):
        results.read(str(bad))


@pytest.mark.parametrize("env, want", [
    ({"vendor": "cpu", "device": "x86_64"}, "cpu"),
    ({"vendor": "nvidia", "device": "NVIDIA H200"}, "h200"),
    ({"vendor": "nvidia", "device": "NVIDIA H100 80GB HBM3"}, "h100"),
    ({"vendor": "intel", "device": "Intel(R) Data Center GPU Max 1550"}, "max1550"),
])
def test_machine_names(env, want):
    assert results.machine(env) == want


def test_bench_cli_names_a_bad_table_or_run(tmp_path, capsys):
    """`fusedmlp bench --out` must name a table (.jsonl), and `--run` a new id: both
    refused before any timing, in one line naming the argument."""
    from fusedmlp_xpu import cli

    assert cli.main(["bench", "--device", "cpu", "--out", str(tmp_path / "b.json")]) == 2
    assert "argument --out: expected a results table ending in .jsonl" in capsys.readouterr().err
    table = tmp_path / "cpu.jsonl"
    results.RunWriter(str(table), "taken", "w").write(_doc(1), final=True)
    assert cli.main(["bench", "--device", "cpu", "--out", str(table), "--run", "taken"]) == 2
    assert "argument --run: 'taken' is already in" in capsys.readouterr().err
    assert cli.main(["bench", "--device", "cpu", "--run", "a b"]) == 2
    assert "argument --run: expected letters" in capsys.readouterr().err


def test_report_reads_runs_from_a_table(tmp_path, capsys):
    """`fusedmlp report TABLE --run ID`: the named bench run only; a run not there, or not
    a bench run, is an error naming --run."""
    from fusedmlp_xpu import cli

    table = str(tmp_path / "cpu.jsonl")
    fixture = json.load(open(os.path.join(ROOT, "tests", "data", "synthetic_bench_cpu.json")))
    results.RunWriter(table, "bench-run", "w").write(fixture, final=True)
    results.RunWriter(table, "other", "w").write({**_doc(1), "schema": "x/1"}, final=True)
    out = tmp_path / "out"
    assert cli.main(["report", table, "--run", "bench-run", "--out", str(out)]) == 0
    assert "`run bench-run`" in (out / "report.md").read_text()
    assert cli.main(["report", table, "--out", str(out), "--history"]) == 0  # every run
    assert "from 1 run(s)" in (out / "report.md").read_text()  # the table's bench runs: one
    capsys.readouterr()
    assert cli.main(["report", table, "--run", "nope", "--out", str(out)]) == 2
    assert "argument --run: not in the results given: nope" in capsys.readouterr().err
    assert cli.main(["report", table, "--run", "other", "--out", str(out)]) == 2
    assert "argument --run: run other: expected schema" in capsys.readouterr().err


def test_a_device_log_is_appended_as_one_log_record(tmp_path, capsys):
    """``results log``: a raw log as one record (only the lines --keep matches), listed
    in the index with its file; the same run id twice is refused."""
    log = tmp_path / "tests.log"
    log.write_text("tests/a.py::t1 PASSED\ntests/a.py::t2 FAILED\n== 1 failed, 1 passed ==\n")
    table = str(tmp_path / "h200.jsonl")
    argv = ["log", str(log), "--run", "h200-tests-x", "--what", "the GPU suite",
            "--machine", "h200", "--date", "2026-12-05", "--keep", "FAILED|passed",
            "--table", table]
    assert results.main(argv) == 0
    (r,) = results.read(table)
    assert (r["kind"], r["run"], r["file"], r["date"]) == ("log", "h200-tests-x", "tests.log",
                                                           "2026-12-05")
    assert r["text"] == "tests/a.py::t2 FAILED\n== 1 failed, 1 passed ==\n"
    assert "| `h200-tests-x` | 2026-12-05 | 0 | the GPU suite; log `tests.log` |" in \
        results.index([table])
    assert results.main(argv) == 2
    assert "already in" in capsys.readouterr().err


def test_commit_of_an_exported_tree(tmp_path):
    """A tree exported without .git (how runs reach a GPU machine) names the commit in its
    COMMIT file, never the commit of a repository around it; this checkout names its own."""
    from fusedmlp_xpu.bench.results import commit_here

    tree = tmp_path / "tree"
    tree.mkdir()
    assert commit_here(str(tree)) is None
    (tree / "COMMIT").write_text("741697a95538dac439bca305d089b23b7f64c74f\n")
    assert commit_here(str(tree)) == "741697a95538dac439bca305d089b23b7f64c74f"
    (tree / "COMMIT").write_text("not a commit\n")
    assert commit_here(str(tree)) is None
    here = commit_here()
    if here is not None:  # run from a git checkout
        assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", here), here
