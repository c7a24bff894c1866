"""The Intel Data Center GPU Max 1550 on the report's page, where nothing has been measured:
the static model of the ESIMD kernels (a ``fusedmlp-pvc-model/1`` run of
benchmarks/results/pvc.jsonl, labelled "model, not measured"), the kernels' PVC listing
(a ``fusedmlp-pvc-isa/1`` run), and the published Table I of Intel's paper (labelled
"published"). Every figure comes from those runs or from pvc.py's tables; the floors are
pvc.py's (max(FLOPs / GEMM rate, bytes / HBM), from the card's specification).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import pvc
from .configs import CONFIGS
from .report_data import md_table, pow2

MODEL_SCHEMA = "fusedmlp-pvc-model/1"
ISA_SCHEMA = "fusedmlp-pvc-isa/1"
SCHEMAS = (MODEL_SCHEMA, ISA_SCHEMA)
DEVICE = "Intel Data Center GPU Max 1550"
MODEL = "Max 1550 model, not measured"
CALIBRATED = "Max 1550 calibrated model, not measured"
PUBLISHED_MAX = "Max 1550 published (Intel's kernels)"
PUBLISHED_H100 = "H100 published (tiny-cuda-nn; eager: PyTorch)"
SOURCE = "Intel, arXiv 2403.17607, Table I: 1000 calls of paper-table1 at 2^17 rows"
#: the summary figure's bar group of each source that is not a measurement
GROUPS = {MODEL: "Max 1550\nmodel", CALIBRATED: "Max 1550\ncalibrated model",
          PUBLISHED_MAX: "Max 1550\npublished", PUBLISHED_H100: "H100\npublished"}


@dataclass
class Row:
    """One row of a config's table: a source at one mode, dtype and batch. ``kind`` is
    "measured", "model" or "published"; times in ms, None where the source has none."""

    source: str
    kind: str
    mode: str
    dtype: str
    rows: int | None
    fused_ms: float | None
    eager_ms: float | None = None
    compile_ms: float | None = None
    x_floor: float | None = None
    machine: str = ""

    @property
    def vs_eager(self) -> float | None:
        if self.eager_ms and self.fused_ms:
            return self.eager_ms / self.fused_ms
        return None


@dataclass
class Intel:
    """The newest model and ISA runs of the tables given (or those --run names)."""

    model_run: str | None = None
    model: dict | None = None
    isa_run: str | None = None
    isa: dict | None = None


def find(docs: list[tuple[str, dict, bool]], runs: list[str] | None = None) -> Intel:
    """The model and ISA runs: the ones ``runs`` names where it names one, else the
    newest (last) in the tables."""
    out = Intel()
    named = [(r, d) for r, d, _ in docs if runs and r in runs]
    for r, d in (named if any(d.get("schema") in SCHEMAS for _, d in named)
                 else [(r, d) for r, d, _ in docs]):
        if d.get("schema") == MODEL_SCHEMA and d.get("rows"):
            out.model_run, out.model = r, d
        elif d.get("schema") == ISA_SCHEMA and d.get("kernels"):
            out.isa_run, out.isa = r, d
    return out


def _floors(at_peak: bool = False) -> dict[tuple[str, int], float]:
    """(config, rows) -> the Max 1550's floor in ms (pvc.rows, bf16): at the GEMM rate
    measured on Aurora, or ``at_peak`` at the XMX peak (the rate the model assumes)."""
    k = "floor_at_peak_ms" if at_peak else "floor_ms"
    return {(r["config"], r["rows"]): r[k] for r in pvc.rows(None, "bf16")}


def rows(config: str, intel: Intel) -> list[Row]:
    """The Max 1550's rows of ``config``'s table (and the published H100's, for
    paper-table1): the model and the model over its calibration, then Table I."""
    out = []
    for r in (intel.model or {}).get("rows", []):
        if r["config"] != config:
            continue
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(r["dtype"], r["dtype"])
        for label, t in ((MODEL, r["model_s"]), (CALIBRATED, r["calibrated_s"])):
            out.append(Row(label, "model", "inference", dtype, r["rows"], t * 1e3,
                           x_floor=t / r["floor_s"], machine="max1550"))
    if config == "paper-table1":
        n = CONFIGS[config].batches[0]
        floor = _floors().get((config, n))
        for mode, table in (("inference", "inference"), ("train", "training")):
            s = pvc.PUBLISHED[table]
            ours = s["SYCL on Max 1550"]  # seconds for 1000 calls = ms a call
            out.append(Row(PUBLISHED_MAX, "published", mode, "—", n, ours,
                           x_floor=ours / floor if floor and mode == "inference" else None,
                           machine="max1550"))
            out.append(Row(PUBLISHED_H100, "published", mode, "—", n,
                           s["tiny-cuda-nn on H100"], eager_ms=s["PyTorch on H100"],
                           machine="h100-published"))
    return out


def floor_levels(config: str) -> dict[str, float]:
    """Rows/s at the Max 1550's floors of ``config`` (the same at every batch: a floor is
    linear in it): at the GEMM rate, and at the XMX peak."""
    out = {}
    for label, at_peak in (("GEMM rate", False), ("XMX peak", True)):
        got = [n / ms * 1e3 for (c, n), ms in _floors(at_peak).items() if c == config]
        if got:
            out[label] = got[0]
    return out


def listing_section(intel: Intel) -> list[str]:
    """The page's Max 1550 section: what the model read from each forward kernel's
    listing, the ISA run's totals, the calibration, and why a model can sit below the
    floor."""
    if intel.model is None and intel.isa is None:
        return ["No Max 1550 run (model or ISA listing) in the tables given: "
                "benchmarks/results/pvc.jsonl holds them."]
    md = []
    if intel.model is not None:
        cal = (intel.model.get("meta") or {}).get("calibration") or {}
        body = []
        for r in intel.model["rows"]:
            k = r.get("listing") or {}
            sends = k.get("sends") or {}
            msgs = sum(sends.get(s, 0) for s in ("global_load", "global_store", "slm_load",
                                                "slm_store"))
            body.append([f"`{r['config']}`", f"`{r['kernel'].removeprefix('fmlp_esimd_')}`",
                         f"{r['instructions_per_dpas']:.1f}",
                         f"{k.get('block2d', '—')} / {k.get('gathers', '—')} / {msgs or '—'}",
                         r["bound_by"], str(r["threads_per_engine"])])
        md += [f"`run {intel.model_run}` ({intel.model.get('what') or 'the static model'}). "
               "Per config, the forward kernel's listing as the model read it:", ""]
        md += md_table(["config", "forward kernel", "instructions / dpas",
                        "2-D block / gather / all messages", "model bound by",
                        "threads / engine"], body)
        if cal:
            md += ["", f"Calibration: Intel's own kernel, modelled the same way at "
                   f"paper-table1, comes to {cal['model_s'] * 1e6:.1f} µs against the "
                   f"{cal['measured_s'] * 1e6:.0f} µs Intel published (ratio "
                   f"{cal['ratio']:.2f}); the calibrated model's rows are the model divided by it."]
    if intel.isa is not None:
        ks = intel.isa["kernels"]
        spills = sum(1 for k in ks if k.get("spill_bytes"))
        grf = sorted({k.get("grf") for k in ks if k.get("grf")})
        md += ["", f"Listing `run {intel.isa_run}`: {len(ks)} kernels compiled for pvc, "
               f"{spills} with spills, GRF {'/'.join(map(str, grf)) or '—'}."]
    md += ["", f"The Max 1550's floor is max(FLOPs / {pvc.GEMM_TFLOPS['bf16']:.0f} TFLOP/s, "
           f"the GEMM rate measured on Aurora's cards, bf16; bytes / {pvc.HBM_TB_S} TB/s); "
           "the model counts the XMX engines at their peak, so a model can sit below that "
           "floor. The model's assumptions and their sources: `docs/intel.md`, "
           "`fusedmlp_xpu/bench/pvc.py`."]
    return md


def appendix(intel: Intel) -> list[str]:
    """The appendix's Max 1550 part: the roofline floors and the ISA figures per config
    (pvc.markdown), the model's whole table, and Table I."""
    md = ["## Intel Max 1550 — floors, listing and model (not measured)", ""]
    if intel.isa is not None:
        md += [f"Floors per config and batch, and the forward kernels of `run {intel.isa_run}`:",
               ""] + pvc.markdown(intel.isa).rstrip("\n").split("\n")
    if intel.model is not None:
        cal = (intel.model.get("meta") or {}).get("calibration")
        if cal:
            md += ["", f"The model, `run {intel.model_run}` (a model, not a measurement):", ""]
            md += pvc.rows_markdown(intel.model["rows"], cal).rstrip("\n").split("\n")
    md += ["", "## Published, not measured here", "", f"{SOURCE}:", ""]
    md += md_table(["implementation, hardware", "inference ms a call", "training ms a call"],
                   [[name, f"{pvc.PUBLISHED['inference'][name]:.3f}",
                     f"{pvc.PUBLISHED['training'][name]:.2f}"]
                    for name in pvc.PUBLISHED["inference"]])
    return md


def rows_label(n: int | None) -> str:
    """2^k, 2^k+r (odd-batch's 2^20+37), or the number below 2^10."""
    if n is None:
        return "—"
    if n < 1024 or n & (n - 1) == 0:
        return pow2(n)
    k = n.bit_length() - 1
    return f"2^{k}+{n - 2 ** k}"
