"""The Intel Data Center GPU Max 1550 (PVC) side of the vendor report, without the card:
each narrow benchmark config's roofline floor on a Max 1550, the published figures, and
what the ESIMD kernels' ISA (``ci/aot_sycl.py``'s table) says they issue per row.

    python -m fusedmlp_xpu.bench.pvc [--isa TABLE.json | --run RUN-ID]
    python -m fusedmlp_xpu.bench.pvc --model (--compile | --isa F | --run ID) [--out F]

``--model``: a static MODEL (not a measurement) of each standard config's forward
kernel at 2^22 rows from its listing's counts and launch shape: XMX clocks, vector-issue
clocks, memory messages against L1/SLM, bytes against HBM, occupancy; its assumptions
and their sources are the constants below, its calibration Intel's Table I case
(``calibration``). docs/intel.md shows the committed model run beside the floors.

No timing here is ours: nothing has run on a Max 1550. The floors are max(FLOPs / matrix
rate, minimal bytes / HBM bandwidth), minimal bytes = x read once + y written once in
the operand dtype, as BENCHMARKS.md defines them for the H200.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from .configs import CONFIGS

#: HBM2e of both stacks (a process that uses one stack, one tile, gets half)
HBM_TB_S = 3.28
#: the XMX peak at 1.6 GHz: 128 Xe-cores x 8 XMX engines x 256 fp16/bf16 multiply-adds
#: a clock x 2 = 838.9 TFLOP/s, Intel's 839
MATRIX_PEAK_TFLOPS = 128 * 8 * 256 * 2 * 1.6e9 / 1e12
#: GEMM rates measured on Aurora's Max 1550s (BENCHMARKS.md): the attainable matrix rate
GEMM_TFLOPS = {"fp16": 263.0, "bf16": 273.0}
#: Intel, arXiv 2403.17607, Table I (paper-table1, 2^17 rows, 1000 calls): seconds
PUBLISHED = {
    "inference": {"SYCL on Max 1550": 0.083, "tiny-cuda-nn on H100": 0.236,
                  "PyTorch on H100": 1.543},
    "training": {"SYCL on Max 1550": 0.58, "tiny-cuda-nn on H100": 0.79,
                 "PyTorch on H100": 4.32},
}


def padded(width: int) -> int:
    return next(p for p in (16, 32, 64, 128) if p >= width)


def dpas_per_row(cfg) -> float:
    """The dpas (8 rows x 16 x 16 multiply-adds each) one row costs in the forward, at
    the widths padded to a tile: the kernel's count, not the ISA's static one."""
    w = [padded(v) for v in cfg.widths]
    return sum(a // 16 * (b // 16) for a, b in zip(w[:-1], w[1:])) / 8


def forward_kernel(cfg, kernels: dict, dtype: str = "bf16") -> tuple[str, dict]:
    """(name, ISA row or {}) of the forward kernel that runs ``cfg``: the name the sycl
    backend gives it (``config_for``), or, in a table made before kernels were named by
    activation and I/O mode, the one of the same dtype and padded widths."""
    base = (f"fmlp_esimd_fwd_{dtype}_{padded(cfg.in_features)}_"
            f"{padded(cfg.hidden_features)}_{padded(cfg.out_features)}")
    try:
        import torch

        from ..backends import sycl_esimd as se
        from ..spec import MLPSpec

        spec = MLPSpec(cfg.widths, cfg.activation, cfg.output_activation, cfg.bias,
                       {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
        name = se.config_for(spec)[0].kernel("fwd")
    except (ImportError, AttributeError):
        name = base
    if name in kernels:
        return name, kernels[name]
    older = [n for n in kernels if n == base or n.startswith(base + "_")]
    return (older[0], kernels[older[0]]) if older else (name, {})


def rows(isa: dict | None = None, dtype: str = "bf16") -> list[dict]:
    """One row per narrow config and batch: floors, and the forward kernel's ISA figures
    where a table is given."""
    kernels = {k["kernel"]: k for k in (isa or {}).get("kernels", [])}
    out = []
    for cfg in CONFIGS.values():
        if cfg.regime != "narrow":
            continue
        flops_row = cfg.flops_per_row()
        bytes_row = 2 * (cfg.in_features + cfg.out_features)
        name, k = forward_kernel(cfg, kernels, dtype)
        for n in cfg.batches:
            t_gemm = n * flops_row / (GEMM_TFLOPS[dtype] * 1e12) * 1e3
            t_peak = n * flops_row / (MATRIX_PEAK_TFLOPS * 1e12) * 1e3
            t_mem = n * bytes_row / (HBM_TB_S * 1e12) * 1e3
            out.append({
                "config": cfg.name, "rows": n, "dtype": dtype,
                "floor_ms": max(t_gemm, t_mem), "floor_at_peak_ms": max(t_peak, t_mem),
                "bound": "matrix" if t_gemm >= t_mem else "memory",
                "dpas_per_row": dpas_per_row(cfg),
                "useful_fraction": flops_row / (dpas_per_row(cfg) * 2 * 8 * 256),
                "bytes_per_row": bytes_row, "kernel": name,
                "spill_bytes": k.get("spill_bytes"), "grf": k.get("grf"),
                "static_dpas": k.get("dpas"),
                "global_messages": None if not k else
                k["sends"]["global_load"] + k["sends"]["global_store"],
            })
    return out


def _rows_label(n: int) -> str:
    p = int(math.log2(n))
    return f"2^{p}" + (f"+{n - 2 ** p}" if n & (n - 1) else "")


def markdown(isa: dict | None = None, dtype: str = "bf16") -> str:
    """Two tables (one of 12 columns did not fit a page): the floors, then what the
    forward kernel issues for them."""
    rs = rows(isa, dtype)
    head = ("| config | rows | floor ms (GEMM rate) | floor ms (peak) | bound | bytes a row |\n"
            "| --- | --- | --- | --- | --- | --- |\n")
    body = "".join(
        f"| `{r['config']}` | {_rows_label(r['rows'])} | {r['floor_ms']:.3f} "
        f"| {r['floor_at_peak_ms']:.3f} | {r['bound']} | {r['bytes_per_row']} |\n" for r in rs)
    khead = ("| config | forward kernel | dpas a row | useful MACs | GRF | spills | static dpas |\n"
             "| --- | --- | --- | --- | --- | --- | --- |\n")
    seen, kbody = set(), ""
    for r in rs:
        if r["config"] in seen:
            continue
        seen.add(r["config"])
        kbody += (f"| `{r['config']}` | {_kernel_label(r['kernel'])} | {r['dpas_per_row']:g} "
                  f"| {r['useful_fraction']:.0%} | {r['grf'] or '—'} "
                  f"| {'—' if r['spill_bytes'] is None else r['spill_bytes']} "
                  f"| {r['static_dpas'] or '—'} |\n")
    return head + body + "\n" + khead + kbody


def _kernel_label(name: str) -> str:
    """``fmlp_esimd_fwd_bf16_64_32_64[_...]`` -> ``bf16 64/32/64`` (the full names wrapped
    into pieces in a table cell)."""
    parts = name.removeprefix("fmlp_esimd_").split("_")
    if len(parts) < 5:
        return name
    return f"{parts[1]} {'/'.join(parts[2:5])}"


#: the kernels docs/intel.md's ISA table shows: the standard configs' (relu, every surface
#: by blocks where the widths allow) and the weight-gradient kernel
ISA_TABLE_KERNELS = ("fwd_bf16_64_32_64_a1_0_io7", "bwd_bf16_64_32_64_a1_0_io7",
                     "fwd_bf16_64_64_64_a1_0_io7", "bwd_bf16_64_64_64_a1_0_io7",
                     "fwd_bf16_64_128_64_a1_0_io7", "bwd_bf16_64_128_64_a1_0_io7",
                     "fwd_bf16_32_64_16_a1_0_io5", "fwd_f16_128_128_128_a1_0_io7",
                     "bwd_f16_128_128_128_a1_0_io7", "wgrad_bf16_a1_io5")
#: Intel's tiny-dpcpp-nn ESIMD kernel put through the same pipeline (issue 61: IGC 22.43,
#: 256 GRF): instructions a dpas and memory messages, by the kernel of ours it compares to
INTEL_LISTING = {
    "fwd_bf16_64_64_64": ("12.3 inference, 17.6 training", "50 2-D loads, 2 block stores, 0 gathers"),
    "bwd_bf16_64_64_64": ("20.7", "36 2-D loads, 6 block stores"),
    "fwd_f16_128_128_128": ("5.9 inference", "196 2-D loads, 0 gathers"),
    "wgrad_bf16": ("(oneMKL GEMM)", "—"),
}


def _base(name: str) -> str:
    """``fmlp_esimd_fwd_bf16_64_64_64_a1_0_io7`` -> ``fwd_bf16_64_64_64``,
    ``fmlp_esimd_wgrad_bf16_a1_io5`` -> ``wgrad_bf16``."""
    return re.sub(r"_a\d+(_\d+)?_io\d+$", "", name.removeprefix("fmlp_esimd_"))


def isa_markdown(isa: dict, before: dict | None = None) -> str:
    """docs/intel.md's ISA table: ISA_TABLE_KERNELS from the table ``isa``, instructions a
    dpas beside ``before``'s (an older table, matched by dtype and widths) and Intel's."""
    now = {k["kernel"].removeprefix("fmlp_esimd_"): k for k in isa["kernels"]}
    old = {_base(k["kernel"]): k for k in (before or {}).get("kernels", [])}
    head = ("| kernel (`fmlp_esimd_…`) | threads / engine | spills | dpas (static) "
            "| instructions / dpas: before → now | Intel's | messages now: 2-D block / gather "
            "/ all | Intel's |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
    body = ""
    for name in ISA_TABLE_KERNELS:
        k, b = now[name], old.get(_base(name))
        ipd = f"{k['inst_count'] / k['dpas']:.1f}"
        was = f"{b['inst_count'] / b['dpas']:.1f} → " if b else ""
        intel = INTEL_LISTING.get(_base(name), ("—", "—"))
        msgs = sum(k["sends"][s] for s in ("global_load", "global_store", "slm_load",
                                           "slm_store", "atomic"))
        body += (f"| `{name}` | {k.get('threads_per_eu', '—')} | {k['spill_bytes']} "
                 f"| {k['dpas']} | {was}**{ipd}** | {intel[0]} "
                 f"| {k['block2d']} / {k['gathers']} / {msgs} | {intel[1]} |\n")
    return head + body


# --- the static model ------------------------------------------------------------------
# A MODEL, not a measurement: it turns what a kernel's PVC listing holds (ci/aot_sycl.py's
# counts) and its launch shape into a time, under the assumptions below; no Intel GPU has
# run these kernels. Each assumption with its source:
#: the Max 1550's peak clock, 128 Xe-cores (2 stacks x 64), 8 vector and 8 XMX engines a
#: Xe-core, HBM2e 3.2768 TB/s: Intel's product page (ark.intel.com, product 232873), as
#: quoted by glennklockwood.com/garden/processors/pvc
CLOCK_HZ = 1.6e9
XE_CORES = 128
ENGINES = 8
#: XMX: 4096 fp16/bf16 ops a clock a Xe-core (Intel Architecture Day 2021, reported by
#: techpowerup.com), 256 multiply-adds a clock an engine: one dpas.8x8 (8 rows x 16 x 16)
#: holds an engine 8 clocks
DPAS_CLOCKS = 8 * 16 * 16 // (4096 // 2 // ENGINES)
#: vector issue: one instruction a clock a vector engine, shared by its threads (assumed;
#: a SIMD16 fp32 instruction fills the 512-bit engine in one clock, per the same source's
#: 256 fp32 ops a clock a Xe-core); every instruction of the listing counts once a pass,
#: every arm of a run-time branch included (so a run-time switch is charged in full)
ISSUE_PER_CLOCK = 1
#: hardware threads a vector engine: 8, or 4 in the large register file (intel/compute-
#: runtime, gfx_core_helper.h: "When using LargeGRF ... only 4 HW threads per EU")
THREADS = {128: 8, 256: 4}
#: threads an engine needs for the overlap below (assumed): fewer scale time up in proportion
THREADS_FOR_OVERLAP = 4
#: shared local memory a Xe-core (the issue's review: 128 KiB a work-group leaves one)
SLM_PER_CORE = 128 * 1024
#: L1/SLM: 64-byte lines a clock a Xe-core (assumed: no public figure found; the
#: calibration below absorbs it); a 16-lane global gather or scatter touches 16 lines (one
#: row a lane), a global block or 2-D block message 8 (512 B, one dpas tile), an SLM
#: message 1 (at most 64 contiguous bytes in these kernels)
L1_LINES_PER_CLOCK = 2
GATHER_LINES, BLOCK_LINES, SLM_LINES = 16, 8, 1
#: overlap: XMX, vector issue, L1 and HBM run at once; the time is the largest (assumed)
#: Intel's kernel (intel/tiny-dpcpp-nn, kernel_esimd.h) as its listing reads (issue 61:
#: IGC 22.43 at 256 GRF, inference, bf16, width 64): 12.3 instructions a dpas, 50 2-D
#: block loads and 2 block stores, no gathers; 8 rows a thread (one dpas repeat count),
#: 16 dpas a layer, the static count taken as 3 layer bodies (48: one 2-D load of a B
#: tile a dpas, 48 + 2 x loads = the 50 loads)
INTEL_KERNEL = {"kernel": "tiny-dpcpp-nn inference (listing counts)", "grf": 256,
                "inst_count": round(12.3 * 48), "dpas": 48, "global_messages": 52,
                "slm_messages": 0, "gathers": 0, "rows_per_thread": 8, "slm_bytes": 0, "work_group": 16}
#: Intel's measured time for that case (arXiv 2403.17607, Table I: 0.083 s / 1000 calls)
INTEL_TABLE1_S = PUBLISHED["inference"]["SYCL on Max 1550"] / 1000
#: the rows the model is stated at (issue 61)
MODEL_ROWS = 2**22


def _messages(k: dict) -> tuple[int, int, int]:
    """(global gathers/scatters, global block messages, SLM messages) of a listing row;
    the gathers of a row are taken as global first (the table counts them together)."""
    if "sends" not in k:
        return k["gathers"], k["global_messages"] - k["gathers"], k["slm_messages"]
    s = k["sends"]
    glob, slm = s["global_load"] + s["global_store"], s["slm_load"] + s["slm_store"]
    gathers = min(k["gathers"], glob)
    return gathers, glob - gathers, slm


def dynamic_dpas(cfg, rows_per_thread: int) -> int:
    """The dpas one thread issues for its rows in the forward: every layer's tile
    products at the padded widths (the listing holds the hidden layer's once)."""
    w = [padded(v) for v in cfg.widths]
    return rows_per_thread // 8 * sum(a // 16 * (b // 16) for a, b in zip(w[:-1], w[1:]))


def launch_shape(cfg) -> dict:
    """What the sycl backend launches for ``cfg``'s forward: rows a thread, work-group
    size, SLM a work-group (sycl_esimd's constants, as they are now)."""
    from ..backends import sycl_esimd as se

    return {"rows_per_thread": 8 * se.row_groups(padded(cfg.hidden_features)),
            "work_group": se.WG, "slm_bytes": getattr(se, "SLM_BYTES", 0)}


def model(k: dict, cfg, n: int, shape: dict, dtype_bytes: int = 2) -> dict:
    """Modelled forward time of ``n`` rows of ``cfg`` (seconds, with its parts) from a
    listing's counts ``k`` (ci/aot_sycl.py's row, or INTEL_KERNEL) and launch ``shape``."""
    rpt, wg = shape["rows_per_thread"], shape["work_group"]
    dyn = dynamic_dpas(cfg, rpt)
    scale = dyn / k["dpas"]  # the listing's work per dpas, repeated as the layers repeat
    gathers, blocks_msgs, slm = _messages(k)
    msgs = gathers + blocks_msgs + slm
    lines = (gathers * GATHER_LINES + blocks_msgs * BLOCK_LINES + slm * SLM_LINES) * scale
    threads = THREADS[k["grf"]]
    if shape["slm_bytes"]:
        threads = min(threads, SLM_PER_CORE // shape["slm_bytes"] * wg // ENGINES)
    blocks = math.ceil(n / rpt)
    threads = max(1, min(threads, math.ceil(blocks / (XE_CORES * ENGINES))))
    per_engine = math.ceil(blocks / (XE_CORES * ENGINES * threads)) * threads
    slow = max(1.0, THREADS_FOR_OVERLAP / threads)
    t_xmx = per_engine * dyn * DPAS_CLOCKS / CLOCK_HZ * slow
    t_issue = per_engine * k["inst_count"] * scale / ISSUE_PER_CLOCK / CLOCK_HZ * slow
    t_l1 = per_engine * ENGINES * lines / L1_LINES_PER_CLOCK / CLOCK_HZ * slow
    t_hbm = n * dtype_bytes * (cfg.in_features + cfg.out_features) / (HBM_TB_S * 1e12)
    parts = {"xmx": t_xmx, "issue": t_issue, "l1": t_l1, "hbm": t_hbm}
    return {"model_s": max(parts.values()), "bound_by": max(parts, key=parts.get),
            **{f"{p}_s": t for p, t in parts.items()}, "threads_per_engine": threads,
            "dpas_per_thread": dyn, "instructions_per_dpas": k["inst_count"] / k["dpas"],
            "gather_share": (k["gathers"] / msgs) if msgs else 0.0}


def calibration() -> dict:
    """The model applied to Intel's published Table I case with Intel's kernel's listing
    counts, and its ratio to Intel's measured 83 us."""
    from .configs import CONFIGS

    cfg = CONFIGS["paper-table1"]
    m = model(INTEL_KERNEL, cfg, cfg.batches[0], INTEL_KERNEL)
    return {**m, "measured_s": INTEL_TABLE1_S, "ratio": m["model_s"] / INTEL_TABLE1_S}


def model_rows(isa: dict, dtype: str = "bf16") -> list[dict]:
    """The model of every standard narrow config's forward (at MODEL_ROWS, and
    paper-table1 at its 2^17) beside its floor, from the ISA table ``isa``."""
    from .configs import CONFIGS

    kernels = {k["kernel"]: k for k in isa.get("kernels", [])}
    cal = calibration()["ratio"]
    out = []
    for cfg in CONFIGS.values():
        if cfg.regime != "narrow" or cfg.name == "odd-batch":
            continue
        n = cfg.batches[0] if cfg.name == "paper-table1" else MODEL_ROWS
        name, k = forward_kernel(cfg, kernels, dtype)
        if not k:
            raise ValueError(f"isa: no forward kernel for {cfg.name} ({name}) in the ISA table")
        floor = n * max(cfg.flops_per_row() / (GEMM_TFLOPS[dtype] * 1e12),
                        2 * (cfg.in_features + cfg.out_features) / (HBM_TB_S * 1e12))
        shape = launch_shape(cfg)
        m = model(k, cfg, n, shape)
        out.append({"config": cfg.name, "rows": n, "dtype": dtype, "kernel": name,
                    "floor_s": floor, **m, "model_over_floor": m["model_s"] / floor,
                    "calibrated_s": m["model_s"] / cal, "shape": shape})
    return out


def model_markdown(isa: dict, dtype: str = "bf16") -> str:
    return rows_markdown(model_rows(isa, dtype), calibration())


def rows_markdown(rows_: list[dict], cal: dict) -> str:
    """The model's rows (``model_rows``, or a committed run's) and its calibration."""
    head = ("| config | rows | floor µs | model µs | model / floor | bound by | model / "
            "calibration µs |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    body = "".join(
        f"| `{r['config']}` | {_rows_label(r['rows'])} | {r['floor_s'] * 1e6:.1f} "
        f"| {r['model_s'] * 1e6:.1f} | {r['model_over_floor']:.2f} | {r['bound_by']} "
        f"| {r['calibrated_s'] * 1e6:.1f} |\n" for r in rows_)
    tail = (f"\nCalibration: Intel's kernel (its listing's counts) at `paper-table1`, 2^17 "
            f"rows, is modelled at {cal['model_s'] * 1e6:.1f} µs against the 83 µs Intel "
            f"measured: ratio {cal['ratio']:.2f} (bound by {cal['bound_by']}).\n")
    return head + body + tail


def _aot_sycl():
    """ci/aot_sycl.py of the checkout (a script, not a package module)."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[2] / "ci" / "aot_sycl.py"
    if not path.exists():
        raise ValueError(f"--compile: {path} not found (run from a checkout)")
    spec = importlib.util.spec_from_file_location("aot_sycl", path)
    mod = sys.modules.setdefault("aot_sycl", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    return mod


def compile_isa(dtype: str = "bf16", workdir: Path | None = None) -> dict:
    """The ISA table of the standard configs' forward kernels as the sources are now,
    compiled for pvc by ci/aot_sycl.py's pipeline (needs ocloc and the sycl runtime)."""
    import tempfile

    import torch

    from ..backends import sycl_esimd as se
    from ..spec import MLPSpec
    from .configs import CONFIGS

    aot = _aot_sycl()
    large = "-DFMLP_ESIMD_LARGE_GRF"
    options = [o for o in se.build_options(False) if o != large]
    grf = 256 if large in se.build_options(False) else 128
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    configs, seen = [], set()
    for cfg in CONFIGS.values():
        if cfg.regime != "narrow":
            continue
        ec = se.config_for(MLPSpec(cfg.widths, cfg.activation, cfg.output_activation,
                                   cfg.bias, torch_dtype))[0]
        if ec.kernel("fwd") not in seen:
            seen.add(ec.kernel("fwd"))
            configs.append(aot.KernelConfig(ec.kernel("fwd"), ec.dpas("fwd"),
                                            ec.instantiation(("fwd",)), grf=grf))
    work = Path(workdir or tempfile.mkdtemp(prefix="pvc-model-"))
    rows_ = aot.isa_table(configs, se.source([]).decode(), se.includes(), work / "esimd",
                          options, jobs=1)
    env = aot.environment(work)
    import subprocess

    dirty = subprocess.run(["git", "status", "--porcelain", "--", "kernels/sycl"],
                           cwd=Path(__file__).resolve().parents[2], capture_output=True,
                           text=True).stdout.strip()
    env["kernel_sources"] = "uncommitted changes" if dirty else "as committed"
    return {"schema": "fusedmlp-pvc-isa/1", "environment": env, "kernels": rows_}


def model_document(isa: dict, dtype: str = "bf16") -> dict:
    """The model's table as a run of the pvc results table (``results add``)."""
    env = dict(isa.get("environment", {}))
    cal = calibration()
    return {"schema": "fusedmlp-pvc-model/1", "environment": env,
            "what": ("python -m fusedmlp_xpu.bench.pvc --model: a static MODEL of the "
                     "ESIMD forward kernels on a Max 1550 (listing counts and launch "
                     "shape -> time), not a measurement"),
            "meta": {"calibration": {k: cal[k] for k in ("model_s", "measured_s", "ratio",
                                                           "bound_by")},
                     "assumptions": {"clock_hz": CLOCK_HZ, "xe_cores": XE_CORES,
                                     "engines": ENGINES, "dpas_clocks": DPAS_CLOCKS,
                                     "issue_per_clock": ISSUE_PER_CLOCK,
                                     "threads_for_overlap": THREADS_FOR_OVERLAP,
                                     "l1_lines_per_clock": L1_LINES_PER_CLOCK,
                                     "hbm_tb_s": HBM_TB_S}},
            "rows": [{**r, "listing": {k: v for k, v in kernel.items()
                                       if k in ("inst_count", "dpas", "sends", "gathers",
                                                "block2d", "grf")}}
                     for r, kernel in zip(model_rows(isa, dtype), _kernels_of(isa, dtype))]}


def _kernels_of(isa: dict, dtype: str) -> list[dict]:
    from .configs import CONFIGS

    kernels = {k["kernel"]: k for k in isa.get("kernels", [])}
    return [forward_kernel(c, kernels, dtype)[1] for c in CONFIGS.values()
            if c.regime == "narrow" and c.name != "odd-batch"]


def committed_model(run: str | None = None) -> dict:
    """The model run of benchmarks/results/pvc.jsonl (the latest, or ``run``)."""
    from . import results

    table = Path(__file__).resolve().parents[2] / results.RESULTS_DIR / "pvc.jsonl"
    docs = results.documents(results.read(str(table)))
    runs = [r for r, d in docs.items() if d.get("schema") == "fusedmlp-pvc-model/1"
            and (run is None or r == run)]
    if not runs:
        raise ValueError(f"run: no model run {run or ''} in {table}".replace("  ", " "))
    return docs[runs[-1]]


def load_isa(path: Path | None = None, run: str | None = None) -> dict | None:
    """The ISA table: a ci/aot_sycl.py JSON file, or a run of benchmarks/results/pvc.jsonl."""
    from . import results

    if path is not None:
        return json.loads(Path(path).read_text())
    if run is None:
        return None
    table = Path(__file__).resolve().parents[2] / results.RESULTS_DIR / "pvc.jsonl"
    if not table.exists():  # an installed package: the checkout the command runs in
        table = Path(results.RESULTS_DIR) / "pvc.jsonl"
    docs = results.documents(results.read(str(table)))
    if run not in docs or "kernels" not in docs[run]:
        raise ValueError(f"--run: no run {run!r} with an ISA table in {table}")
    return docs[run]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusedmlp_xpu.bench.pvc", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", type=Path, help="ci/aot_sycl.py's JSON table")
    ap.add_argument("--run", help="a run id of benchmarks/results/pvc.jsonl")
    ap.add_argument("--dtype", choices=sorted(GEMM_TFLOPS), default="bf16")
    ap.add_argument("--model", action="store_true",
                    help="the static model's table (needs --isa, --run or --compile)")
    ap.add_argument("--compile", action="store_true", help="compile the standard configs' "
                    "forward kernels for pvc now (ocloc) instead of --isa/--run")
    ap.add_argument("--out", type=Path, help="with --model: write the model as a run "
                    "document here (python -m fusedmlp_xpu.bench.results add OUT)")
    args = ap.parse_args(argv)
    if args.out and not args.model:
        ap.error("--out: only with --model")
    if args.model:
        if args.compile:
            isa = compile_isa(args.dtype)
        else:
            isa = load_isa(args.isa, args.run)
        if isa is None:
            ap.error("--model: give --isa, --run or --compile")
        print(model_markdown(isa, args.dtype), end="")
        if args.out:
            args.out.write_text(json.dumps(model_document(isa, args.dtype), indent=1) + "\n")
        return 0
    print(markdown(load_isa(args.isa, args.run), args.dtype), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
