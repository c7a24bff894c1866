"""`fusedmlp report`'s one page over the committed tables (benchmarks/results/*.jsonl):
its length, one run per machine and config, plots that fit a screen, the Max 1550's rows
labelled, `--history` as it was, the run choice, and docs/performance.md's tables equal
to the report's figures for the runs the page cites. CPU only, ~15 s (one report)."""
from __future__ import annotations

import glob
import os
import re
import struct

import pytest

from fusedmlp_xpu import cli
from fusedmlp_xpu.bench import report, report_data, report_intel, results

pytest.importorskip("matplotlib", reason="the report's plots need matplotlib (the report extra)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.jsonl")))
DATA = os.path.join(ROOT, "tests", "data")
FIXTURES = [os.path.join(DATA, "synthetic_bench_gpu.json"),
            os.path.join(DATA, "synthetic_bench_cpu.json")]
#: the issue's limits: a page of ~200 lines (this leaves room for a machine more), and
#: plots that fit a screen
MAX_LINES, MAX_PNG_WIDTH = 250, 3000


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The default report over every committed table, written once for this module."""
    out = tmp_path_factory.mktemp("report")
    docs = report.read(TABLES)
    path = report.write(docs, str(out))
    return {"docs": docs, "out": out, "md": open(path).read(),
            "full": open(os.path.join(out, report.APPENDIX)).read()}


def _png_size(path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


def _tables(md: str) -> dict[str, list[list[str]]]:
    """### config heading -> the rows (cells) of the table under it."""
    out, config = {}, None
    for line in md.splitlines():
        if line.startswith("### "):
            config = line[4:].split(":")[0]
            assert config not in out, f"config {config} appears twice"
            out[config] = []
        elif line.startswith("## "):
            config = None
        elif config and line.startswith("| ") and not line.startswith(("| source", "| ---")):
            out[config].append([c.strip() for c in line.strip("|").split(" | ")])
    return out


def test_the_default_report_is_one_page(page):
    lines = page["md"].count("\n")
    assert lines <= MAX_LINES, f"report.md has {lines} lines"
    assert f"]({report.APPENDIX})" in page["md"]
    # the appendix holds every record of the runs shown, their notes and disagreements
    for section in ("## Every record", "## Pass disagreement", "## Notes from the runs",
                    "## Published, not measured here"):
        assert section in page["full"], section


def test_each_standard_config_once_per_machine(page):
    tables = _tables(page["md"])
    assert set(tables) == set(report.STANDARD)
    for config, rows in tables.items():
        seen = [tuple(r[:3]) for r in rows]  # source (machine, backend), mode, dtype
        assert len(seen) == len(set(seen)), f"{config}: a source twice: {seen}"
        assert any(r[0].startswith("H200 measured") for r in rows), config
    assert any(r[0].startswith("CPU measured") for r in tables["narrow-w64"])
    machines = re.search(r"## Machines\n\n(.*?)\n\n", page["md"], re.S).group(1).splitlines()[2:]
    names = [m.split("|")[1].strip() for m in machines]
    assert len(names) == len(set(names)) and {"H200", "CPU", "MAX1550"} <= set(names)
    # one line per run used, and each machine's runs named once
    used = re.findall(r"^- `run ([^`]+)`", page["md"], re.M)
    assert len(used) == len(set(used))
    assert report_intel.find(page["docs"]).model_run in used


def test_no_png_is_wider_than_a_screen(page):
    pngs = sorted(page["out"].glob("*.png"))
    assert {f"{c}.png" for c in report.STANDARD} | {"summary.png"} <= {p.name for p in pngs}
    sizes = {p.name: _png_size(p) for p in pngs}
    wide = {n: s for n, s in sizes.items() if s[0] > MAX_PNG_WIDTH}
    assert not wide, wide
    assert 1000 <= sizes["summary.png"][0] <= 1300, sizes["summary.png"]  # read at 1,200 px
    for p in pngs:
        assert f"]({p.name})" in page["md"], f"{p.name} is not on the page"


def test_the_intel_rows_carry_their_labels(page):
    tables = _tables(page["md"])
    sources = {r[0] for rows in tables.values() for r in rows}
    for s in sources:
        assert ("measured (" in s and "not measured" not in s) or s.startswith("**"), s
        if "Max 1550" in s or "published" in s:
            assert s.startswith("**") and ("model, not measured" in s or "published" in s), s
    # the model rows are the committed model run's numbers, not typed
    model = report_intel.find(page["docs"]).model  # the newest model run of pvc.jsonl
    want = {r["config"]: report_data.fmt_ms(r["model_s"] * 1e3) for r in model["rows"]}
    for config, ms in want.items():
        row = next(r for r in tables[config] if r[0] == f"**{report_intel.MODEL}**")
        assert row[4] == ms, (config, row)
    paper = {(r[0], r[1]): r for r in tables["paper-table1"]}
    assert paper[(f"**{report_intel.PUBLISHED_MAX}**", "inference")][4] == "0.083"
    assert paper[(f"**{report_intel.PUBLISHED_H100}**", "inference")][4] == "0.236"
    assert "## Intel Max 1550" in page["md"] and "0 with spills" in page["md"]


def test_history_writes_todays_full_report(tmp_path, capsys):
    """`--history`: every run, as report.md was before the page (the committed copy of
    what it wrote from the fixtures), and the same three PNGs per config."""
    assert cli.main(["report", *FIXTURES, "--history", "--out", str(tmp_path)]) == 0
    got = (tmp_path / "report.md").read_text()
    got = re.sub(r"(Made by `fusedmlp report` on )\S+ \S+ UTC", r"\1DATE", got)
    assert got == open(os.path.join(DATA, "synthetic_history_report.md")).read()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "narrow-w64_floor.png", "narrow-w64_speedup.png", "narrow-w64_throughput.png"]
    assert not (tmp_path / report.APPENDIX).exists()


def _bench_doc(batches, date, backend="triton"):
    recs = [{"config": "narrow-w32", "N": n, "dtype": "float16", "mode": "inference",
             "backend": b, "timing": "python", "pass": 1, "median_ms": n / 1e6 * k,
             "rows_per_s": 1e6 / k, "floor_ms": n / 2e6, "x_floor": 2.0 * k}
            for n in batches for b, k in (("eager", 5.0), (backend, 1.0))]
    return {"schema": report_data.SCHEMA, "env": {"device": "NVIDIA H200", "vendor": "nvidia",
                                                  "date": date},
            "ceilings": {}, "notes": [], "records": recs}


def test_the_newest_complete_run_is_chosen(tmp_path):
    """Of complete runs, the one with every standard batch, then the newest; a run cut
    short (no run record) is not chosen unless named; ``--run`` chooses among those named."""
    table = str(tmp_path / "h200.jsonl")
    full = (2**16, 2**18, 2**20, 2**22)
    for run, batches, date, final in (("old", full, "2026-12-01T00:00:00+00:00", True),
                                      ("new", full, "2026-12-02T00:00:00+00:00", True),
                                      ("cut", full, "2026-12-03T00:00:00+00:00", False),
                                      ("one-batch", (2**22,), "2026-12-04T00:00:00+00:00", True)):
        results.append(table, results.to_records(_bench_doc(batches, date), run, final=final))
    docs = report.read([table])
    pick = lambda runs=None: report.select(report_data.machines(docs, runs), bool(runs))[  # noqa: E731
        ("h200", "narrow-w32", "inference", "float16")].run
    assert pick() == "new"
    assert pick(["old", "one-batch"]) == "old"
    assert pick(["cut"]) == "cut" and pick(["one-batch"]) == "one-batch"


def _page_tables(text: str, section: str) -> tuple[str | None, dict[str, list[tuple]]]:
    """docs/performance.md's ``section``: the run it cites first, and each table of times
    (its caption, the line above, says ", ms"), as caption -> [(label, cells)]."""
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    run = re.search(r"`run ([^`]+)`", body)
    out, caption = {}, None
    for line in body.splitlines():
        if line.endswith(":") and not line.startswith("|"):
            caption = line if ", ms" in line else None
        elif line.startswith("| ") and not line.startswith(("| config", "| ---")) and caption:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out.setdefault(caption, []).append((cells[0], cells[1:]))
    return (run.group(1) if run else None), out


def _ms(cell: str) -> tuple[float | None, float | None]:
    """'0.280 ms (1.10x)' -> (0.280, 1.10); '—' -> (None, None)."""
    m = re.match(r"([\d.]+) ms(?: \(([\d.]+)x\))?", cell)
    if not m:
        return None, None
    return float(m.group(1)), (float(m.group(2)) if m.group(2) else None)


def _close(page_value: float | None, value: float | None, text: str) -> bool:
    """The page's figure (printed as ``text``) is the report's, rounded to the digits the
    page prints."""
    if page_value is None or value is None:
        return page_value is None and value is None
    decimals = re.search(r"\.(\d+)", text)
    digits = len(decimals.group(1)) if decimals else 0
    return abs(page_value - value) <= 0.5 * 10 ** -digits + 1e-12


@pytest.mark.parametrize("section", ["Narrow MLPs", "Wide MLPs"])
def test_the_performance_page_says_what_the_report_says(page, section):
    """docs/performance.md's tables of fused, eager and compile times (and the narrow
    tables' multiple of the floor) equal the report's rows for the run the section cites
    (the wide tables' x bare and peak memory are not on the report's page)."""
    text = open(os.path.join(ROOT, "docs", "performance.md")).read()
    run, tables = _page_tables(text, section)
    assert run and tables, f"{section}: no run cited or no table found"
    picks = report.select(report_data.machines(page["docs"], [run]), named=True)
    checked, wrong = 0, []
    for caption, rows in tables.items():
        mode = "train" if "train" in caption.lower() else "inference"
        for label, cells in rows:
            config = label.split()[0]
            dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(label.split()[-1], "bfloat16")
            mine = [r for r in report.measured_rows(config, picks)
                    if (r.mode, r.dtype) == (mode, dtype)]
            assert len(mine) == 1, f"{label} {mode}: the report has {len(mine)} fused rows"
            r = mine[0]
            fused, x = _ms(cells[0])
            pairs = [(fused, r.fused_ms, cells[0]), (_ms(cells[1])[0], r.eager_ms, cells[1])]
            if len(cells) > 2 and "/" not in cells[2]:  # the wide train table: peak MB there
                pairs.append((_ms(cells[2])[0], r.compile_ms, cells[2]))
            if section == "Narrow MLPs":
                pairs.append((x, r.x_floor, cells[0].split("(")[1]))
            for want, got, cell in pairs:
                if not _close(want, got, cell.split(" ")[0]):
                    wrong.append(f"{caption} {label}: {cell} against the report's {got}")
                checked += 1
    assert not wrong, f"docs/performance.md {section} (run {run}): " + "; ".join(wrong)
    assert checked >= (40 if section == "Narrow MLPs" else 7)


def test_the_docs_show_the_committed_example():
    """docs/benchmarks.md's summary figure is the committed example's (benchmarks/report/,
    made with the default), and that example is one page."""
    example = os.path.join(ROOT, "benchmarks", "report")
    with open(os.path.join(example, "summary.png"), "rb") as a, \
            open(os.path.join(ROOT, "docs", "img", "report-summary.png"), "rb") as b:
        assert a.read() == b.read(), ("docs/img/report-summary.png is not "
                                      "benchmarks/report/summary.png: copy it over")
    md = open(os.path.join(example, report.PAGE)).read()
    assert md.count("\n") <= MAX_LINES and os.path.exists(os.path.join(example, report.APPENDIX))
    for png in re.findall(r"\]\(([^)]+\.png)\)", md):
        assert _png_size(os.path.join(example, png))[0] <= MAX_PNG_WIDTH, png
