"""The figures of ``fusedmlp report``, drawn from the records (matplotlib, files only).

The page (report.py) draws, per standard config, one PNG of throughput against batch with
the roofline floor, a column per machine (at most three across, a row per mode), the
wide sweeps one PNG per machine, and one summary bar figure. ``--history``
(report_history.py) draws today's three PNGs per config, a column per run.
"""
from __future__ import annotations

import os
from collections import defaultdict

from .report_data import NOT_COMPETING, Machine, key, slug

_BACKEND_COLORS = {"eager": "#7f7f7f", "compile": "#ff7f0e", "triton": "#1f77b4",
                   "reference": "#2ca02c", "sycl": "#9467bd", "cuda": "#d62728",
                   "bare": "#000000"}
_DTYPE_STYLES = {"float16": "-", "bfloat16": "--", "float32": ":"}
_DTYPE_MARKERS = {"float16": "o", "bfloat16": "s", "float32": "^"}
_CONFIG_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def plot_config(config: str, machines: list[Machine], speed: dict, out_dir: str) -> dict[str, str]:
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
                any_line |= draw(ax, kind, rs, speed[m.label])
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
                log_ticks(ax.yaxis, "x" if kind in ("floor", "speedup") else "")
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    legend.setdefault(lab, h)
        if not any_line:
            plt.close(fig)
            continue
        title = {"throughput": "throughput", "floor": "multiple of the roofline floor (lower is better)",
                 "speedup": "speed-up vs eager (solid) and vs torch.compile (dashed)"}[kind]
        files[kind] = finish(plt, fig, f"{config}: {title}", legend, out_dir,
                              f"{slug(config)}_{kind}.png")
    return files


def sweep_plot(m: Machine, out_dir: str) -> str | None:
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
    # a colour per d x hidden, a line style per config: tab10's ten colours did not tell
    # 13 shapes apart
    dims = sorted({r["config"].partition(":")[2] for r in rs})
    styles = {"wide-gelu": "-", "wide-swiglu": "--"}
    for i, mode in enumerate(modes):
        for j, dt in enumerate(dtypes):
            ax = axes[i][j]
            for cfg in sorted({r["config"] for r in rs}):
                pts = sorted((r["N"], r["eager_over_paired"]) for r in rs
                             if r["config"] == cfg and r["mode"] == mode and r["dtype"] == dt)
                family, _, dim = cfg.partition(":")
                if pts:
                    ax.plot(*zip(*pts), styles.get(family, ":"), marker="o", ms=3, lw=1,
                            label=cfg, color=_CONFIG_COLORS[dims.index(dim) % len(_CONFIG_COLORS)])
            ax.set_xscale("log", base=2)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{mode}, {dt}", fontsize=9)
            ax.set_xlabel("M (tokens)")
            if j == 0:
                ax.set_ylabel("eager / fused (> 1: fused faster)")
            for h, lab in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(lab, h)
    return finish(plt, fig, f"{m.label}: fused against eager by M (paired batches)", legend,
                   out_dir, f"sweep_{slug(m.run)}.png")


def finish(plt, fig, title: str, legend: dict, out_dir: str, name: str, dpi: int = 110) -> str:
    """Title, one legend for every panel (right of the figure), saved as out_dir/name."""
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    labels = sorted(legend)
    fig.legend([legend[k] for k in labels], labels, loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.savefig(os.path.join(out_dir, name), dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return name


def _si(v: float) -> str:
    """1.5e9 -> 1.5G: tick labels of rows/s that stay short."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def log_ticks(axis, unit: str) -> None:
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


def line_color(backend: str, dtype: str):
    """The backend's colour for float16; bfloat16 darker, float32 lighter, so that
    dtypes differ in colour (and marker) as well as line style."""
    from matplotlib.colors import to_rgb

    base = to_rgb(_BACKEND_COLORS.get(backend, "#17becf"))
    mix = {"bfloat16": (0.0, 0.45), "float32": (1.0, 0.45)}.get(dtype)
    if mix is None:
        return base
    to, share = mix
    return tuple(c * (1 - share) + to * share for c in base)


def draw(ax, kind: str, rs: list[dict], speed: dict) -> bool:
    """Draw one panel; True when it drew a line."""
    series: dict[tuple, list[dict]] = defaultdict(list)
    for r in rs:
        series[(r["backend"], r["timing"], r["dtype"])].append(r)
    dtypes = {r["dtype"] for r in rs}
    drew = False
    for (backend, timing, dtype), pts in sorted(series.items()):
        pts.sort(key=lambda r: r["N"])
        color = line_color(backend, dtype)
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
                v = speed.get(key(r), {}).get(base)
                if v is not None:
                    xs.append(r["N"])
                    ys.append(v)
            if xs:
                ax.plot(xs, ys, style, color=color, marker=_DTYPE_MARKERS.get(dtype, "o"),
                        label=f"{tag} vs {base}")
                drew = True
    return drew




# --- the page's figures ----------------------------------------------------------------
#: panels across at most (a figure of more machines wraps into more rows)
ACROSS = 3
#: the page's figures: inches a panel, and dots an inch (3 panels and the legend come to
#: about 1,800 px; the summary figure to 1,200 px)
PANEL_IN = (4.6, 3.3)
PAGE_DPI = 110
SUMMARY_DPI = 100
SUMMARY_WIDTH_IN = 12.0


def measured_lines(records: list[dict]) -> list[dict]:
    """A machine's panel: rows/s against batch per backend and dtype (timed from Python),
    and the roofline floor of each dtype as a level (rows/s at the floor do not depend on
    the batch: the floor is linear in it)."""
    series: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r["timing"] == "python" and r["backend"] != "bare":
            series[(r["backend"], r["dtype"])].append(r)
    dtypes = {d for _, d in series}
    lines = []
    for (backend, dtype), pts in sorted(series.items()):
        pts.sort(key=lambda r: r["N"])
        lines.append({"x": [r["N"] for r in pts], "y": [r["rows_per_s"] for r in pts],
                      "label": f"{backend} {dtype}",
                      "kw": {"ls": _DTYPE_STYLES.get(dtype, "-"),
                             "color": line_color(backend, dtype),
                             "marker": _DTYPE_MARKERS.get(dtype, "o")}})
    for dtype in sorted(dtypes):
        floors = [r["N"] / r["floor_ms"] * 1e3 for r in records
                  if r["dtype"] == dtype and r.get("floor_ms")]
        if floors:
            lines.append({"level": max(floors), "label": f"roofline floor {dtype}",
                          "kw": {"ls": _DTYPE_STYLES.get(dtype, "-"), "color": "k",
                                 "lw": 0.9}})
    return lines


def config_figure(title: str, columns: list[tuple[str, dict[str, list[dict]]]],
                  modes: list[str], out_dir: str, name: str) -> str:
    """One PNG: a column per machine (ACROSS at most, then another row of them), a row
    per mode; each panel rows/s against batch with its floor. ``columns``: (title,
    {mode: lines}), a line {"x", "y", "label", "kw"} or a level {"level", "label", "kw"}."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI runners or here
    import matplotlib.pyplot as plt

    chunks = [columns[i:i + ACROSS] for i in range(0, len(columns), ACROSS)]
    ncols = min(ACROSS, len(columns))
    nrows = len(chunks) * len(modes)
    fig, axes = plt.subplots(nrows, ncols, figsize=(PANEL_IN[0] * ncols, PANEL_IN[1] * nrows),
                             squeeze=False)
    legend: dict[str, object] = {}
    for c, chunk in enumerate(chunks):
        for i, mode in enumerate(modes):
            row = c * len(modes) + i
            for j in range(ncols):
                ax = axes[row][j]
                if j >= len(chunk) or not chunk[j][1].get(mode):
                    ax.axis("off")
                    if j < len(chunk):
                        ax.text(0.5, 0.5, f"{chunk[j][0]}\n{mode}: no figures", ha="center",
                                va="center", fontsize=9, transform=ax.transAxes)
                    continue
                _draw_lines(ax, chunk[j][1][mode])
                ax.set_title(f"{chunk[j][0]}\n{mode}", fontsize=9)
                ax.set_xlabel("batch (rows)", fontsize=8)
                ax.set_ylabel("rows / s", fontsize=8)
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    legend.setdefault(lab, h)
    return finish(plt, fig, title, legend, out_dir, name, dpi=PAGE_DPI)


def _draw_lines(ax, lines: list[dict]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    for ln in lines:
        if "level" in ln:
            ax.axhline(ln["level"], label=ln["label"], **ln["kw"])
        else:
            ax.plot(ln["x"], ln["y"], label=ln["label"], **ln["kw"])
    ax.grid(True, which="both", alpha=0.3)
    log_ticks(ax.yaxis, "")


def summary_figure(panels: list[tuple[str, str, list[tuple[str, dict, str]]]],
                   configs: list[str], out_dir: str, name: str) -> str | None:
    """The page's summary: a panel per question (``panels``: title, y label, groups), a
    bar group per source (label, {config: (lowest, highest)}, hatch), a bar per config it
    has, coloured by config; the bar is the lowest value, a line runs up to the highest.
    About 1,200 px wide. None when no panel has a bar."""
    panels = [p for p in panels if any(vals for _, vals, _ in p[2])]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colors = {c: _CONFIG_COLORS[i % len(_CONFIG_COLORS)] for i, c in enumerate(configs)}
    fig, axes = plt.subplots(len(panels), 1, figsize=(SUMMARY_WIDTH_IN, 3.1 * len(panels)),
                             squeeze=False)
    used: set[str] = set()
    for ax, (title, ylabel, groups) in zip(axes[:, 0], panels):
        groups = [g for g in groups if g[1]]
        x, ticks = 0.0, []
        for label, vals, hatch in groups:
            start = x
            for c in (c for c in configs if c in vals):
                lo, hi = vals[c]
                used.add(c)
                ax.bar(x, lo, width=0.8, color=colors[c], hatch=hatch, edgecolor="k", lw=0.4)
                if hi > lo * 1.005:
                    ax.plot([x, x], [lo, hi], color="k", lw=1.2)
                text = f"{lo:.2g}" if f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g}-{hi:.2g}"
                ax.annotate(text, (x, hi), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7)
                x += 1
            ticks.append(((start + x - 1) / 2, label))
            x += 0.8
        ax.set_xticks([t for t, _ in ticks], [lab for _, lab in ticks], fontsize=9)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    handles = [Patch(facecolor=colors[c], edgecolor="k", lw=0.4, label=c)
               for c in configs if c in used]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 8), fontsize=9,
               frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.1 * len(panels))))
    fig.savefig(os.path.join(out_dir, name), dpi=SUMMARY_DPI)
    plt.close(fig)
    return name
