"""The ``fusedmlp`` command's answers to user mistakes: one line on stderr naming the
argument, exit code 2, no traceback; ``info`` tells the truth about each backend here;
``profile`` flags numbers it cannot trust and keeps kineto's status lines off stderr."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from fusedmlp_xpu import cli
from fusedmlp_xpu.bench import profiling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "data", "synthetic_bench_cpu.json")


def _user_error(capsys, argv, argument):
    """cli.main(argv) fails as a user mistake: exit 2, one line naming ``argument``."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"fusedmlp {argv[0]}: error: ") and argument in lines[0], err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("command", ["profile", "bench"])
@pytest.mark.parametrize("batch", ["0", "-4", "many"])
def test_bad_batch(capsys, command, batch):
    _user_error(capsys, [command, "--batch", batch], "--batch")


@pytest.mark.parametrize("command", ["profile", "bench"])
@pytest.mark.parametrize("device", ["cuda", "xpu"])
def test_absent_device(capsys, command, device):
    mod = getattr(torch, device, None)
    if mod is not None and mod.is_available():
        pytest.skip(f"this machine has a {device} device")
    line = _user_error(capsys, [command, "--device", device], "--device")
    assert f"no {device} device" in line


@pytest.mark.parametrize("command", ["profile", "bench"])
def test_unknown_config(capsys, command):
    line = _user_error(capsys, [command, "--config", "narrow-w99"], "--config")
    assert "narrow-w64" in line  # the known names


def test_report_missing_or_foreign_json(capsys, tmp_path):
    out = str(tmp_path / "out")
    line = _user_error(capsys, ["report", str(tmp_path / "nope.json"), "--out", out], "results")
    assert "nope.json" in line
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something-else/1"}))
    line = _user_error(capsys, ["report", str(other), "--out", out], "results")
    assert "fusedmlp-bench/1" in line
    text = tmp_path / "notes.txt"
    text.write_text("not json")
    assert "not JSON" in _user_error(capsys, ["report", str(text), "--out", out], "results")


def test_unwritable_out(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = str(blocker / "sub")  # a folder below a file cannot be made, even by root
    _user_error(capsys, ["report", FIXTURE, "--out", bad], "--out")
    _user_error(capsys, ["bench", "--device", "cpu", "--out", os.path.join(bad, "b.json")],
                "--out")
    _user_error(capsys, ["profile", "--device", "cpu", "--json", os.path.join(bad, "p.json")],
                "--json")
    _user_error(capsys, ["profile", "--device", "cpu", "--trace-dir", bad], "--trace-dir")


def _run(args, **env):
    return subprocess.run([sys.executable, "-m", "fusedmlp_xpu.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT, **env})


def test_info_flags_a_bad_backend_variable():
    """info still prints everything, flags the variable in the backends table, and exits 2
    with one error line, since every call of the op would raise."""
    proc = _run(["info"], FUSEDMLP_BACKEND="nonsense")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "backends" in proc.stdout and "example: FusedMLP" in proc.stdout
    assert "FUSEDMLP_BACKEND: INVALID" in proc.stdout and "'nonsense'" in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("fusedmlp info: error: FUSEDMLP_BACKEND") and "nonsense" in line


@pytest.mark.parametrize("interpret", ["0", "1"])
def test_info_says_triton_on_cpu_needs_the_interpreter(interpret, capsys, monkeypatch):
    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        pytest.skip("a GPU is present: triton runs there")
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.delenv("FUSEDMLP_BACKEND", raising=False)
    assert cli.main(["info"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines()
               if ln.startswith("  triton ")]  # the backends table, not the example
    if "not importable" in line:
        pytest.skip("triton not installed")
    if interpret == "1":
        assert " yes " in line and "interpreter: testing only" in line
    else:
        assert " no " in line and "TRITON_INTERPRET=1" in line


def test_info_names_the_training_backend_when_it_differs(capsys, monkeypatch):
    """With an inference-only backend chosen for the example, info also names the backend
    that takes training calls."""
    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        pytest.skip("the example runs on the GPU")
    from fusedmlp_xpu import dispatch
    from fusedmlp_xpu.backends.reference import ReferenceBackend

    class InferenceOnly(ReferenceBackend):
        name = "infer-only"
        trains = False

    monkeypatch.setitem(dispatch.REGISTRY, "infer-only", InferenceOnly())
    monkeypatch.setitem(dispatch.ORDER, "cpu", ("infer-only", "reference"))
    monkeypatch.delenv("FUSEDMLP_BACKEND", raising=False)
    monkeypatch.setattr(dispatch, "_decisions", {})
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "chosen: infer-only" in out and "training calls: reference" in out


def test_help_points_to_files_in_the_repo(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in ("BENCHMARKS.md",):
        assert name not in out
    for sub in ("profile", "bench"):
        with pytest.raises(SystemExit):
            cli.main([sub, "--help"])
        assert "BENCHMARKS.md" not in capsys.readouterr().out


def test_profile_times_the_variants_in_turn(monkeypatch):
    """profiling._time_ms takes the variants' timed repeats in turn, the order rotating each
    round (a drifting host then slows every variant alike), and reports each one's median
    ms per call over its own back-to-back calls."""
    monkeypatch.setattr(profiling, "_REPEATS", 3)
    monkeypatch.setattr(profiling, "_REPEAT_S", 0.002)
    order = []

    def variant(name, seconds):
        def call():
            order.append(name)
            time.sleep(seconds)
        return call
    got = profiling._time_ms({"a": variant("a", 2e-3), "b": variant("b", 1e-4),
                              "c": variant("c", 1e-4)}, torch.device("cpu"))
    runs = [order[0]]  # the names of consecutive runs of calls
    for name in order[1:]:
        if name != runs[-1]:
            runs.append(name)
    assert runs == ["a", "b", "c"] + ["a", "b", "c", "b", "c", "a", "c", "a", "b"], runs
    # ms per call (a sleep never returns early; a busy host only makes it longer)
    assert got["a"][0] >= 1.95 and got["b"][0] >= 0.095 and got["c"][0] >= 0.095
    assert all(spread >= 0 for _, spread in got.values())


def test_spread_ignores_one_stalled_repeat():
    """The spread that flags a timing is that of the repeats the median comes from: one
    stalled repeat (or one lucky one) of five is not noise in the median; two are."""
    assert profiling._spread([1.0, 1.0, 1.05, 1.1, 9.0]) == pytest.approx(0.1)
    assert profiling._spread([0.2, 1.0, 1.0, 1.0, 1.0]) == pytest.approx(0.0)
    assert profiling._spread([1.0, 1.0, 1.5, 9.0, 9.0]) == pytest.approx(8.0)
    assert profiling._spread([1.0, 2.0]) == pytest.approx(1.0)  # too few to drop any


def test_untrusted_numbers_are_flagged():
    """Device time above the wall time of the same profiled calls, or repeats far apart,
    give an UNTRUSTED note and a marked cell: never an inconsistent device ms without a
    word. Device time above the unprofiled wall time alone is no fault (the profiler's
    own cost on every op): eager's row below is trusted."""
    r = profiling.ProfileResult("narrow-w32", (64, 32, 64), 64, "cpu", "float32", False, [
        profiling.Row("eager", "eager nn.Linear", fwd_ms=1.0, device_ms=2.3, profiled_ms=2.6,
                      spread=0.05),
        profiling.Row("compile", "torch.compile", fwd_ms=1.0, device_ms=2.0, profiled_ms=1.2,
                      spread=0.05),
        profiling.Row("fused", "FusedMLP[reference]", fwd_ms=1.0, device_ms=0.5,
                      profiled_ms=0.6, spread=0.9)])
    notes = profiling._untrusted(r)
    assert len(notes) == 2, notes
    assert "torch.compile" in notes[0] and "above the wall time of the same profiled" \
        in notes[0] and "(1.200 per call)" in notes[0]
    assert "FusedMLP[reference]" in notes[1] and "90% apart" in notes[1]
    r.notes += notes
    table = profiling.format_table(r)
    assert "2.000!" in table and "2.300!" not in table and "UNTRUSTED" in table


def test_profile_on_a_quiet_cpu_is_trusted(monkeypatch):
    """A real run: every variant's device time is within the wall time of its own
    profiled calls, so the consistency check raises no UNTRUSTED note (repeats far apart
    may, on a busy host: those are left out here, being noise rather than a fault)."""
    monkeypatch.setattr(profiling, "_compile", lambda m, mode: torch.compile(m, backend="eager"))
    monkeypatch.setattr(profiling, "SPREAD_LIMIT", float("inf"))
    r = profiling.run_profile("narrow-w32", batch=512, device="cpu")
    assert all(row.ok for row in r.rows), [row.reason for row in r.rows]
    for row in r.rows:
        assert 0 < row.device_ms <= 1.05 * row.profiled_ms, row
    assert not [n for n in r.notes if "UNTRUSTED" in n], r.notes
    assert "!" not in profiling.format_table(r).split("note:")[0]


def test_kineto_status_lines_are_held_back(capfd):
    """torch's profiler (kineto) writes ``USDT: ... profiler_start/stop`` to stderr on every
    run; profile keeps them off, and lets anything else through."""
    with profiling._quiet_kineto():
        with torch.profiler.profile():
            torch.ones(4).sum()
        os.write(2, b"a real warning\n")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "USDT" not in err
    assert "a real warning" in err


# --- the help texts --------------------------------------------------------------------
def test_top_level_help_is_for_users(capsys):
    """`fusedmlp --help` opens with what the command is for and names every subcommand;
    no internal docstring, no reStructuredText markup."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    description = out.split("positional arguments")[0]
    for name in cli.COMMANDS:
        assert name in description, f"the description does not name {name!r}"
    assert "``" not in out and "COMMANDS" not in out and "register" not in out


def _bench_parser():
    import argparse

    p = argparse.ArgumentParser()
    cli._bench.add_arguments(p)
    return p


@pytest.mark.parametrize("flag", ["--config", "--batch", "--dtype", "--mode", "--passes",
                                  "--repeats", "--suite", "--device", "--out"])
def test_bench_flags_have_help_and_defaults(flag):
    (action,) = [a for a in _bench_parser()._actions if flag in a.option_strings]
    assert action.help and "default" in action.help, f"{flag}: {action.help!r}"


def test_bench_help_points_to_the_protocol(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "docs/benchmarks.md" in out and "README.md" not in out


def test_bench_takes_every_config_profile_takes():
    import argparse

    p = argparse.ArgumentParser()
    profiling.add_arguments(p)
    (profile_config,) = [a for a in p._actions if "--config" in a.option_strings]
    assert "wide-gelu" in profile_config.choices
    for name in profile_config.choices:
        assert _bench_parser().parse_args(["--config", name]).config == [name]


# --- bench: where the run goes ----------------------------------------------------------
@pytest.fixture
def quick_bench(monkeypatch, tmp_path):
    """bench's harness with every case timed as a stub (the cases it is asked for are
    kept in ``cases``), run from an empty folder."""
    from fusedmlp_xpu.bench import narrow

    cases = []

    def bench_one(cfg, N, dtype_name, mode, *args, **kw):
        cases.append((cfg, N, dtype_name, mode))
        return [{"config": cfg.name, "N": N, "dtype": dtype_name, "mode": mode,
                 "backend": "eager", "timing": "python", "pass": 1, "median_ms": 1.0,
                 "min_ms": 1.0, "max_ms": 1.0, "rows_per_s": N * 1e3, "tflops": None,
                 "floor_ms": None, "x_floor": None, "max_rel_error": None,
                 "peak_mem_MB": None}]
    monkeypatch.setattr(narrow, "bench_one", bench_one)
    monkeypatch.setattr(narrow, "host_overhead_us", lambda *a, **k: (1.0, 1.0))
    monkeypatch.chdir(tmp_path)
    return cases


def test_bench_without_out_writes_nothing(quick_bench, tmp_path, capsys):
    assert cli.main(["bench", "--config", "nerf-density", "--batch", "8", "--mode",
                     "inference", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "nerf-density" in out and "not recorded: add --out" in out
    assert list(tmp_path.iterdir()) == [], "bench wrote files without --out"
    assert [(c.name, n) for c, n, _, _ in quick_bench] == [("nerf-density", 8)]


def test_bench_with_out_appends_and_says_where(quick_bench, tmp_path, capsys):
    from fusedmlp_xpu.bench import results

    table = tmp_path / "t" / "cpu.jsonl"
    assert cli.main(["bench", "--config", "narrow-w32", "--batch", "8", "--mode", "train",
                     "--device", "cpu", "--out", str(table), "--run", "r1"]) == 0
    assert f"appended run r1 to {table}" in capsys.readouterr().out
    assert results.documents(results.read(str(table)))["r1"]["records"][0]["config"] \
        == "narrow-w32"


def test_bench_runs_wide_gelu(quick_bench):
    """wide-gelu, which profile takes, is a config of bench's harness too: its net as the
    shared table gives it (GELU-tanh, bias)."""
    assert cli.main(["bench", "--config", "wide-gelu", "--batch", "2", "--device", "cpu"]) == 0
    modes = sorted(m for _, _, _, m in quick_bench)
    assert modes == ["inference", "train"]
    cfg = quick_bench[0][0]
    assert cfg.widths == (4096, 16384, 4096) and cfg.activation == "gelu_tanh" and cfg.bias


def test_bench_run_id_needs_a_table(capsys):
    _user_error(capsys, ["bench", "--device", "cpu", "--run", "r1"], "--run")


def test_device_scripts_name_their_tables():
    """benchmarks/h200_run.sh records every `fusedmlp bench` it runs: each passes --out
    (without it, bench prints and writes nothing)."""
    script = open(os.path.join(ROOT, "benchmarks", "h200_run.sh")).read()
    calls = [ln for ln in script.splitlines() if "fusedmlp_xpu.cli bench" in ln]
    assert calls, "no fusedmlp bench call found in h200_run.sh"
    for ln in calls:
        assert '--out "$T"' in ln, f"h200_run.sh: a bench run recorded nowhere: {ln.strip()}"
    ci = open(os.path.join(ROOT, "ci", "run.sh")).read()
    calls = re.findall(r"fusedmlp_xpu\.cli bench (.*)", ci)
    assert calls, "no fusedmlp bench call found in ci/run.sh"
    for args in calls:
        out = re.search(r"--out \"?([^\"\s]+)", args)
        assert out and out.group(1).endswith(".jsonl"), f"ci/run.sh: bench {args}"


# --- explain ------------------------------------------------------------------------------
def test_explain_a_net_given_on_the_command_line(capsys):
    import fusedmlp_xpu as fm

    assert cli.main(["explain", "--widths", "64,32,32,16", "--activation", "gelu",
                     "--bias", "--dtype", "float32", "--device", "cpu", "--train"]) == 0
    out = capsys.readouterr().out
    spec = fm.MLPSpec((64, 32, 32, 16), "gelu", "none", True, torch.float32)
    assert out.strip() == str(fm.explain(spec, torch.empty(1, 64), train=True)).strip()
    assert "widths [64, 32, 32, 16]" in out and "for training" in out and "chosen:" in out


def test_explain_a_config(capsys):
    assert cli.main(["explain", "--config", "wide-gelu", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "widths [4096, 16384, 4096]" in out and "gelu_tanh" in out and "bias True" in out


def test_explain_a_forced_backend_says_why_not(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert cli.main(["explain", "--device", "cpu", "--backend", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "chosen: NONE (forced by 'cuda')" in out


@pytest.mark.parametrize("argv, argument", [
    (["--widths", "64"], "--widths"),
    (["--widths", "64,0,16"], "--widths"),
    (["--widths", "a,b"], "--widths"),
    (["--config", "narrow-w64", "--widths", "64,64"], "--widths"),
    (["--config", "narrow-w64", "--activation", "gelu"], "--activation"),
    (["--config", "narrow-w64", "--bias"], "--bias"),
    (["--activation", "swish"], "--activation"),
    (["--backend", "nope"], "--backend"),
    (["--dtype", "float64"], "--dtype"),
])
def test_explain_bad_input(capsys, argv, argument):
    _user_error(capsys, ["explain", "--device", "cpu", *argv], argument)
