"""What the GEMM probes (probe_tma_gemm.py, probe_gated_tma.py, probe_epilogue.py,
probe_blas.py) share: their size options; check a call against an fp32 reference, time it
(triton.testing.do_bench, warm-up, then the median), print one line and keep one row for
the JSON."""
from __future__ import annotations

import argparse
import json

import triton

from fusedmlp_xpu.backends.triton import wide
from fusedmlp_xpu.bench import environment


def gemm_args(description: str | None = None) -> argparse.ArgumentParser:
    """The probes' shared options: --out (JSON), --m rows, --d model width, --hidden
    (the wide-swiglu-sized block by default); a probe adds its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out")
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=14336)
    return ap


def dx_operands(m, d, hidden, device, dtype):
    """wide-gelu's hidden-layer input gradient (g2 W2) * gelu'(z1), fresh random data:
    (g2 [m, d], W2 [d, hidden], z1 [m, hidden], z1 in fp32, gelu'(z1) in fp32)."""
    import torch

    g2 = torch.randn(m, d, device=device, dtype=dtype)
    w2 = torch.randn(d, hidden, device=device, dtype=dtype) / hidden ** 0.5
    z1 = torch.randn(m, hidden, device=device, dtype=dtype)
    zf = z1.float()
    dgelu = torch.autograd.functional.jvp(
        lambda t: torch.nn.functional.gelu(t, approximate="tanh"), zf, torch.ones_like(zf))[1]
    return g2, w2, z1, zf, dgelu


def time_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


class Probe:
    """``rec(name, fn, ref, flop, case=...)``: ``fn()`` returns a tensor or a tuple of
    them, ``ref`` the matching fp32 tensor(s); a call that raises (a config the device
    refuses) is reported and skipped. ``fixed`` goes into every row."""

    def __init__(self, **fixed):
        self.rows: list[dict] = []
        self.fixed = fixed

    def rec(self, name, fn, ref, flop, case=None, width=44):
        tag = f"[{case}] " if case else ""
        try:
            out = fn()
            outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
            err = max(((o.float() - r).abs().max() / r.abs().max()).item()
                      for o, r in zip(outs, refs))
            ms = time_ms(fn)
        except Exception as e:  # noqa: BLE001 -- out of resources: say so, go on
            print(f"{tag}{name}: {type(e).__name__} {str(e)[:100]}", flush=True)
            return None
        ok = err < 2e-2
        print(f"{tag}{name:{width}s} {ms:.4f} ms {flop / ms / 1e9:6.0f} TFLOP/s err {err:.1e}"
              f"{'' if ok else ' WRONG'}", flush=True)
        row = dict(self.fixed, variant=name, ms=ms, err=err, ok=ok, tflops=flop / ms / 1e9)
        if case:
            row["case"] = case
        self.rows.append(row)
        return row

    def note_fit(self, name):
        """After a TMA variant: the stage count the device accepted, when it stepped
        down (wide._TMA_FIT)."""
        if wide._TMA_FIT and self.rows and self.rows[-1]["variant"] == name:
            self.rows[-1]["stages_that_fit"] = min(wide._TMA_FIT.values())
            print(f"    (ran with {min(wide._TMA_FIT.values())} stages)", flush=True)

    def write(self, path, device):
        if path:
            with open(path, "w") as f:
                json.dump({"environment": environment(device), "rows": self.rows}, f, indent=1)
