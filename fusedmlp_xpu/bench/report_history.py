"""``fusedmlp report --history``: every bench run of the tables, each a machine of its own
(report.md as the report was before it became one page): machines, results at the
largest batch, targets, three plots per config with a column per run, wide sweeps, host
overhead, pass disagreements, notes, every record, and the published figures apart.
"""
from __future__ import annotations

import datetime as _dt

from . import targets
from .pvc import PUBLISHED as _TABLE_I
from .report_data import (PASS_SPREAD, Machine, fmt, fmt_ms, key, md_table, pow2,
                          speedups, spread_table)
from .report_plots import plot_config, sweep_plot

#: Intel, "Fully-fused multi-layer perceptrons on Intel data center GPUs", arXiv
#: 2403.17607, Table I (paper-table1 config), as pvc.py holds it: seconds for 1000
#: iterations. Published figures from other hardware: shown apart, labelled, never mixed
#: with measurements.
PUBLISHED = {
    "source": "Intel, arXiv 2403.17607, Table I, for the MLP this package calls "
              "paper-table1 (width 64, 11 hidden layers; see benchmarks/README.md)",
    "rows": [
        # (implementation, hardware, inference s / 1000, training s / 1000)
        (impl, hw, _TABLE_I["inference"][name], _TABLE_I["training"][name])
        for impl, hw, name in (
            ("PyTorch", "NVIDIA H100", "PyTorch on H100"),
            ("tiny-cuda-nn", "NVIDIA H100", "tiny-cuda-nn on H100"),
            ("SYCL (the paper's kernels)", "Intel Data Center GPU Max 1550", "SYCL on Max 1550"))
    ],
}


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
                    [fmt(c.get("copy_GBps"), 4), fmt(mm.get("float16"), 4), fmt(mm.get("bfloat16"), 4)])
    return md_table(head, rows)


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
            s = speed[m.label].get(key(r), {})
            rows.append(((r["config"], r["mode"], r["dtype"], m.label, r["median_ms"]),
                         [r["config"], r["mode"], r["dtype"], pow2(r["N"]), m.label, r["backend"],
                          fmt_ms(r["median_ms"]), fmt(float(r["rows_per_s"])), fmt(r["x_floor"]),
                          fmt(s.get("eager")), fmt(s.get("compile")),
                          fmt(r.get("max_rel_error"), 2), fmt(r.get("peak_mem_MB"), 4)]))
    rows.sort(key=lambda kr: kr[0])
    return md_table(head, [r for _, r in rows])


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
    return md_table(["target", "machine", "config", "from Python", "device time", "unit",
                   "values", "status"], rows)


def _all_records_table(machines: list[Machine]) -> list[str]:
    head = ["machine", "config", "mode", "dtype", "N", "backend", "timing", "median ms",
            "min ms", "max ms", "rows/s", "TFLOP/s", "floor ms", "x floor", "max rel err"]
    rows = []
    for m in machines:
        for r in sorted(m.records, key=key):
            rows.append([m.label, r["config"], r["mode"], r["dtype"], pow2(r["N"]), r["backend"],
                         r["timing"], fmt_ms(r["median_ms"]), fmt_ms(r.get("min_ms")),
                         fmt_ms(r.get("max_ms")), fmt(float(r["rows_per_s"])), fmt(r.get("tflops")),
                         fmt_ms(r["floor_ms"]), fmt(r["x_floor"]), fmt(r.get("max_rel_error"), 2)])
    return md_table(head, rows)


def _published_table() -> list[str]:
    rows = [[impl, hw, f"{inf:.3f} s", f"{inf:.3f} ms", f"{tr:.2f} s", f"{tr:.2f} ms"]
            for impl, hw, inf, tr in PUBLISHED["rows"]]
    return md_table(["implementation", "hardware", "1000 inferences", "per inference",
                   "1000 training steps", "per training step"], rows)


def render(machines: list[Machine], out_dir: str) -> str:
    """Write the plots into out_dir and return the Markdown text."""
    speed = {m.label: speedups(m) for m in machines}
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
        files = plot_config(c, machines, speed, out_dir)
        if not files:
            continue
        md += [f"### {c}", ""]
        for kind, caption in (("throughput", "throughput vs batch"),
                              ("floor", "multiple of the roofline floor"),
                              ("speedup", "speed-up vs eager and torch.compile")):
            if kind in files:
                md += [f"![{c}: {caption}]({files[kind]})", ""]
    sweeps = [(m, sweep_plot(m, out_dir)) for m in machines]
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
        md += md_table(["machine", "config", "dtype", "backend", "us per call",
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
    md += spread_table("machine", [(m.label, a, b, s) for m, a, b, s in spread])
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


