"""``fusedmlp report``: results tables -> one page a reader can use (DIR/report.md), its
appendix (DIR/report-full.md) and PNG plots; ``--history``: every run (report_history.py).

Which runs: per (machine, config, mode, dtype) the newest complete run, complete meaning
a run record written (not cut short) and the fused op and eager timed at every standard
batch of the config (configs.py); where no run of a machine is, the one that timed the
most of them, then the newest. ``--run`` names the runs to choose from instead (and may
name the Max 1550's model or ISA run).

The page, vendors side by side: the machines and the runs used (a line each); a summary
figure; per standard config one table whose rows are the sources (each machine measured,
the Max 1550's static model labelled "model, not measured", Intel's and tiny-cuda-nn's
published figures labelled "published"), at the largest batch each has, and one plot;
the Max 1550's listing; the wide sweeps; the targets, one line each. Every number comes
from the tables or from pvc.py's published table (STYLE.md: reports are made from data).
"""
from __future__ import annotations

import datetime as _dt
import os
from collections import defaultdict

from . import report_history, report_intel, targets
from .configs import CONFIGS
from .report_data import (NOT_COMPETING, SCHEMA, Machine, documents, fmt,
                          fmt_ms, machines, md_table, pow2, spread_table, when)
from .report_intel import Row
from .report_plots import config_figure, measured_lines, summary_figure, sweep_plot

#: the standard configs (docs/benchmarks.md), in its order; wide-swiglu is not in
#: configs.py (a gated MLP) and takes wide-gelu's batches, the wide suite's M
STANDARD = tuple(CONFIGS) + ("wide-swiglu",)
MODES = ("inference", "train")
DTYPES = ("float16", "bfloat16", "float32")
SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
PAGE, APPENDIX = "report.md", "report-full.md"


def standard_batches(config: str) -> tuple[int, ...] | None:
    if config in CONFIGS:
        return CONFIGS[config].batches
    if config == "wide-swiglu":
        return CONFIGS["wide-gelu"].batches
    return None


# --- which runs ------------------------------------------------------------------------
def _coverage(m: Machine, config: str, mode: str, dtype: str) -> int | None:
    """How many standard batches (every batch, for a config outside the standard ones)
    ``m`` timed from Python for both a fused backend and eager; None if none."""
    fused, eager = set(), set()
    for r in m.records:
        if (r["config"], r["mode"], r["dtype"], r["timing"]) == (config, mode, dtype, "python"):
            if r["backend"] == "eager":
                eager.add(r["N"])
            elif r["backend"] not in NOT_COMPETING:
                fused.add(r["N"])
    both = fused & eager
    if not both:
        return None
    std = standard_batches(config)
    return len(both & set(std)) if std else len(both)


def _order(k: tuple) -> tuple:
    """A (machine, config, mode, dtype) key's place: inference first, fp16, bf16, fp32."""
    return (k[0], k[1], MODES.index(k[2]) if k[2] in MODES else len(MODES),
            DTYPES.index(k[3]) if k[3] in DTYPES else len(DTYPES))


def select(runs: list[Machine], named: bool = False) -> dict[tuple, Machine]:
    """(machine, config, mode, dtype) -> the run the page shows for it: of the complete
    runs (every run, where ``named``), the one that timed the most standard batches, then
    the newest (then the later in the tables)."""
    best: dict[tuple, tuple] = {}
    for order, m in enumerate(runs):
        if not (m.complete or named):
            continue
        for config, mode, dtype in {(r["config"], r["mode"], r["dtype"]) for r in m.records}:
            cover = _coverage(m, config, mode, dtype)
            if cover is None:
                continue
            k = (m.machine, config, mode, dtype)
            rank = (cover, when(m), order)
            if k not in best or rank > best[k][0]:
                best[k] = (rank, m)
    # in one order, whatever order a set's iteration gave (the page's and the appendix's)
    return {k: best[k][1] for k in sorted(best, key=_order)}


def _machine_order(keys) -> list[str]:
    """GPUs by name, then the CPU."""
    return sorted(set(keys), key=lambda k: (k == "cpu", k))


def short_name(machine: str) -> str:
    return "CPU" if machine == "cpu" else machine.upper()


def _records(m: Machine, config: str, mode: str, dtype: str, raw: bool = False) -> list[dict]:
    return [r for r in (m.raw if raw else m.records)
            if (r["config"], r["mode"], r["dtype"]) == (config, mode, dtype)]


# --- a config's rows -------------------------------------------------------------------
def measured_rows(config: str, picks: dict) -> list[Row]:
    """A row per machine, mode, dtype and fused backend, at the largest batch where the
    chosen run timed that backend and eager from Python."""
    out = []
    for mk in _machine_order(k[0] for k in picks if k[1] == config):
        for mode in MODES:
            for dtype in DTYPES:
                m = picks.get((mk, config, mode, dtype))
                if m is None:
                    continue
                at = defaultdict(dict)
                for r in _records(m, config, mode, dtype):
                    if r["timing"] == "python":
                        at[r["N"]][r["backend"]] = r
                n = max(n for n, b in at.items()
                        if "eager" in b and set(b) - set(NOT_COMPETING))
                b = at[n]
                for backend in sorted(set(b) - set(NOT_COMPETING)):
                    r = b[backend]
                    out.append(Row(f"{short_name(mk)} measured ({backend})", "measured", mode,
                                   dtype, n, r["median_ms"], b["eager"]["median_ms"],
                                   b["compile"]["median_ms"] if "compile" in b else None,
                                   r.get("x_floor"), machine=mk))
    return out


def config_rows(config: str, picks: dict, intel: report_intel.Intel) -> list[Row]:
    return measured_rows(config, picks) + report_intel.rows(config, intel)


def _cells(r: Row) -> list[str]:
    src = f"**{r.source}**" if r.kind != "measured" else r.source
    return [src, r.mode, SHORT.get(r.dtype, r.dtype), report_intel.rows_label(r.rows),
            fmt_ms(r.fused_ms), fmt_ms(r.eager_ms), fmt_ms(r.compile_ms),
            "—" if r.x_floor is None else f"{r.x_floor:.2f}x",
            "—" if r.vs_eager is None else f"{r.vs_eager:.2f}x"]


HEAD = ["source", "mode", "dtype", "rows", "fused ms", "eager ms", "compile ms",
        "x floor", "vs eager"]


def _shape(config: str) -> str:
    c = CONFIGS.get(config)
    if c is None:
        gated = "down(silu(gate(x)) * up(x)), d 4096, hidden 14336"
        return gated if config == "wide-swiglu" else ""
    if c.regime == "wide":
        return f"{c.in_features} -> {c.hidden_features} -> {c.out_features}, {c.activation}"
    return (f"{c.in_features} -> {c.hidden_features} x {c.hidden_layers} -> {c.out_features}, "
            f"{c.activation}")


# --- figures ---------------------------------------------------------------------------
def _intel_column(config: str, rows: list[Row]) -> dict[str, list[dict]]:
    """The Max 1550's panel lines: its floor, and a point per model or published row."""
    lines: dict[str, list[dict]] = defaultdict(list)
    style = {report_intel.MODEL: {"marker": "D", "color": "#9467bd"},
             report_intel.CALIBRATED: {"marker": "D", "color": "#9467bd", "mfc": "none"},
             report_intel.PUBLISHED_MAX: {"marker": "*", "color": "k", "ms": 11}}
    for r in rows:
        if r.machine == "max1550" and r.fused_ms:
            lines[r.mode].append({"x": [r.rows], "y": [r.rows / r.fused_ms * 1e3],
                                  "label": r.source, "kw": {"ls": "none", **style[r.source]}})
    if lines.get("inference"):
        for (label, level), ls in zip(report_intel.floor_levels(config).items(), ("--", ":")):
            lines["inference"].append({"level": level, "label": f"Max 1550 floor bf16, {label}",
                                       "kw": {"ls": ls, "color": "k", "lw": 0.9}})
    return dict(lines)


def _config_plot(config: str, picks: dict, rows: list[Row], out_dir: str) -> str | None:
    columns = []
    for mk in _machine_order(k[0] for k in picks if k[1] == config):
        by_mode = {mode: measured_lines([r for dt in DTYPES if (mk, config, mode, dt) in picks
                                         for r in _records(picks[(mk, config, mode, dt)],
                                                           config, mode, dt)])
                   for mode in MODES}
        device = next(m.env.get("device") for k, m in picks.items() if k[0] == mk)
        label = f"CPU ({device})" if mk == "cpu" else device  # a CPU's device is "x86_64"
        columns.append((f"{label} (measured)", {k: v for k, v in by_mode.items() if v}))
    intel = _intel_column(config, rows)
    if intel:
        columns.append((f"{report_intel.DEVICE} (model, published)", intel))
    if not columns:
        return None
    modes = [md for md in MODES if any(md in c[1] for c in columns)]
    return config_figure(f"{config}: rows/s against batch, roofline floor as a level "
                         "(each panel its own scale)", columns, modes, out_dir,
                         f"{config}.png")


def _summary(by_config: dict[str, list[Row]], out_dir: str) -> str | None:
    def groups(mode: str, value) -> list[tuple[str, dict, str]]:
        out: dict[str, dict] = defaultdict(dict)
        hatch: dict[str, str] = {}
        for config, rows in by_config.items():
            for r in rows:
                v = value(r)
                if r.mode != mode or v is None:
                    continue
                src = (f"{short_name(r.machine)}\nmeasured" if r.kind == "measured"
                       else report_intel.GROUPS[r.source])
                lo, hi = out[src].get(config, (v, v))
                out[src][config] = (min(lo, v), max(hi, v))
                hatch[src] = "" if r.kind == "measured" else ("//" if r.kind == "model" else "..")
        return [(src, vals, hatch[src]) for src, vals in out.items()]

    panels = [(f"{mode}: fused speed-up against eager, largest batch (bar: the lowest over "
               "dtypes and fused backends, line: up to the highest)", "speed-up (x)",
               groups(mode, lambda r: r.vs_eager)) for mode in MODES]
    panels.append(("inference: time over that machine's roofline floor (1 = at the floor; "
                   "hatched: model or published, not measured)", "x floor",
                   groups("inference", lambda r: r.x_floor)))
    return summary_figure(panels, list(by_config), out_dir, "summary.png")


# --- the page's sections ---------------------------------------------------------------
def _machines_section(picks: dict, intel: report_intel.Intel) -> list[str]:
    rows, used = [], defaultdict(set)
    for k, m in picks.items():
        used[k[0]].add(m.run)
    runs = {m.run: m for m in picks.values()}
    for mk in _machine_order(used):
        ms = sorted((runs[r] for r in used[mk]), key=when)
        e, c = ms[-1].env, [m.ceilings for m in ms]
        copy = [x["copy_GBps"] / 1e3 for x in c if x.get("copy_GBps")]
        mm = [v for x in c for v in (x.get("matmul_TFLOPs") or {}).values() if v]
        rows.append([short_name(mk), e.get("device") or "—",
                     f"{e.get('torch', '—')} / {e.get('triton') or '—'}",
                     e.get("driver") or "—",
                     _span(copy, ".2f"), _span(mm, ".0f"), str(len(ms))])
    if intel.model is not None or intel.isa is not None:
        from .pvc import GEMM_TFLOPS, HBM_TB_S

        rows.append(["MAX1550", f"{report_intel.DEVICE}: nothing run, static model and "
                     "published figures", "—", "—", f"{HBM_TB_S} (spec)",
                     f"{GEMM_TFLOPS['bf16']:.0f} (GEMM, Aurora)",
                     str(sum(1 for r in (intel.model_run, intel.isa_run) if r))])
    md = md_table(["machine", "device", "torch / triton", "driver", "copy TB/s",
                   "matmul TFLOP/s", "runs"], rows)
    md += ["", "Runs used, a line each (what the page takes from each):", ""]
    for m in sorted(runs.values(), key=lambda m: (m.machine, when(m))):
        md.append(f"- {_run_line(m, picks)}")
    for run, what in ((intel.model_run, "Max 1550 static model"),
                      (intel.isa_run, "Max 1550 ISA listing")):
        if run:
            md.append(f"- `run {run}`: {what}")
    return md


def _span(vals: list[float], spec: str) -> str:
    """lowest-highest, one figure where they print the same, — for none."""
    if not vals:
        return "—"
    lo, hi = format(min(vals), spec), format(max(vals), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def _run_line(m: Machine, picks: dict) -> str:
    """``run ID`` (machine, date, commit, switches): each config it gives, with the modes
    and dtypes where it gives only some of those the page has for that config; a sweep's
    shapes counted."""
    mine, total = defaultdict(list), defaultdict(int)
    for k in sorted((k for k in picks if k[0] == m.machine), key=_order):
        total[k[1]] += 1
        if picks[k] is m:
            mine[k[1]].append(f"{k[2]} {SHORT.get(k[3], k[3])}")
    parts = [c if len(mine[c]) == total[c] else f"{c} ({', '.join(mine[c])})"
             for c in sorted(mine, key=lambda c: (c not in STANDARD, c)) if ":" not in c]
    shapes = [c for c in mine if ":" in c]
    if shapes:
        families = ", ".join(sorted({c.split(":")[0] for c in shapes}))
        parts.append(f"sweeps of {len(shapes)} shapes ({families})")
    extra = [m.date[:10], f"commit {m.commit[:7]}" if m.commit else ""]
    extra += [f"{k}={v}" for k, v in sorted((m.env.get("switches") or {}).items())]
    return (f"`run {m.run}` ({short_name(m.machine)}, {', '.join(x for x in extra if x)}): "
            + "; ".join(parts))


def _targets_section(picks: dict) -> list[str]:
    """A line per target and machine: each config's newest status, its range, its runs."""
    lines: dict[tuple, list[str]] = defaultdict(list)
    runs_of: dict[tuple, set] = defaultdict(set)
    for mk in _machine_order(k[0] for k in picks):
        if mk == "cpu":  # the targets are the GPUs' (targets.py)
            continue
        for mode in MODES:
            chosen = {k: m for k, m in picks.items() if k[0] == mk and k[2] == mode}
            recs = [r for (_, c, md, dt), m in chosen.items()
                    for r in _records(m, c, md, dt, raw=True)]
            for v in targets.check(recs):
                text = f"{v.config} {v.status} ({_span(v.python or v.device, '#.3g')} {v.unit})"
                lines[(v.target, mk)].append(f"**{text}**" if v.status == "missed" else text)
                runs_of[(v.target, mk)] |= {m.run for (_, c, _, _), m in chosen.items()
                                            if c == v.config}
    if not lines:
        return ["No target applies to the runs shown."]
    return md_table(["target", "machine", "status by config (range over dtypes, batches, "
                     "passes)", "runs"],
                    [[t, short_name(mk), "; ".join(v),
                      ", ".join(f"`{r}`" for r in sorted(runs_of[(t, mk)]))]
                     for (t, mk), v in lines.items()])


def _sweeps(picks: dict, out_dir: str) -> list[str]:
    """The wide sweeps (configs named config:d x hidden), one figure per machine."""
    md = []
    for mk in _machine_order(k[0] for k in picks if ":" in k[1]):
        chosen = {k: m for k, m in picks.items() if k[0] == mk and ":" in k[1]}
        recs = [r for (_, c, mode, dt), m in chosen.items() for r in _records(m, c, mode, dt)]
        first = next(iter(chosen.values()))
        # the machine's chosen sweep records as one run, named by the machine (its PNG)
        pseudo = Machine(first.env.get("device") or mk, mk, first.env, {}, [], recs)
        f = sweep_plot(pseudo, out_dir)
        if f:  # its runs are in the Machines section's list
            md += [f"![{pseudo.label}: fused against eager by M]({f})", ""]
    return md


def render(docs: list, out_dir: str, runs: list[str] | None = None) -> tuple[str, str]:
    """Write the plots into out_dir; return the page's and the appendix's Markdown."""
    bench = machines(docs, runs, also=report_intel.SCHEMAS)
    intel = report_intel.find(docs, runs)
    picks = select(bench, named=bool(runs))
    by_config = {c: config_rows(c, picks, intel) for c in STANDARD}
    by_config = {c: rs for c, rs in by_config.items() if rs}
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    other = len(bench) - len({m.run for m in picks.values()})
    md = ["# fusedmlp benchmark report: vendors side by side", "",
          f"Made by `fusedmlp report` on {now}. Per machine, config, mode and dtype, the "
          "newest complete run (`--run` names others; `--history` shows every run, "
          f"{other} more here). **Measured** rows are runs of this package; **model** rows "
          "are a static model of the Max 1550 kernels, not a measurement; **published** "
          "rows are other people's figures, not measured here. Every record, the pass "
          f"disagreements and the runs' notes: [{APPENDIX}]({APPENDIX}).", "",
          "## Machines", ""]
    md += _machines_section(picks, intel)
    summary = _summary(by_config, out_dir)
    if summary:
        md += ["", "## Summary", "", f"![fused speed-up against eager and time over the floor, "
               f"per config and source]({summary})"]
    md += ["", "## By config", "",
           "At the largest batch each source has (`rows`). `x floor`: time / that machine's "
           "roofline floor, max(FLOPs / matmul rate, bytes / copy rate), its own ceilings; "
           "`vs eager`: eager's time / fused time. Faster of two passes."]
    for config, rows in by_config.items():
        md += ["", f"### {config}: {_shape(config)}", ""]
        md += md_table(HEAD, [_cells(r) for r in rows])
        if any(r.source == report_intel.PUBLISHED_H100 for r in rows):
            md += ["", f"Published: {report_intel.SOURCE}."]
        plot = _config_plot(config, picks, rows, out_dir)
        if plot:
            md += ["", f"![{config}: rows/s against batch]({plot})"]
    md += ["", "## Intel Max 1550: the kernels' listing and model (not measured)", ""]
    md += report_intel.listing_section(intel)
    sweeps = _sweeps(picks, out_dir)
    if sweeps:
        md += ["", "## Wide sweeps: fused against eager by M", "",
               "Eager time / fused time, paired batch by batch (below 1: fused slower), per "
               "machine the newest run of each shape, mode and dtype.", ""]
        md += sweeps[:-1]
    md += ["", "## Targets", "",
           "The protocol's targets (`fusedmlp_xpu/bench/targets.py`) on the runs above, every "
           "case and pass; `met on device time`: met by the CUDA-graph replay, not from Python."
           , ""]
    md += _targets_section(picks)
    return "\n".join(md) + "\n", _appendix(picks, intel, now)


def _appendix(picks: dict, intel: report_intel.Intel, now: str) -> str:
    """Everything the page leaves out, for the same runs."""
    chosen: dict[str, list[tuple]] = defaultdict(list)
    runs = {}
    for k, m in picks.items():
        chosen[m.run].append(k)
        runs[m.run] = m
    md = [f"# fusedmlp benchmark report: appendix of [{PAGE}]({PAGE})", "",
          f"Made by `fusedmlp report` on {now}, for the runs of the page.", "",
          "## Every record", "",
          "The records the page chose (per machine, config, mode and dtype, one run), the "
          "faster of two passes.", ""]
    head = ["machine", "run", "config", "mode", "dtype", "N", "backend", "timing", "median ms",
            "rows/s", "TFLOP/s", "x floor", "max rel err", "peak MB"]
    body = []
    for k in sorted(picks):
        m = picks[k]
        for r in sorted(_records(m, *k[1:]), key=lambda r: (r["N"], r["backend"], r["timing"])):
            body.append([short_name(k[0]), m.run, r["config"], r["mode"],
                         SHORT.get(r["dtype"], r["dtype"]), pow2(r["N"]), r["backend"],
                         r["timing"], fmt_ms(r["median_ms"]), fmt(float(r["rows_per_s"])), fmt(r.get("tflops")), fmt(r["x_floor"]),
                         fmt(r.get("max_rel_error"), 2), fmt(r.get("peak_mem_MB"), 4)])
    md += md_table(head, body)
    host = [(m, r) for run, m in runs.items() for r in m.host
            if (m.machine, r["config"], r["mode"], r["dtype"]) in chosen[run]]
    if host:
        md += ["", "## Host time of one call at 1 row", ""]
        md += md_table(["run", "config", "dtype", "backend", "us per call", "one F.linear, us"],
                       [[m.run, r["config"], r["dtype"], r["backend"],
                         f"{r.get('host_us', r['median_ms'] * 1e3):.1f}",
                         f"{r['host_us_one_linear']:.1f}" if r.get("host_us_one_linear") else "-"]
                        for m, r in host])
    spread = [(m, a, b, s) for run, m in sorted(runs.items()) for a, b, s in m.spread
              if (m.machine, a["config"], a["mode"], a["dtype"]) in chosen[run]]
    md += ["", "## Pass disagreement", ""]
    md += spread_table("run", [(m.run, a, b, s) for m, a, b, s in spread])
    md += ["", "## Notes from the runs", ""]
    md += [f"- `{m.run}`: {n}" for run, m in sorted(runs.items()) for n in m.notes] or ["None."]
    md += [""] + report_intel.appendix(intel)
    return "\n".join(md) + "\n"


def read(paths: list[str], runs: list[str] | None = None, history: bool = False) -> list:
    """The runs of the tables and files at ``paths``, checked: bench runs (or, for the
    page, a Max 1550 run) present, every ``runs`` named there. ValueError says what is
    wrong, naming ``--run`` where a named run is."""
    docs = documents(list(paths))
    if history:
        found = machines(docs, runs)
    else:
        found = (machines(docs, runs, also=report_intel.SCHEMAS)
                 or report_intel.find(docs, runs).model)
    if not found:
        raise ValueError(f"results: no run of schema {SCHEMA!r} in {', '.join(map(str, paths))}")
    return docs


def write(docs: list, out_dir: str, runs: list[str] | None = None, history: bool = False) -> str:
    """The page (out_dir/report.md, with report-full.md and PNGs) from ``read``'s runs, or
    with ``history`` every run as report_history renders them; returns report.md's path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, PAGE)
    if history:
        text = report_history.render(machines(docs, runs), out_dir)
    else:
        text, full = render(docs, out_dir, runs)
        with open(os.path.join(out_dir, APPENDIX), "w") as f:
            f.write(full)
    with open(path, "w") as f:
        f.write(text)
    return path


def write_report(paths: list[str], out_dir: str, runs: list[str] | None = None,
                 history: bool = False) -> str:
    """``read`` then ``write``: the report of the tables at ``paths`` in ``out_dir``."""
    return write(read(paths, runs, history), out_dir, runs, history)
