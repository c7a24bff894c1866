"""The Intel Data Center GPU Max 1550 (PVC) side of the vendor report, without the card:
each narrow benchmark config's roofline floor on a Max 1550, the published figures, and
what the ESIMD kernels' ISA (``ci/aot_sycl.py``'s table) says they issue per row.

    python -m fusedmlp_xpu.bench.pvc [--isa TABLE.json | --run RUN-ID]

No timing here is ours: nothing has run on a Max 1550. The floors are max(FLOPs / matrix
rate, minimal bytes / HBM bandwidth), minimal bytes = x read once + y written once in
the operand dtype, as BENCHMARKS.md defines them for the H200.
"""
from __future__ import annotations

import argparse
import json
import math
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
        name = (f"fmlp_esimd_fwd_{dtype}_{padded(cfg.in_features)}_"
                f"{padded(cfg.hidden_features)}_{padded(cfg.out_features)}")
        k = kernels.get(name, {})
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


def markdown(isa: dict | None = None, dtype: str = "bf16") -> str:
    head = ("| config | rows | floor ms (GEMM rate) | floor ms (peak) | bound | dpas a row "
            "| useful MACs | bytes a row | forward kernel | GRF | spills | static dpas |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    body = "".join(
        f"| `{r['config']}` | 2^{math.log2(r['rows']):.0f}"
        f"{'+' + str(r['rows'] - 2 ** int(math.log2(r['rows']))) if r['rows'] & (r['rows'] - 1) else ''} "
        f"| {r['floor_ms']:.3f} | {r['floor_at_peak_ms']:.3f} | {r['bound']} "
        f"| {r['dpas_per_row']:g} | {r['useful_fraction']:.0%} | {r['bytes_per_row']} "
        f"| {r['kernel'].removeprefix('fmlp_esimd_fwd_').replace('_', ' ', 1).replace('_', '/')} "
        f"| {r['grf'] or '—'} "
        f"| {'—' if r['spill_bytes'] is None else r['spill_bytes']} "
        f"| {r['static_dpas'] or '—'} |\n" for r in rows(isa, dtype))
    return head + body


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
    args = ap.parse_args(argv)
    print(markdown(load_isa(args.isa, args.run), args.dtype), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
