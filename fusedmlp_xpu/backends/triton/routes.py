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
or not, over row ranges, optionally bounded by the work of a call (rows x d x hidden):
routed through torch ops a call pays the package's Python in front of eager's ops, which
a call of little work cannot hide. Devices without a rule run the kernels at every row
count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Rule:
    gated: bool
    train: bool
    rows: Ranges  # inclusive [lo, hi] row ranges where torch ops run
    source: str  # the measurement
    min_work: float = 0.0  # and only where rows x d x hidden is at least this
    max_work: float = math.inf  # ... and below this


#: CUDA, by (major, minor) compute capability; None: any CUDA device without its own entry.
#: Train steps of <= 4096 rows: H200, bf16, h200-probe-small-train-20261201b.json (NOTES.md
#: wide history 13): the Triton train path took wide-gelu 742 / 1403 / 5180 us at 16 /
#: 1024 / 4096 rows against torch's ops' 595 / 1295 / 4933; from 8192 rows the kernels
#: were level with eager with less memory.
#: Gated inference up to 2048 rows where rows x d x hidden >= 1e10: H200, the d/hidden
#: pairs of six released models (h200-sweep-swiglu-bf16-20261203.json, bf16, eager / fused
#: paired per batch): from 1e10 of work up to 2048 rows the fused kernels ran 0.76-0.97x
#: eager on every pair (their tiles fill the 132 SMs poorly there); below it 0.92-1.09x
#: (128 rows 0.98-1.08x; 2048/5632 at 256-512 rows 0.92-0.93x); from 4096 rows 1.04-1.14x.
#: Routed as torch ops at 128-2048 rows (h200-sweep-routes-20261203.json, bf16 and fp16,
#: 2048/5632 and 4096/14336): 0.99-1.00x eager from 1e10 of work, but 0.83-0.87x below
#: it (every 128-row call, 2048/5632 at 512), where the package's Python in front of
#: eager's ops shows: below the bound the kernels stay.
#: Non-gated inference up to 2048 rows below 3e10 of work (h200-sweep-routes-20261203.json,
#: wide-gelu: gelu_tanh, bias; 2048/5632 and 4096/14336): the kernels ran 0.61-0.90x eager
#: there in bf16 and 0.62-1.06x in fp16; above it 1.03-1.04x (4096/14336 from 2048 rows;
#: at 512 rows, on the bound, 0.72x in bf16 and 1.04x in fp16). The bound moved to 8e10:
#: in fp16 on the six models' d/hidden (h200-sweep-fp16-all-20261203.json) the kernels ran
#: 0.93-1.04x eager at 3e10-8e10 of work (below 1: 5120/13824 at 512 and 1024 rows 0.93,
#: 4096/14336 at 1024 0.96, 4096/11008 at 1024 0.98; 1.02-1.04 for 4096/14336 at 512 and
#: 2048/8192, 3072/8192 at 2048) and 0.99-1.04x above it; a re-run
#: (h200-sweep-gelu-routed-20261203.json, fp16 and bf16) had 5120/13824 at 512 rows at
#: 0.49-0.69x on the kernels, and the calls routed then (below 3e10, bound to the ops by
#: module._routed_forward) at 0.96-1.05x. Routed, such a call runs eager's own ops: after
#: the move, 5120/13824 at 256-2048 rows ran 0.996-1.007x eager
#: (h200-sweep-gelu-5120-20261204.json). Routed train calls bind to the ops likewise
#: (module._bind_train; h200-host-train-20261204b.json).
#: Gated inference at 512-1023 rows where rows x d x hidden is 5e9-8e9 (H100, both dtypes,
#: h100-wide-sweep-bfloat16-20261205a / h100-wide-sweep-float16-20261205a): the kernels
#: ran 2048/5632 at 512 rows at 0.976x / 0.954x eager, the one gated inference case of
#: either sweep below 0.98x; every other kernel case of the six pairs ran 1.04-1.28x
#: (2048/8192 at 512 rows, 8.6e9 of work: 1.06x / 1.04x, so the bound stops under it).
CUDA_RULES: dict[tuple[int, int] | None, tuple[Rule, ...]] = {
    None: (
        Rule(False, True, ((1, 4096),), "h200-probe-small-train-20261201b.json"),
        Rule(True, True, ((1, 4096),), "h200-probe-small-train-20261201b.json"),
        Rule(True, False, ((1, 2048),), "h200-sweep-swiglu-bf16-20261203.json", min_work=1e10),
        Rule(True, False, ((512, 1023),), "h100-wide-sweep-float16-20261205a", min_work=5e9,
             max_work=8e9),
        Rule(False, False, ((1, 2048),), "h200-sweep-fp16-all-20261203.json", max_work=8e10),
    ),
}

_cache: dict[tuple, Ranges] = {}


def _rules(device: torch.device) -> tuple[Rule, ...]:
    if device.type != "cuda":
        return ()
    try:
        cap = torch.cuda.get_device_capability(device)
    except (AssertionError, RuntimeError):  # no CUDA here (explain() for a named device)
        cap = None
    return CUDA_RULES.get(cap, CUDA_RULES.get(None, ()))


def torch_rows(device: torch.device, gated: bool, train: bool, d: int, hidden: int) -> Ranges:
    """The row ranges where a plain eager call on ``device`` of a layer pair d -> hidden
    runs as torch ops (empty: none). Cached: this runs on every call."""
    key = (device.type, device.index, gated, train, d, hidden)
    got = _cache.get(key)
    if got is None:
        size, out = d * hidden, []
        for rule in _rules(device):
            if rule.gated != gated or rule.train != train:
                continue
            for lo, hi in rule.rows:
                lo = max(lo, math.ceil(rule.min_work / size))
                if rule.max_work != math.inf:
                    hi = min(hi, math.ceil(rule.max_work / size) - 1)
                if lo <= hi:
                    out.append((lo, hi))
        got = _cache[key] = tuple(out)
    return got


def describe(ranges: Ranges) -> str:
    """'1-4096 rows', '128-2048 and 16384 rows'."""
    parts = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges]
    return (" and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
            + " rows")


def describe_rules(device: torch.device, gated: bool, train: bool) -> str:
    """The rules for explain(): '1-4096 rows', '1-2048 rows where rows x d x hidden >=
    1e+10'."""
    parts = []
    for r in _rules(device):
        if r.gated == gated and r.train == train:
            bound = [f">= {r.min_work:.0e}"] if r.min_work else []
            bound += [f"< {r.max_work:.0e}"] if r.max_work != math.inf else []
            parts.append(describe(r.rows) + (f" where rows x d x hidden {' and '.join(bound)}"
                                             if bound else ""))
    return "; ".join(parts)


def sources(device: torch.device, gated: bool) -> list[str]:
    return sorted({r.source for r in _rules(device) if r.gated == gated})
