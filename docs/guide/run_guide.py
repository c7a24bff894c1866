"""Run the profiling guide's own code once and keep what it printed and exported.

The guide (docs/guide/profiling.md) quotes one run of its Python blocks. This script is
that run: it takes the page's ```python blocks (the same ones tests/test_docs.py runs),
executes them in order in one namespace, and writes under ``--out``:

- ``<run>.json``: the run id, the device, torch/triton versions, date, commit, and each
  block's source line count and everything it printed;
- ``eager.json.gz``, ``fused.json.gz``: the inference traces the page exports
  (Chrome/Perfetto format);
- ``train-eager.pt.trace.json.gz``: one of the training-step traces that
  ``tensorboard_trace_handler`` wrote (the fused one is kept if there is room);
- ``profile-timeline.png``: the timeline picture, drawn from the two inference traces.

Every file stays small (five calls per trace). ``--render-only DIR`` draws the picture
again from a run's ``eager.json.gz`` and ``fused.json.gz`` in DIR, with no profiling, so
the picture can be made where the traces were fetched to; ``--traces train`` draws one
training step from the ``train-*.pt.trace.json.gz`` instead (the page shows both)::

    PYTHONPATH=. python3 docs/guide/run_guide.py --out OUT --run h100-guide-20261205b
    python3 docs/guide/run_guide.py --render-only OUT --png docs/img/profile-timeline-inference.png
    python3 docs/guide/run_guide.py --render-only OUT --traces train --png docs/img/profile-timeline.png
    python3 docs/guide/run_guide.py --quote OUT/h100-guide-20261205b.json   # into the page
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import io
import json
import os
import re
import shutil
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = os.path.join(HERE, "profiling.md")
# the fence tests/test_docs.py runs: exactly ```python (```python title=... is shown only)
PY_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
TRACES = ("eager", "fused")
TRAIN_TRACES = ("train-eager.pt.trace", "train-fused.pt.trace")
#: the call of the five profiled ones that the picture shows (the first can still carry
#: a late allocation; any of the others is typical)
PICTURE_CALL = 1


def blocks(page: str = PAGE) -> list[str]:
    with open(page) as f:
        return PY_BLOCK.findall(f.read())


# --- running the page ------------------------------------------------------------------
def run_page(page: str = PAGE) -> tuple[list[dict], dict]:
    """Each block of ``page`` executed in order in one namespace, its stdout captured ->
    ([{block, lines, stdout, seconds}], the namespace). A failing block's traceback goes
    in its entry and the run goes on (later blocks that need it fail in turn): a device
    run is made once, and what the other blocks print is still worth keeping."""
    ns: dict = {"__name__": "__guide__"}
    out = []
    for i, src in enumerate(blocks(page), 1):
        buf = io.StringIO()
        t0 = time.perf_counter()
        entry = {"block": i, "lines": src.count("\n"), "first_line": src.split("\n", 1)[0]}
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(src, f"profiling.md block {i}", "exec"), ns)
        except Exception:
            entry["error"] = traceback.format_exc()
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        entry["stdout"] = buf.getvalue()
        out.append(entry)
        print(f"--- block {i} ({entry['seconds']:.1f} s)\n{entry['stdout']}", end="", flush=True)
        if "error" in entry:
            print(entry["error"], file=sys.stderr)
    return out, ns


def environment(ns: dict) -> dict:
    import torch

    from fusedmlp_xpu.bench.tools import environment as env_of

    return env_of(ns.get("device", torch.device("cpu")))


def _gzip_copy(src: str, dst: str) -> str:
    with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    return dst


def keep_traces(trace_dir: str, out: str) -> list[str]:
    """The page's exported traces, gzipped, into ``out``: the two inference traces, and
    the training-step traces tensorboard_trace_handler wrote (already gzipped)."""
    kept = []
    for name in TRACES:
        src = os.path.join(trace_dir, f"{name}.json")
        if os.path.exists(src):
            kept.append(_gzip_copy(src, os.path.join(out, f"{name}.json.gz")))
    for name in ("train-eager", "train-fused"):
        tb = sorted(f for f in os.listdir(trace_dir) if f.startswith(name + "."))
        if tb:
            dst = os.path.join(out, f"{name}.pt.trace.json.gz")
            shutil.copyfile(os.path.join(trace_dir, tb[-1]), dst)
            kept.append(dst)
    return kept


# --- the timeline picture --------------------------------------------------------------
def _load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]


def one_call(events: list[dict], call: int = PICTURE_CALL, label: str | None = None):
    """(host rows, device rows, t0) of the ``call``-th profiled call in a trace: the
    outermost operators under its label and the runtime's launches on the host; on the
    device, the kernels (and copies) whose launch lies inside it, by correlation id.
    Times in us from the call's start."""
    if label is None:
        from fusedmlp_xpu.bench.profiling import STEP as label
    steps = sorted((e for e in events if e["name"] == label
                    and e.get("cat") in ("user_annotation", "cpu_instant_event", None)),
                   key=lambda e: e["ts"])
    if not steps:
        steps = sorted((e for e in events if e["name"] == label), key=lambda e: e["ts"])
    step = steps[min(call, len(steps) - 1)]
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    # the process's events inside the call, on every thread: a training step's backward
    # runs on autograd's own thread, which launches the backward's kernels
    inside = [e for e in events if t0 <= e["ts"] < t1 and e is not step
              and e.get("pid") == step.get("pid")]
    ops = [e for e in inside if e.get("cat") == "cpu_op"]
    # outermost operators: not contained in another operator of the call
    ops.sort(key=lambda e: (e["ts"], -e["dur"]))
    outer, end = [], -1.0
    for e in ops:
        if e["ts"] >= end:
            outer.append(e)
            end = e["ts"] + e["dur"]
    launches = [e for e in inside if e.get("cat") in ("cuda_runtime", "xpu_runtime",
                                                      "cuda_driver")
                and "aunch" in e["name"]]
    corr = {e.get("args", {}).get("correlation") for e in launches}
    on_device = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy",
                                                             "gpu_memset")),
                       key=lambda e: e["ts"])
    device = [e for e in on_device if e.get("args", {}).get("correlation") in corr]
    if on_device and not device:  # launches not traced (a driver API kineto missed):
        k = len(on_device) // len(steps)  # every call launches the same kernels, in order
        device = on_device[call * k:(call + 1) * k]
    return outer, launches, device, t0, t1


def _short(name: str) -> str:
    name = name.removeprefix("void ").split("(")[0].split("<")[0]
    name = name.rsplit("::", 1)[-1] if not name.startswith("aten::") else name
    return name if len(name) <= 28 else name[:25] + "..."


def render(trace_dir: str, png: str, title: str = "", traces: tuple[str, ...] = TRACES) -> str:
    """The picture: for eager and fused, one call's host row and device row on one time
    axis (CPU runs have no device row: their operators are the work). ``traces``: the
    files' names without their suffix, the inference traces by default, or
    TRAIN_TRACES for one training step of each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls = {}
    for name in traces:
        for suffix in (".json.gz", ".json"):
            path = os.path.join(trace_dir, name + suffix)
            if os.path.exists(path):
                calls[name.removesuffix(".pt.trace")] = one_call(_load(path))
                break
        else:
            raise FileNotFoundError(f"{trace_dir}: no {name}.json.gz or {name}.json")
        ops, launches, dev, t0, t1 = calls[name.removesuffix(".pt.trace")]
        if dev and not any(e["dur"] for e in dev):
            raise ValueError(f"{path}: its device events carry no times (ts and dur 0): "
                             "the profile was exported after another profiler session "
                             "had started; draw another pair (--traces train)")
    span = max(max(t1, *(e["ts"] + e["dur"] for e in dev)) - t0 if dev else t1 - t0
               for _, _, dev, t0, t1 in calls.values())
    colors = {"op": "#4c72b0", "launch": "#dd8452", "kernel": "#55a868", "other": "#8172b3"}
    fig, axes = plt.subplots(len(calls), 1, figsize=(9, 1.9 * len(calls)), sharex=True,
                             constrained_layout=True)
    for ax, (name, (ops, launches, dev, t0, t1)) in zip(axes, calls.items()):
        rows = [("host: ops", ops, "op")]
        if launches:
            rows.append(("host: launches", launches, "launch"))
        if dev:
            rows.append(("device: kernels", dev, "kernel"))
        for y, (_, evs, kind) in enumerate(reversed(rows)):
            for e in evs:
                c = colors["other"] if kind == "kernel" and e.get("cat") != "kernel" else colors[kind]
                ax.broken_barh([((e["ts"] - t0), max(e["dur"], span / 1500))], (y - 0.35, 0.7),
                               facecolors=c, edgecolors="none")
        ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)], fontsize=8)
        busy = sum(e["dur"] for e in dev)
        end = max([t1] + [e["ts"] + e["dur"] for e in dev]) - t0
        if dev:
            what = (f"{len(dev)} kernels, {busy:.0f} us of {end:.0f} us busy "
                    f"({1 - busy / end:.0%} idle)")
        else:
            what = f"{len(ops)} operators, {end:.0f} us (CPU: no device)"
        ax.set_title(f"{name}: {what}", fontsize=9, loc="left")
        ax.set_xlim(0, span * 1.02)
        ax.grid(axis="x", alpha=0.3)
        # name the longest events of the top and bottom rows where there is room
        for y, evs in ((len(rows) - 1, ops), (0, dev)):
            for e in sorted(evs, key=lambda e: -e["dur"])[:4] if evs else []:
                if e["dur"] > span / 9:
                    ax.text(e["ts"] - t0 + e["dur"] / 2, y, _short(e["name"]), ha="center",
                            va="center", fontsize=7, color="white", clip_on=True)
    axes[-1].set_xlabel("us from the start of the call")
    if title:
        fig.suptitle(title, fontsize=9)
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=150)
    plt.close(fig)
    return png


# --- quoting a run on the page ---------------------------------------------------------
def quote(run_json: str, page: str = PAGE) -> int:
    """Write each block's output from the run at ``run_json`` into the page: the first
    ```text fence after the i-th ```python block (and before the next one) gets block i's
    stdout, in full. Returns how many fences it filled."""
    with open(run_json) as f:
        doc = json.load(f)
    outs = {b["block"]: b["stdout"] for b in doc["blocks"]}
    with open(page) as f:
        lines = f.read().split("\n")
    out, i, want, filled, n = [], 0, None, 0, 0
    while n < len(lines):
        ln = lines[n]
        if ln == "```python":
            i += 1
            want = i
        elif ln == "```text" and want is not None and want in outs:
            end = lines.index("```", n + 1)
            out += ["```text"] + outs[want].rstrip("\n").split("\n") + ["```"]
            n, want, filled = end + 1, None, filled + 1
            continue
        out.append(ln)
        n += 1
    with open(page, "w") as f:
        f.write("\n".join(out))
    return filled


# --- the command -----------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="the folder to write the run's files into (made if missing)")
    p.add_argument("--run", help="the run's id, e.g. h100-guide-20261205")
    p.add_argument("--render-only", metavar="DIR",
                   help="draw the picture from DIR's eager.json.gz and fused.json.gz; no run")
    p.add_argument("--png", help="where the picture goes (default: profile-timeline.png in "
                   "--out, or in the --render-only folder)")
    p.add_argument("--traces", choices=("inference", "train"), default="inference",
                   help="which pair --render-only draws: the inference traces (eager.json.gz, "
                   "fused.json.gz) or one training step (train-*.pt.trace.json.gz)")
    p.add_argument("--quote", metavar="RUN_JSON",
                   help="write a run's outputs (its <run>.json) into the page's text blocks")
    args = p.parse_args(argv)
    if args.quote:
        print(f"{quote(args.quote)} output blocks of {PAGE} filled from {args.quote}")
        return 0
    if args.render_only:
        png = args.png or os.path.join(args.render_only, "profile-timeline.png")
        meta = sorted(f for f in os.listdir(args.render_only) if f.endswith(".json")
                      and not f.startswith(TRACES))
        title = ""
        if meta:
            with open(os.path.join(args.render_only, meta[0])) as f:
                doc = json.load(f)
            title = f"run {doc.get('run')}: {doc.get('env', {}).get('device', '')}"
        traces = TRAIN_TRACES if args.traces == "train" else TRACES
        print(render(args.render_only, png, title, traces))
        return 0
    if not (args.out and args.run):
        p.error("--out and --run are needed (or --render-only DIR)")
    from fusedmlp_xpu.bench.results import check_run_id

    check_run_id(args.run, "--run")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    outputs, ns = run_page()
    env = environment(ns)
    doc = {"run": args.run, "page": "docs/guide/profiling.md",
           "date": env.get("date"), "commit": env.get("commit"),
           "device": env.get("device"), "torch": env.get("torch"),
           "triton": env.get("triton"), "env": env,
           "seconds": round(time.perf_counter() - t0, 1),
           "complete": not any("error" in b for b in outputs),
           "blocks": outputs}
    kept = keep_traces(ns["trace_dir"], args.out) if "trace_dir" in ns else []
    doc["files"] = [os.path.basename(k) for k in kept]
    if set(f"{n}.json.gz" for n in TRACES) <= set(doc["files"]):
        try:
            png = render(args.out, os.path.join(args.out, "profile-timeline.png"),
                         f"run {args.run}: {env.get('device', '')}")
            doc["files"].append(os.path.basename(png))
        except (ImportError, ValueError) as e:  # no matplotlib, or a trace without
            # device times: --render-only later, from the fetched folder
            doc["render"] = f"not drawn ({e}); run --render-only on the fetched folder"
    with open(os.path.join(args.out, f"{args.run}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"run {args.run}: {len(outputs)} blocks in {doc['seconds']} s, "
          f"{'complete' if doc['complete'] else 'INCOMPLETE'}; wrote "
          + ", ".join([f"{args.run}.json"] + doc["files"]) + f" to {args.out}")
    return 0 if doc["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
