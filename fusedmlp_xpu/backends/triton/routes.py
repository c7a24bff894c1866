"""Which plain eager calls of wide layers (fused_mlp's, the gated MLP's) run as torch ops
instead of the wide kernels.

Between a decode step and a long prefill there are row counts where cuBLAS's GEMMs with
eager's separate epilogue (F.linear, the activation, the gate product) beat the fused
kernels, or where a train step is host-bound and torch's own autograd graph costs less
than the op's node. There a plain eager call (not compiled, no forced backend, not
``recompute=True``) runs as the reference's torch ops: the same ops, roundings and
saved tensors as eager. Each rule below names the run that measured it; ``explain()``
says which path a given input takes (``Explanation.route``).

Rules are per device type and compute capability, mode (inference or train) and gated
or not, over row ranges; devices without a rule run the kernels at every row count.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Rule:
    gated: bool
    train: bool
    rows: Ranges  # inclusive [lo, hi] row ranges where torch ops run
    source: str  # the measurement


#: CUDA, by (major, minor) compute capability; None: any CUDA device without its own entry.
#: Train steps of <= 4096 rows: H200, bf16, h200-probe-small-train-20261201b.json (NOTES.md
#: wide history 13): the Triton train path took wide-gelu 742 / 1403 / 5180 us at 16 /
#: 1024 / 4096 rows against torch's ops' 595 / 1295 / 4933; from 8192 rows the kernels
#: were level with eager with less memory.
#: Gated inference of 128-2048 rows: H200, bf16, the d/hidden pairs of six released models
#: (h200-sweep-swiglu-bf16-20261203.json, eager / fused paired per batch): the fused
#: kernels ran 0.76-0.94x eager's speed from 256 to 2048 rows on every pair (their tiles
#: fill the 132 SMs poorly there) and 0.98-1.01x at 128; from 1 to 64 rows and from 4096
#: they were 0.97-1.58x and 1.04-1.14x.
CUDA_RULES: dict[tuple[int, int] | None, tuple[Rule, ...]] = {
    None: (
        Rule(False, True, ((1, 4096),), "h200-probe-small-train-20261201b.json"),
        Rule(True, True, ((1, 4096),), "h200-probe-small-train-20261201b.json"),
        Rule(True, False, ((128, 2048),), "h200-sweep-swiglu-bf16-20261203.json"),
    ),
}

_cache: dict[tuple, Ranges] = {}


def _rules(device: torch.device) -> tuple[Rule, ...]:
    if device.type != "cuda":
        return ()
    cap = torch.cuda.get_device_capability(device)
    return CUDA_RULES.get(cap, CUDA_RULES.get(None, ()))


def torch_rows(device: torch.device, gated: bool, train: bool) -> Ranges:
    """The row ranges where a plain eager call on ``device`` runs as torch ops (empty:
    none). Cached per device, gated and mode: this runs on every call."""
    key = (device.type, device.index, gated, train)
    got = _cache.get(key)
    if got is None:
        got = tuple(r for rule in _rules(device) if rule.gated == gated and rule.train == train
                    for r in rule.rows)
        _cache[key] = got
    return got


def describe(ranges: Ranges) -> str:
    """'1-4096 rows', '128-2048 and 16384 rows'."""
    parts = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges]
    return (" and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
            + " rows")


def sources(device: torch.device, gated: bool) -> list[str]:
    return sorted({r.source for r in _rules(device) if r.gated == gated})
