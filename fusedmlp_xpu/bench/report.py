"""``fusedmlp report``: bench runs from one or more machines -> DIR/report.md + PNG plots.

The runs come from the results tables (``benchmarks/results/<machine>.jsonl``, see
results.py; ``--run`` picks runs by id) or from a harness's own JSON file. Everything in
the report is computed from those runs (STYLE.md: results are data,
reports are made from data). Published figures from other people's hardware live in
one separate, labelled table and never enter a plot or a computed ratio.

Plots, one PNG per config and kind, one column per machine (side by side, shared y
axis per row so vendors compare at a glance), one row per mode:
  throughput  rows/s vs batch, per backend
  floor       median time as a multiple of the roofline floor (1 = at the floor)
  speedup     each non-baseline backend vs eager and vs torch.compile
"""
from __future__ import annotations

import datetime as _dt
import os
from collections import defaultdict
from dataclasses import dataclass, field

from . import results, targets

SCHEMA = "fusedmlp-bench/1"
BASELINES = ("eager", "compile")
#: backends that are not competitors in a speed-up plot: the baselines themselves, and
#: "bare" (the same matmuls without bias/activation), which is a floor, not an op
NOT_COMPETING = BASELINES + ("bare",)
RECORD_KEYS = ("config", "N", "dtype", "mode", "backend", "timing", "pass", "median_ms",
               "rows_per_s", "floor_ms", "x_floor")
#: two passes of one measurement further apart than this suggest throttling (benchmarks/README.md, protocol)
PASS_SPREAD = 0.05

#: Intel, "Fully-fused multi-layer perceptrons on Intel data center GPUs", arXiv
#: 2403.17607, Table I (paper-table1 config). Seconds for 1000 iterations. Published
#: figures from other hardware: shown apart, labelled, never mixed with measurements.
PUBLISHED = {
    "source": "Intel, arXiv 2403.17607, Table I, for the MLP this package calls "
              "paper-table1 (width 64, 11 hidden layers; see benchmarks/README.md)",
    "rows": [
        # (implementation, hardware, inference s / 1000, training s / 1000)
        ("PyTorch", "NVIDIA H100", 1.543, 4.32),
        ("tiny-cuda-nn", "NVIDIA H100", 0.236, 0.79),
        ("SYCL (the paper's kernels)", "Intel Data Center GPU Max 1550", 0.083, 0.58),
    ],
}

_BACKEND_COLORS = {"eager": "#7f7f7f", "compile": "#ff7f0e", "triton": "#1f77b4",
                   "reference": "#2ca02c", "sycl": "#9467bd", "cuda": "#d62728",
                   "bare": "#000000"}
_DTYPE_STYLES = {"float16": "-", "bfloat16": "--", "float32": ":"}
_DTYPE_MARKERS = {"float16": "o", "bfloat16": "s", "float32": "^"}


@dataclass
class Machine:
    """One bench run: its environment, ceilings, notes and records."""

    label: str
    run: str
    env: dict
    ceilings: dict
    notes: list[str]
    records: list[dict]
    spread: list[tuple[dict, dict, float]] = field(default_factory=list)  # pass disagreements
    host: list[dict] = field(default_factory=list)  # host overhead per call (timing "host")
    raw: list[dict] = field(default_factory=list)  # every record, every pass (targets)


def _check_run(run: str, data: dict) -> dict:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"run {run}: expected schema {SCHEMA!r}, got {data.get('schema')!r}")
    for i, r in enumerate(data.get("records", [])):
        missing = [k for k in RECORD_KEYS if k not in r]
        if missing:
            raise ValueError(f"run {run}: record {i} lacks {', '.join(missing)}")
    return data


def load(paths: list[str], runs: list[str] | None = None) -> list[Machine]:
    """Read and check bench runs: every ``fusedmlp bench`` run in the tables (``.jsonl``)
    and files (``.json``) at ``paths``, or only the ``runs`` named; one Machine per run,
    labelled by its device name (plus the run id where two runs name the same device)."""
    if not paths:
        raise ValueError("results: give at least one results table or bench JSON file")
    raw = []
    for path in paths:
        found = results.load_documents([path])
        if str(path).endswith(results.SUFFIX) and not runs:
            # a table holds every harness's runs: the bench runs are the report's
            found = [(r, d) for r, d in found if d.get("schema") == SCHEMA]
        raw += found
    if runs:
        have = dict(raw)
        missing = [r for r in runs if r not in have]
        if missing:
            raise ValueError(f"--run: not in the results given: {', '.join(missing)}")
        raw = [(r, have[r]) for r in runs]
        for r, d in raw:
            try:
                _check_run(r, d)
            except ValueError as e:
                raise ValueError(f"--run: {e}") from None
    raw = [(r, _check_run(r, d)) for r, d in raw]
    if not raw:
        raise ValueError(f"results: no run of schema {SCHEMA!r} in {', '.join(paths)}")
    names = [d.get("env", {}).get("device") or p for p, d in raw]
    machines = []
    for (p, d), name in zip(raw, names):
        label = name if names.count(name) == 1 else f"{name} ({p})"
        recs = list(d.get("records", []))
        m = Machine(label, p, d.get("env", {}), d.get("ceilings", {}), list(d.get("notes", [])),
                    [r for r in recs if r["timing"] != "host"],
                    host=[r for r in recs if r["timing"] == "host"], raw=recs)
        m.records, m.spread = _merge_passes(m.records)
        machines.append(m)
    return machines


def _key(r: dict) -> tuple:
    return (r["config"], r["N"], r["dtype"], r["mode"], r["backend"], r["timing"])


def _merge_passes(records: list[dict]):
    """Keep the faster pass of each measurement (a slower pass is the card throttling or
    the host interfering, not the kernel), and list pairs further apart than PASS_SPREAD."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[_key(r)].append(r)
    best, spread = [], []
    for rs in groups.values():
        rs = sorted(rs, key=lambda r: r["median_ms"])
        best.append(rs[0])
        if len(rs) > 1 and rs[0]["median_ms"] > 0:
            s = rs[-1]["median_ms"] / rs[0]["median_ms"] - 1
            if s > PASS_SPREAD:
                spread.append((rs[0], rs[-1], s))
    return best, spread


def _speedups(m: Machine) -> dict[tuple, dict[str, float]]:
    """(key) -> {"eager": x, "compile": x}: baseline median / this median, same config,
    N, dtype, mode, both timed from Python (graph replay has no baseline to match)."""
    base = {_key(r): r for r in m.records if r["backend"] in BASELINES}
    out = {}
    for r in m.records:
        if r["timing"] != "python":
            continue
        ratios = {}
        for b in BASELINES:
            k = (r["config"], r["N"], r["dtype"], r["mode"], b, "python")
            if k in base and r["median_ms"] > 0:
                ratios[b] = base[k]["median_ms"] / r["median_ms"]
        out[_key(r)] = ratios
    return out


# --- formatting helpers --------------------------------------------------------------
def _g(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _ms(v) -> str:
    """Milliseconds: no exponent notation, 4 significant digits below 1000."""
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _pow2(n: int) -> str:
    """2^k for powers of two (how the benchmark configs name batches), else the number."""
    if n > 0 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return str(n)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s)


# --- plots ---------------------------------------------------------------------------
def _plot_config(config: str, machines: list[Machine], speed: dict, out_dir: str) -> dict[str, str]:
    """The three PNGs of one config; returns {kind: file name}."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI runners or here
    import matplotlib.pyplot as plt

    recs = {m.label: [r for r in m.records if r["config"] == config] for m in machines}
    modes = [md for md in ("inference", "train")
             if any(r["mode"] == md for rs in recs.values() for r in rs)]
    cols = [m for m in machines if recs[m.label]]
    if not modes or not cols:
        return {}
    files = {}
    for kind in ("throughput", "floor", "speedup"):
        fig, axes = plt.subplots(len(modes), len(cols), figsize=(max(7.0, 5.2 * len(cols)), 3.8 * len(modes)),
                                 squeeze=False, sharey="row")
        any_line = False
        legend: dict[str, object] = {}  # one legend for all panels: colours mean the same everywhere
        for i, mode in enumerate(modes):
            for j, m in enumerate(cols):
                ax = axes[i][j]
                rs = [r for r in recs[m.label] if r["mode"] == mode]
                any_line |= _draw(ax, kind, rs, speed[m.label])
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.grid(True, which="both", alpha=0.3)
                ax.set_title(f"{m.label}\n{mode}", fontsize=9)
                if i == len(modes) - 1:
                    ax.set_xlabel("batch N (rows)")
                if j == 0:
                    ax.set_ylabel({"throughput": "rows / s",
                                   "floor": "time / roofline floor",
                                   "speedup": "speed-up (x)"}[kind])
                if kind in ("floor", "speedup"):
                    ax.axhline(1.0, color="k", lw=0.8)
                # ratios read better as "6x" than as matplotlib's "6 x 10^0"
                _log_ticks(ax.yaxis, "x" if kind in ("floor", "speedup") else "")
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    legend.setdefault(lab, h)
        if not any_line:
            plt.close(fig)
            continue
        title = {"throughput": "throughput", "floor": "multiple of the roofline floor (lower is better)",
                 "speedup": "speed-up vs eager (solid) and vs torch.compile (dashed)"}[kind]
        files[kind] = _finish(plt, fig, f"{config}: {title}", legend, out_dir,
                              f"{_slug(config)}_{kind}.png")
    return files


def _sweep_plot(m: "Machine", out_dir: str) -> str | None:
    """One PNG of a wide M sweep (bench_wide --sweep): eager time / fused time, paired batch
    by batch (``eager_over_paired`` of the fused backend's records), against M, a line per
    config and d x hidden; a row per mode, a column per dtype. None without such records."""
    rs = [r for r in m.records if r.get("eager_over_paired") is not None
          and r["backend"] not in NOT_COMPETING]
    if not rs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [md for md in ("inference", "train") if any(r["mode"] == md for r in rs)]
    dtypes = sorted({r["dtype"] for r in rs})
    fig, axes = plt.subplots(len(modes), len(dtypes), figsize=(6.0 * len(dtypes), 3.8 * len(modes)),
                             squeeze=False, sharey=True)
    legend: dict[str, object] = {}
    for i, mode in enumerate(modes):
        for j, dt in enumerate(dtypes):
            ax = axes[i][j]
            for cfg in sorted({r["config"] for r in rs}):
                pts = sorted((r["N"], r["eager_over_paired"]) for r in rs
                             if r["config"] == cfg and r["mode"] == mode and r["dtype"] == dt)
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, lw=1, label=cfg)
            ax.set_xscale("log", base=2)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{mode}, {dt}", fontsize=9)
            ax.set_xlabel("M (tokens)")
            if j == 0:
                ax.set_ylabel("eager / fused (> 1: fused faster)")
            for h, lab in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(lab, h)
    return _finish(plt, fig, f"{m.label}: fused against eager by M (paired batches)", legend,
                   out_dir, f"sweep_{_slug(m.run)}.png")


def _finish(plt, fig, title: str, legend: dict, out_dir: str, name: str) -> str:
    """Title, one legend for every panel (right of the figure), saved as out_dir/name."""
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    labels = sorted(legend)
    fig.legend([legend[k] for k in labels], labels, loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.savefig(os.path.join(out_dir, name), dpi=110, bbox_inches="tight")
    plt.close(fig)
    return name


def _si(v: float) -> str:
    """1.5e9 -> 1.5G: tick labels of rows/s that stay short."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def _log_ticks(axis, unit: str) -> None:
    """Labels at 1-2-5 of each decade; where the shown range holds fewer than two of
    those, at every 1..9 (a floor plot spanning 1.1-1.4x had no label at all)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    def label(v, _pos):
        return f"{v:g}{unit}" if unit else _si(v)

    def minor_label(v, _pos):
        lo, hi = sorted(axis.get_view_interval())
        majors = [m for m in axis.get_majorticklocs() if lo <= m <= hi]
        return label(v, _pos) if len(majors) < 2 else ""

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(1, 10))))
    axis.set_minor_formatter(FuncFormatter(minor_label))


def _color(backend: str, dtype: str):
    """The backend's colour for float16; bfloat16 darker, float32 lighter, so that
    dtypes differ in colour (and marker) as well as line style."""
    from matplotlib.colors import to_rgb

    base = to_rgb(_BACKEND_COLORS.get(backend, "#17becf"))
    mix = {"bfloat16": (0.0, 0.45), "float32": (1.0, 0.45)}.get(dtype)
    if mix is None:
        return base
    to, share = mix
    return tuple(c * (1 - share) + to * share for c in base)


def _draw(ax, kind: str, rs: list[dict], speed: dict) -> bool:
    """Draw one panel; True when it drew a line."""
    series: dict[tuple, list[dict]] = defaultdict(list)
    for r in rs:
        series[(r["backend"], r["timing"], r["dtype"])].append(r)
    dtypes = {r["dtype"] for r in rs}
    drew = False
    for (backend, timing, dtype), pts in sorted(series.items()):
        pts.sort(key=lambda r: r["N"])
        color = _color(backend, dtype)
        tag = backend + (" [graph]" if timing == "graph" else "")
        if len(dtypes) > 1:
            tag += f" {dtype}"
        hollow = dict(markerfacecolor="none") if timing == "graph" else {}
        if kind in ("throughput", "floor"):
            ys = [r["rows_per_s"] if kind == "throughput" else r["x_floor"] for r in pts]
            ax.plot([r["N"] for r in pts], ys, _DTYPE_STYLES.get(dtype, "-"), color=color,
                    marker=_DTYPE_MARKERS.get(dtype, "o"), label=tag, **hollow)
            drew = True
            continue
        if backend in NOT_COMPETING or timing != "python":
            continue
        for base, style in (("eager", "-"), ("compile", "--")):
            xs, ys = [], []
            for r in pts:
                v = speed.get(_key(r), {}).get(base)
                if v is not None:
                    xs.append(r["N"])
                    ys.append(v)
            if xs:
                ax.plot(xs, ys, style, color=color, marker=_DTYPE_MARKERS.get(dtype, "o"),
                        label=f"{tag} vs {base}")
                drew = True
    return drew


# --- the markdown --------------------------------------------------------------------
def _machines_table(machines: list[Machine]) -> list[str]:
    head = ["machine", "run", "vendor", "capability", "driver", "torch", "triton", "python",
            "date", "clocks", "copy GB/s", "fp16 TFLOP/s", "bf16 TFLOP/s"]
    rows = []
    for m in machines:
        e, c = m.env, m.ceilings
        mm = c.get("matmul_TFLOPs") or {}
        rows.append([m.label, m.run] +
                    [e.get(k) or "—" for k in ("vendor", "capability", "driver", "torch",
                                              "triton", "python", "date", "clocks")] +
                    [_g(c.get("copy_GBps"), 4), _g(mm.get("float16"), 4), _g(mm.get("bfloat16"), 4)])
    return _table(head, rows)


def _largest_batch_table(machines: list[Machine], speed: dict) -> list[str]:
    head = ["config", "mode", "dtype", "N", "machine", "backend", "median ms", "rows/s",
            "x floor", "vs eager", "vs compile", "max rel err", "peak MB"]
    rows = []
    for m in machines:
        largest: dict[tuple, int] = {}
        for r in m.records:
            k = (r["config"], r["mode"], r["dtype"])
            largest[k] = max(largest.get(k, 0), r["N"])
        for r in m.records:
            if r["timing"] != "python" or r["N"] != largest[(r["config"], r["mode"], r["dtype"])]:
                continue
            s = speed[m.label].get(_key(r), {})
            rows.append(((r["config"], r["mode"], r["dtype"], m.label, r["median_ms"]),
                         [r["config"], r["mode"], r["dtype"], _pow2(r["N"]), m.label, r["backend"],
                          _ms(r["median_ms"]), _g(float(r["rows_per_s"])), _g(r["x_floor"]),
                          _g(s.get("eager")), _g(s.get("compile")),
                          _g(r.get("max_rel_error"), 2), _g(r.get("peak_mem_MB"), 4)]))
    rows.sort(key=lambda kr: kr[0])
    return _table(head, [r for _, r in rows])


def _targets_table(machines: list[Machine]) -> list[str]:
    def span(r):
        lo, hi = ("-", "-") if r is None else (f"{r[0]:#.4g}", f"{r[1]:#.4g}")
        return lo if lo == hi else f"{lo} - {hi}"
    # the targets are the GPUs' (targets.py): a CPU file's numbers are not checked
    rows = [[v.target, m.label, v.config, span(v.python), span(v.device), v.unit, str(v.n),
             f"**{v.status}**" if v.status == "missed" else v.status]
            for m in machines if m.env.get("vendor") != "cpu" for v in targets.check(m.raw)]
    if not rows:
        return ["No target applies to these runs."]
    return _table(["target", "machine", "config", "from Python", "device time", "unit",
                   "values", "status"], rows)


def _all_records_table(machines: list[Machine]) -> list[str]:
    head = ["machine", "config", "mode", "dtype", "N", "backend", "timing", "median ms",
            "min ms", "max ms", "rows/s", "TFLOP/s", "floor ms", "x floor", "max rel err"]
    rows = []
    for m in machines:
        for r in sorted(m.records, key=_key):
            rows.append([m.label, r["config"], r["mode"], r["dtype"], _pow2(r["N"]), r["backend"],
                         r["timing"], _ms(r["median_ms"]), _ms(r.get("min_ms")),
                         _ms(r.get("max_ms")), _g(float(r["rows_per_s"])), _g(r.get("tflops")),
                         _ms(r["floor_ms"]), _g(r["x_floor"]), _g(r.get("max_rel_error"), 2)])
    return _table(head, rows)


def _published_table() -> list[str]:
    rows = [[impl, hw, f"{inf:.3f} s", f"{inf:.3f} ms", f"{tr:.2f} s", f"{tr:.2f} ms"]
            for impl, hw, inf, tr in PUBLISHED["rows"]]
    return _table(["implementation", "hardware", "1000 inferences", "per inference",
                   "1000 training steps", "per training step"], rows)


def render(machines: list[Machine], out_dir: str) -> str:
    """Write the plots into out_dir and return the Markdown text."""
    speed = {m.label: _speedups(m) for m in machines}
    configs = sorted({r["config"] for m in machines for r in m.records})
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = ["# fusedmlp benchmark report", "",
          f"Made by `fusedmlp report` on {now} from {len(machines)} run(s): "
          + ", ".join(f"`run {m.run}`" for m in machines) + ". "
          "Every number in the sections below, except the last one, is computed from those "
          "runs' records in the results tables. Where a measurement was taken twice, the faster pass is shown.", "",
          "## Machines", ""]
    md += _machines_table(machines)
    md += ["", "## Results at the largest batch", "",
           "Per config, mode and dtype, at the largest N measured on that machine (timed from "
           "Python). `x floor`: median time / roofline floor of that machine (1.0 = at the "
           "floor). `vs eager`, `vs compile`: the baseline's time / this time.", ""]
    md += _largest_batch_table(machines, speed)
    md += ["", "## Targets", "",
           "The targets of the benchmark protocol, checked against every record and pass of "
           "each run (`fusedmlp_xpu/bench/targets.py`): the range over every case a target covers "
           "(dtypes, batches, passes), as called from Python and as device time (the "
           "CUDA-graph replay where the case has one). `met` needs the whole range on the "
           "target's side; `met on device time` holds for the graph replays but not from "
           "Python (a host-bound small batch).", ""]
    md += _targets_table(machines)
    md += ["", "## Plots", ""]
    for c in configs:
        if ":" in c:  # a sweep's config:d x hidden (and the Llama prefill): the sweep plot
            continue
        files = _plot_config(c, machines, speed, out_dir)
        if not files:
            continue
        md += [f"### {c}", ""]
        for kind, caption in (("throughput", "throughput vs batch"),
                              ("floor", "multiple of the roofline floor"),
                              ("speedup", "speed-up vs eager and torch.compile")):
            if kind in files:
                md += [f"![{c}: {caption}]({files[kind]})", ""]
    sweeps = [(m, _sweep_plot(m, out_dir)) for m in machines]
    if any(f for _, f in sweeps):
        md += ["## Fused against eager by M (wide sweeps)", "",
               "Eager time / fused time, paired batch by batch, at every M a sweep timed "
               "(`fusedmlp bench --suite wide --sweep`); below 1 the fused call was slower. "
               "Each record's `route` says what the call ran (kernels or torch ops).", ""]
        for m, f in sweeps:
            if f:
                md += [f"![{m.label}: fused against eager by M]({f})", ""]
    host = [(m, r) for m in machines for r in m.host]
    if host:
        md += ["## Host overhead of one eager call", "",
               "Host time of one no-grad call at 1 row (the device keeps up, so the host bounds), "
               "and of one `F.linear` on the same host in the same rounds where the file has "
               "it (hosts differ by ~1.5x).", ""]
        md += _table(["machine", "config", "dtype", "backend", "us per call",
                      "one F.linear, us"],
                     [[m.label, r["config"], r["dtype"], r["backend"],
                       f"{r.get('host_us', r['median_ms'] * 1e3):.1f}",
                       f"{r['host_us_one_linear']:.1f}" if r.get("host_us_one_linear")
                       else "-"] for m, r in host])
        md += [""]
    md += ["## Pass disagreement", ""]
    spread = [(m, a, b, s) for m in machines for a, b, s in m.spread]
    if spread:
        md += [f"Measurements whose two passes differ by more than {PASS_SPREAD:.0%} "
               "(throttling or a busy host); the faster pass is used above.", ""]
        md += _table(["machine", "config", "mode", "dtype", "N", "backend", "timing",
                      "fast ms", "slow ms", "spread"],
                     [[m.label, a["config"], a["mode"], a["dtype"], _pow2(a["N"]), a["backend"],
                       a["timing"], _ms(a["median_ms"]), _ms(b["median_ms"]), f"{s:.1%}"]
                      for m, a, b, s in spread])
    else:
        md += [f"None above {PASS_SPREAD:.0%}."]
    md += ["", "## Notes from the runs", ""]
    notes = [f"- {m.label}: {n}" for m in machines for n in m.notes]
    md += notes or ["None."]
    md += ["", "## All records", "", "<details><summary>every record (faster pass)</summary>", ""]
    md += _all_records_table(machines)
    md += ["", "</details>", "",
           "## Published, not measured here", "",
           f"Figures from {PUBLISHED['source']}, on hardware other than the machines above. "
           "They are quoted for orientation only: no number in this table was measured by "
           "this package, and none of them enters the plots or ratios above.", ""]
    md += _published_table()
    return "\n".join(md) + "\n"


def write_report(paths: list[str], out_dir: str, runs: list[str] | None = None) -> str:
    """Merge bench runs into out_dir/report.md (+ PNGs); returns the report's path."""
    machines = load(list(paths), runs)
    os.makedirs(out_dir, exist_ok=True)
    text = render(machines, out_dir)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write(text)
    return path
