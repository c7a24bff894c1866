"""The Triton backend: one source for NVIDIA GPUs, Intel GPUs (Triton's XPU backend) and,
under TRITON_INTERPRET=1, CPU tensors (so CPU CI runs the kernel code itself).

Narrow MLPs (every width <= 128, equal hidden widths, >= 2 layers) run as one fused
kernel (narrow.py); everything else layer by layer as GEMMs with fused epilogues
(wide.py). Host code here: argument packing, tuning tables, launches.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from ... import envvars
from .. import Backend, device_guard, memory, saved_widths
from . import launch
from .launch import fitting, int_key  # plain Python: importable without Triton

MAX_WIDTH = 128
# Hidden 128: the resident weight tiles (fp16/bf16 elements) up to which the forward runs
# persistent (without biases): narrow-w128's 64 -> 128 x 4 -> 64, the only net timed
# there (128 KB)
PERSISTENT_RESIDENT_128 = 64 * 1024
# Wide layers on CUDA: plain eager training calls of up to this many rows run as torch
# ops with torch's autograd graph (Backend.torch_train_rows), measured faster there (H200,
# bf16, h200-probe-small-train-20261201b.json, NOTES.md wide history 13): the Triton train
# path took wide-gelu 742 / 1403 / 5180 us at 16 / 1024 / 4096 rows against torch's ops'
# 595 / 1295 / 4933 (eager 496 / 1322 / 5041). Few rows are host-bound (the op's Python
# autograd node); more rows run cuBLAS's GEMMs, faster than these Triton kernels. From
# 8192 rows the kernels were level with eager there, with less memory (904 vs 1092 MB).
WIDE_TORCH_TRAIN_ROWS = 4096


def wide_torch_train_rows(device: torch.device) -> int:
    """torch_train_rows for wide layers (fused_mlp's and the gated MLP's)."""
    return WIDE_TORCH_TRAIN_ROWS if device.type == "cuda" else 0

# No software pipelining of the layer loop: with Triton's default (3 stages) the weight
# tiles of width 128 asked for 262-720 KB of shared memory on the H200 (limit 227 KB).
NUM_STAGES = 1
# The forward kernels, the split backward's weight-gradient kernel and its resident
# input-gradient chain pad each of in, hidden and out to its own power of two; the other
# backward kernels pad every tile to the widest (history 1 and 19 of benchmarks/NOTES.md).
# False: every tile at the widest, as before (a sweep compares the two in one process).
OWN_PADDING = True
# True: the input-gradient chain that loads its weights per row block pads its own way
# too; wrong input gradients on the H200 (history 19), so off (benchmarks/repro_padding.py)
OWN_PADDING_CHAIN_PER_BLOCK = False


def _interpreting() -> bool:
    return envvars.get("TRITON_INTERPRET", "0") not in ("", "0")


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _own_pads(spec) -> dict:
    """IN_P, H_P and OUT_P, each width padded to its own power of two (OWN_PADDING; fewer
    FLOPs where in, hidden and out differ: narrow-w32's 64 -> 32 -> 64 does 2.9x fewer,
    w128's 64 -> 128 -> 64 1.25x fewer), else all at the widest. Shared: read, never
    modify (a backward asks for it every call)."""
    return _pads(spec, OWN_PADDING, 16)


@functools.lru_cache(maxsize=1024)
def _pads(spec, own: bool, floor: int, in_at_least_hidden: bool = False) -> dict:
    IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
    if not own:
        IN = H = OUT = max(spec.widths)
    if in_at_least_hidden:
        IN = max(IN, H)
    return dict(IN_P=max(floor, _pow2(IN)), H_P=max(floor, _pow2(H)),
                OUT_P=max(floor, _pow2(OUT)))


# --- tuning, one named place per vendor ------------------------------------------------
def _tuning_nvidia(spec, mode: str) -> tuple[int, int]:
    """(BLOCK_M, num_warps) on NVIDIA GPUs, keyed by the padded tile width P.

    Swept on the H200 (Triton 3.6, fp16, 2^22 rows, 4 hidden layers, in/out 64; every
    variant checked against eager before timing; benchmarks/sweep_narrow.py):
      forward  P=64:  BLOCK_M 128 / 4 warps 0.531 ms (64/4: 0.574, 256/8: 0.738)
      forward  P=128: BLOCK_M 256 / 4 warps 1.485 ms (128/4: 1.657, 64/8: 2.305)
      fwd+bwd  P=64:  BLOCK_M 128 / 8 warps 5.61 ms (64/4: 6.07, 256/4: 8.29)
      fwd+bwd  P=128: BLOCK_M 128 / 8 warps 15.8 ms (256/8: 17.4, 64/4: 23.7)
    Narrower P is not swept; it takes P=64's values.
    With in, hidden and out padded each on its own (OWN_PADDING), swept again at in/out
    64, hidden 128 (h200-sweep-w128-fwd-own-padding-20261130.json; the same sweep with
    every tile at 128: -widest-padding-): 128 rows / 4 warps 1.261 ms (widest 1.657),
    256/4 1.309 (1.487), 64/4 1.503 (1.745), 256/8 1.477 (1.671). 128/4 compiles without
    spills there (230 registers; 256/4: 255 and 952 B of spills, sm_90, Triton 3.6), so
    inference takes it when in and out pad narrower than hidden. With in/out at 128 the
    sweep's fastest, 256/4, compiles with 255 registers, 1.2 KB of spills and every wgmma
    serialized (sm_90, Triton 3.6 and 3.9: "insufficient register resources"), and on the
    H200 it faulted under compute-sanitizer memcheck only (illegal address, invalid
    program counter: h200-memcheck-w128-tuning-20261130.txt, -w128-own-padding-; right
    results without a sanitizer). So that case takes 64/4 (168 registers, no spills) and
    fp32 128/8 (tf32x3 spills at every tuning compiled: 608 B there), both memcheck clean
    (h200-memcheck-w128-fwd-tuning-20261202.txt). 128 -> 128 x 4 -> 128 at 2^22 rows
    (h200-probe-fwd-w128-tuning-20261202.json): fp16 64/4 2.03-2.05 ms, 256/4 1.78, 128/4
    1.97-2.03 (48 B of spills), 128/8 2.39; fp32 128/8 9.24, 64/4 15.6, 128/4 30.6, 256/4
    64.5. On sm_90 fp16/bf16 nets from 2^14 rows run the Gluon forward instead.
    fp32 at P=128 backward: 128 rows asked 256 KB of shared memory on the H200 (limit
    227 KB), so fp32 takes 64 rows there (not swept).
    """
    P = _pow2(max(spec.widths))
    if mode == "fwd":
        if P > 64 and max(_pow2(spec.in_features), _pow2(spec.out_features)) < P:
            return 128, 4  # in and out padded narrower (own padding; see below)
        if P > 64:
            return (128, 8) if spec.dtype == torch.float32 else (64, 4)
        return 128, 4
    if mode == "fwd_save":
        # the training forward (stores z; per-block kernel), swept at P=128: 64 / 4 warps
        # 2.53 ms (128/4: 2.55, 128/8: 2.68, 256/8: 3.15, 256/4 -- the inference choice,
        # 255 registers and spills -- 7.07). Narrower P runs persistent up to 5 hidden
        # layers; deeper nets take the inference values (not swept).
        return (64, 4) if P > 64 else (128, 4)
    if P > 64 and spec.dtype == torch.float32:
        return 64, 8
    return 128, 8


def _persistent_nvidia(spec, save: bool = False) -> tuple[int, int, int, int, bool] | None:
    """The forward as a persistent kernel: (BLOCK_M, num_warps, pipeline stages of its
    loop over row blocks, programs per SM, weights loaded once per program), or None for
    one program per row block. ``save``: the training forward that stores z.

    Swept twice on the H200 (Triton 3.6, fp16, in/out 64, 2^22 rows; benchmarks/
    sweep_narrow.py --persistent; every variant checked against eager first):
      W32, 4 hidden: per-block best 0.505 ms (128 rows, 8 warps); persistent 128 rows,
                     8 warps, 3 stages 0.459-0.463 ms (1 or 2 programs per SM)
      W64, 4 hidden: per-block best 0.526-0.529 ms; persistent the same 0.483-0.497 ms
    With 4 warps no persistent variant beat the per-block kernel. Width 128 does not fit:
    the pipelined weight tiles asked 520 KB of shared memory (sm_90 compile). Deeper nets
    stay per-block: the only timing (11 hidden, 2^17 rows) was host-bound, 0.07-0.15 ms a
    call, with the two sweeps ordering the variants differently. A config that does not
    fit falls back to the per-block kernel at its first launch; past padded width 64 the
    forward runs persistent only with its weights resident (_persistent_choice; below).
    With the weights resident (loaded once per program; h200-sweep-persistent-20261130b
    .json, same setup, inference / training forward that stores z):
      W32: 128/8/3 stages/1 per SM, weights per block 0.463 / 0.656 ms; resident
           64/4/3/2 0.360 / 0.631 (best inference of 9; best training forward 128/8/3/1
           resident 0.606)
      W64: per block 0.498 / 0.952; resident 64/4/3/2 0.417 / 0.943 (best inference;
           best training forward 64/4/3/1 resident 0.915)
    Resident halves the shared memory at P=64 (82 vs 182 KB at 64 rows / 3 stages in
    the sm_90 compile): two 4-warp programs fit an SM, two row blocks' chains in flight.
    With in, hidden and out padded each on its own (OWN_PADDING), hidden 32 between in/out
    64 takes 48 KB and 124 registers instead of 80 KB and 183 (sm_90 compile), and does
    2.9x fewer FLOPs. Third sweep (h200-sweep-persistent-20261130c.json, inference /
    training forward):
      W32: widest padding 64/4/3/2 0.357 / 0.635 ms; own padding 64/4/3/2 0.302 / 0.617,
           64/4/3/3 0.283 / 0.630, 64/4/3/4 0.287 / 0.640, 128/4/3/2 0.284 / 0.640
      W64: (padding unchanged) 64/4/3/2 0.391-0.414 / 0.944-0.948 (the same kernel twice:
           the spread is the run's noise), 64/4/3/3 0.398 / 0.961, 128/4/3/2 0.408 / 0.978
    So hidden <= 32 runs three programs per SM; wider keeps two.
    Hidden 128 (in/out 64, 4 hidden, no biases; h200-sweep-persistent-w128-20261201.json,
    two passes, inference / training forward): the per-block kernel 1.272-1.274 / 2.416-
    2.417 ms, which reads every weight tile from L2 for each row block; resident 256/8/2/1
    0.980-0.981 / 2.88-2.97, 128/8/2/1 1.029-1.032 / 1.85-1.88, 128/8/1/1 1.05-1.06 /
    1.82-1.83, 64/4/3/2 1.02-1.04 / 1.736-1.747. One program fits an SM there (sm_90
    compile: 208 KB at 256/8/2, 160 KB at 64/4/3; 248 and 255 registers, no spills).
    So hidden 128 runs resident, 256/8/2 for inference and 64/4/3 storing z, where its
    weight tiles take no more than that net's (PERSISTENT_RESIDENT_128: fewer hidden
    layers are not timed; wider in/out or a fifth hidden weight would not fit beside the
    row tiles).
    With biases, held through the loop every one of those variants spilled registers
    (84-1408 B, sm_90 compile); loaded per row block (_bias_per_block) 128/8/1 and
    128/8/2 do not (relu; 8-24 B with gelu_tanh). Same net with biases, one pass
    (h200-sweep-persistent-w128-bias-20261201.json), inference / training forward: per
    block 1.338 / 2.334 ms; resident 128/8/1/1 1.098 / 1.907, 128/8/2/1 1.183 / 1.883,
    256/8/1/1 1.170 / 3.68, 256/8/2/1 1.242 / 4.00, 64/4/3/2 1.321 / 2.301. So biased
    nets take 128/8/1 for inference and 128/8/2 storing z."""
    if spec.dtype == torch.float32 or spec.n_layers - 2 > 4:
        return None
    pads = _own_pads(spec)
    if pads["H_P"] > 64:
        if not _resident_128(spec):
            return None
        if spec.bias:
            return (128, 8, 2, 1, True) if save else (128, 8, 1, 1, True)
        return (64, 4, 3, 2, True) if save else (256, 8, 2, 1, True)
    if max(pads["IN_P"], pads["OUT_P"]) > 64:  # as before: wider in/out stay per-block
        return None
    return 64, 4, 3, (3 if pads["H_P"] <= 32 else 2), True


class Split(NamedTuple):
    """The backward split in two kernels: the input-gradient chain storing every layer's
    g (``g_block_m`` rows, ``g_warps``; ``g_per_sm`` programs per SM striding over the row
    blocks, or one program per row block when 0; ``g_unroll``: the layer loop unrolled
    and the loop over row blocks pipelined with ``g_stages`` buffers, _mlp_g_kernel;
    ``g_resident``: that kernel loads every weight tile once per program, up to 4
    hidden-to-hidden weights), then the weight
    gradients summed in registers (_mlp_dw_kernel: ``block_m`` rows, ``warps``,
    ``stages`` of its loop). ``g_dw`` (with ``g_resident``): instead, one kernel does
    both, the resident chain adding every layer's weight gradient to partial sums held in
    registers across its row blocks (_mlp_bwd_resident_kernel; no g buffer); where the
    device refuses it, the two kernels run. ``g_maxnreg``: that one kernel compiled with
    at most this many registers a thread (ptxas spills the rest; None: the compiler's
    choice), so that ``g_per_sm`` programs fit an SM's register file."""
    block_m: int
    warps: int
    stages: int
    g_block_m: int = 128
    g_warps: int = 8
    g_per_sm: int = 1
    g_unroll: bool = False
    g_stages: int = 1
    g_resident: bool = False
    g_dw: bool = False
    g_maxnreg: int | None = None


def _split_nvidia(spec) -> Split | None:
    """The split backward's tuning, or None for the one fused backward kernel.

    Swept twice on the H200 (Triton 3.6, fp16, in/out 64, 4 hidden, 2^22 rows, train
    step, benchmarks/sweep_narrow.py --split, h200-sweep-split-20261130{b,c}.json; every
    variant checked against eager first). Every tile is padded to P = 64 at hidden widths
    32 and 64 there (in/out are 64). "Chain": the input-gradient kernel, as (rows, warps,
    programs per SM, pipeline stages), unrolled unless said:
      hidden 32:  fused 5.38-5.41 ms; chain 128/8/1/2 4.06, 64/4/1/3 4.07, 64/4/1/2 4.40;
                  the chain with its layer loop, one program per row block 4.44-5.14
      hidden 64:  fused 5.67 ms; chain 64/4/1/3 4.27-4.30, 128/8/1/2 4.40, 64/4/1/2 4.75;
                  with the layer loop 4.91-5.72
      hidden 128: fused 18.5 ms; split 11.6 (dW 64/4/3 stages, chain 64/4 per row block
                  with its layer loop); unrolled 13.3-13.5 (504 KB of shared memory at 2
                  stages in the sm_90 compile: it does not pipeline there)
    The weight-gradient kernel: 128 rows / 4 warps / 2 stages within 1% of the best of
    six (128/4/3, 256/8/2, 256/4/2, 64/4/3, 128/8/3: 1-14% slower).
    Resident weights in the chain (every weight tile loaded once per program), third
    sweep (h200-sweep-split-20261130d.json): hidden 32 3.63 ms at 64/4/1/3 against 3.86
    without (128/8/1/2 and 64/4/1/3 alike), so hidden 32 takes it; hidden 64 4.26 against
    4.22 without, so it stays off there.
    Per kernel at hidden 64: fused backward 4.28 ms; split: chain 1.43 (2.90 with the
    layer loop) + dW 1.44-1.48 ms.
    64/4/1/3 takes 221 KB of shared memory at 4 hidden layers and 256 KB at 5 (sm_90
    compile, Triton 3.9; the limit is 227 KB): the step-down in _fits covers the latter;
    the hidden-32 choice (resident) buffers only the row tiles per stage (139 KB at 4).
    The unrolled chain was timed at 4 hidden layers and runs up to 5 (3 and 4 hidden-to-
    hidden weights; the persistent forward's limit too); deeper nets keep the layer loop
    (the split where hidden <= 32, the fused kernel otherwise), as swept before. fp32 is not
    swept: it keeps the fused kernel. An unrolled chain the device refuses steps down its
    stages, then falls back to the layer loop (_fits).
    Since then the resident chain and the weight-gradient kernel pad each width on its own
    (_chain_pads, _dw_pads): hidden 32, 3.07 ms a step against 3.38-3.51 with every tile
    at 64; two chain programs per SM (88 KB of shared memory now) 3.11, so one stays
    (h200-sweep-padding-20261130c.json).
    The backward in one kernel (Split.g_dw, ONE_KERNEL_BACKWARD; hidden 32, no biases,
    h200-sweep-one-kernel-20261201.json): 2.383 ms a step at 128 rows / 8 warps / 2
    stages, 2.430 at 64/4/2, 2.783 at 64/8/2, against 3.072 for the two kernels. Then at
    hidden 64 and with biases (h200-sweep-one-kernel-20261201c/d/e.json; z saved; ms a
    step, one kernel at 128/8/2 against the two kernels as chosen before):
      4 hidden, no biases: hidden 64 3.34 against 4.11 (64/4/2 4.22-4.32, 64/8/2 4.28-4.30)
      4 hidden, biases:    hidden 64 3.76-3.79 against 4.12-4.14; hidden 32 3.26 against
                           3.07 (slower; but by default that net recomputes: 2.15 ms)
      5 hidden, no biases: hidden 32 2.69 against 3.43; hidden 64 4.12 against 5.46
    So every net up to 4 hidden-to-hidden weights at hidden <= 64 takes it. Its tuning,
    with z recomputed (the default, RECOMPUTE_ON_CHIP), rows / warps / stages / programs
    per SM (h200-sweep-one-kernel-20261201g/h/i.json):
      hidden 32: 64/4/2/2 1.60 ms (biases 1.91; 5 hidden 1.73) against 128/8/2/1 1.87
                 (2.16; 2.06), 64/4/2/1 1.94, 64/8/2/1 2.33
      hidden 64: 128/8/2/1 2.59 (biases 3.76) against 64/4/2/2 3.61 (5.50), 64/4/2/1 4.02
    64/4/1/2 recomputing (hidden 32, no biases) read out of bounds on the H200
    (h200-sweep-one-kernel-20261201f.txt; the same kernel saving z ran right at 1 stage),
    so that kernel never steps down to 1 stage (_OneKernelBackward).
    More programs per SM under a register cap (Split.g_maxnreg; ptxas: 255 registers and
    204 B of spills uncapped, 656 B at 168, 1228 B at 128), hidden 32, recomputing, 2^22
    rows, interleaved twice (h200-sweep-one-kernel-maxnreg-20261201.json): 64/4/2 with 2
    per SM uncapped 1.18 ms a step, 3 per SM at 168 registers 1.34, 4 at 128 3.09. So no
    cap: the spills cost more than the third program hides.
    Hidden 128 with its chain resident too (in/out 64, 4 hidden, biases; one pass,
    h200-sweep-split-w128-20261201.json): the chain per row block 9.36 ms a step; resident
    and unrolled, 64/4/1 per SM/2 stages 8.10, 128/8/1/1 9.89 (sm_90 compile: 216 KB and
    20 B of spills; 176 KB, none). So where the resident forward's weight tiles would fit
    (_resident_128), the chain is resident at 64/4/1/2; elsewhere per row block. Again
    with the biased forward resident (h200-sweep-split-w128-20261201b.json): 7.51 ms
    against 8.78 per row block; kernel by kernel the chain 3.23 ms, the weight gradients
    2.36, the forward storing z 1.88. Bench, narrow-w128 (no biases), train step 8.63 ->
    7.08 ms (h200-narrow-w128-20261201d/e.json)."""
    if spec.dtype == torch.float32:
        return None
    if _pow2(max(spec.widths)) > 64:
        if _resident_128(spec):
            return Split(64, 4, 3, g_block_m=64, g_warps=4, g_per_sm=1, g_unroll=True,
                         g_stages=2, g_resident=True)
        return Split(64, 4, 3, g_block_m=64, g_warps=4, g_per_sm=0)
    if spec.n_layers - 2 <= 4:
        if ONE_KERNEL_BACKWARD and spec.widths[1] <= 32:
            return Split(128, 4, 2, g_block_m=64, g_warps=4, g_per_sm=2, g_unroll=True,
                         g_stages=2, g_resident=True, g_dw=True)
        if ONE_KERNEL_BACKWARD:
            return Split(128, 4, 2, g_block_m=128, g_warps=8, g_per_sm=1, g_unroll=True,
                         g_stages=2, g_resident=True, g_dw=True)
        return Split(128, 4, 2, g_block_m=64, g_warps=4, g_per_sm=1, g_unroll=True,
                     g_stages=3, g_resident=spec.widths[1] <= 32)
    if spec.widths[1] <= 32:
        return Split(128, 4, 2, g_block_m=128, g_warps=4, g_per_sm=0)
    return None


#: the resident chain sums the weight gradients itself (Split.g_dw) up to 4 hidden-to-
#: hidden weights at hidden width <= 64; off: the two kernels (the sweeps compare both)
ONE_KERNEL_BACKWARD = True
#: where the backward is that one kernel, training by default (recompute=None) saves no
#: pre-activations: the kernel computes them again from x (TritonBackend.recomputes;
#: h200-sweep-one-kernel-20261201d/e.json, train step, 2^22 rows, fp16, in/out 64, the one
#: kernel at 128 rows / 8 warps / 2 stages, recomputing against saving):
#:   4 hidden, no biases: hidden 32 1.854 ms against 2.367; hidden 64 2.577 against 3.336
#:   4 hidden, biases:    hidden 32 2.152 / 3.261 (two kernels 3.070); 64 3.737 / 3.757
#:   5 hidden, no biases: hidden 32 2.048 / 2.688; hidden 64 3.529 / 4.116
#: (hidden 32 then took 64 rows / 4 warps / 2 per SM: 1.60 recomputing, 2.03 saving)
RECOMPUTE_ON_CHIP = True


def _layer_stages_nvidia(spec, mode: str) -> int:
    """num_stages of the loop over layers in the per-block forward ("fwd", "fwd_save"),
    the fused backward ("bwd") and the split backward's input-gradient chain with its
    layer loop ("g"): Triton's pipeliner then fetches the next layer's weights (and,
    backward, its saved z) while this layer computes.
    Swept on the H200 (sweep_narrow.py --stages, h200-sweep-stages-20261130.json; fp16,
    in/out 64, 2^22 rows; one value for every mode of a run; inference per-block):
      inference: stages 1 best everywhere (W32/W64, 4 and 11 hidden: 0.548/0.568/1.111/
                 1.155 ms; 3 stages 2-4% slower)
      train, W32 (split, chain with the layer loop): 4 hidden 5.11 / 4.69 / 4.42 ms at
                 1 / 2 / 3; 11 hidden 12.55 / 11.10 / 10.05
      train, W64 (fused backward): 4 hidden 5.65 / 5.96 / 5.73; 11 hidden 15.09 / 15.00 /
                 13.32
    So the training kernels take 3 past 5 hidden layers (timed at 4 and 11; 5 takes 1,
    untimed), and the chain with the layer loop always; at padded width 128 (not swept)
    the default 3 asked 262-720 KB of shared memory (limit 227 KB): 1."""
    if mode == "fwd" or _pow2(max(spec.widths)) > 64:
        return 1
    return 3 if mode == "g" or spec.n_layers - 2 > 4 else 1


def _tuning_intel(spec, mode: str) -> tuple[int, int]:
    """(BLOCK_M, num_warps) on Intel GPUs through Triton's XPU backend (not measured here)."""
    return (64, 8) if _pow2(max(spec.widths)) > 64 else (128, 8)


def _tuning_interpreter(spec, mode: str) -> tuple[int, int]:
    # the interpreter runs each program in numpy: fewer, larger blocks are faster
    return 64, 1


@functools.lru_cache(maxsize=1024)
def _tuning_cached(device_type: str, spec, mode: str) -> tuple[int, int, int]:
    if device_type == "cpu":
        return (*_tuning_interpreter(spec, mode), NUM_STAGES)
    if device_type == "xpu":
        return (*_tuning_intel(spec, mode), NUM_STAGES)
    return (*_tuning_nvidia(spec, mode), _layer_stages_nvidia(spec, mode))


def _tuning(device: torch.device, spec, mode: str) -> tuple[int, int, int]:
    """(BLOCK_M, num_warps, num_stages of the layer loop) of a launch in ``mode``, looked up
    once per (device type, spec, mode)."""
    return _tuning_cached(device.type, spec, mode)


def _split_backward(device: torch.device, spec) -> Split | None:
    """The split backward's tuning here, or None for the fused backward; worked out once
    per spec (every train step asks: the forward's recompute choice, then backward)."""
    return _split_cached(spec, ONE_KERNEL_BACKWARD) if device.type == "cuda" else None


@functools.lru_cache(maxsize=512)
def _split_cached(spec, one_kernel: bool) -> Split | None:
    # one_kernel: the switch _split_nvidia reads, part of the key so flipping it counts
    return _split_nvidia(spec)


def _one_kernel(split: Split | None, spec) -> bool:
    """Whether the backward with ``split`` is the one kernel: Split.g_dw with every weight
    tile resident, which holds up to 4 hidden-to-hidden weights."""
    return (split is not None and split.g_dw and split.g_resident
            and spec.n_layers - 2 <= 4)


#: (kernel, device index, spec) -> the most pipeline stages of its row-block loop with
#: which the unrolled kernel fits on the device (0: none), once a launch was refused
_FIT: dict = {}


def _fits(mode: str, device: torch.device, spec, grid, args, consts, warps,
          least: int = 1, **options) -> bool:
    """Launch the unrolled kernel ``mode`` ("fwd_persistent", "g") with up to
    consts["STAGES"] pipeline stages. Where the device refuses it (Triton's OutOfResources:
    every layer's tiles are buffered per stage; seen with a newer Triton's pipeliner, and
    for deep nets), one stage fewer, down to ``least`` (1 unless said); the count that
    fits is remembered for (mode, device, spec; the forward passes (spec, save): its two
    plans are tuned apart). False when none fits: the caller launches
    the kernel with the layer loop instead (or, for the one-kernel backward, the two
    kernels). ``options``: more compile options (maxnreg)."""
    most = consts["STAGES"]
    return fitting(_FIT, (mode, device.index, spec), most, lambda s: _launcher(mode).launch(
        grid, args, consts if s == most else dict(consts, STAGES=s), device, num_warps=warps,
        num_stages=NUM_STAGES, **options), least)


def _persistent_choice(device: torch.device, spec, save: bool = False
                       ) -> tuple[int, int, int, int, bool] | None:
    """The persistent forward a plan runs (_persistent), or None: one program per row
    block. Past padded width 64 only with the weights resident, whatever the tuning
    says: the kernel that loads its weights per row block overflows shared memory there
    (520 KB at 256 rows / 3 stages), and under compute-sanitizer 64 rows / 4 warps / 2
    stages of it died with an invalid program counter on the H200."""
    p = _persistent(device, spec, save)
    if (p is not None and _launch_meta(spec, device.type)["H_P"] > 64
            and not (p[4] and spec.n_layers - 2 <= 4)):
        return None
    return p


def _bias_per_block(pads) -> bool:
    """Whether the resident persistent forward loads its biases for each row block
    instead of holding them through its loop: past padded hidden width 64, where the
    held bias vectors spill registers (sm_90 compile, hidden 128 between in/out 64,
    biased: 352 B at 64 rows / 4 warps / 3 stages storing z, none loading them per
    block). Timed: _persistent_nvidia."""
    return pads["H_P"] > 64


def _bwd_bias_per_block(spec) -> bool:
    """Whether the recomputing one-kernel backward loads its biases for each row block
    (as _bias_per_block for the forward): at padded hidden width 64 and wider. sm_90
    compile, in/out 64, 4 hidden, biases, recomputing, the package's tunings: hidden 64
    at 128 rows / 8 warps 952 B of spills held, 764 loaded per block; hidden 32 at 64 / 4
    332 and 344. Train step on the H200, 2^22 rows, fp16, interleaved twice
    (h200-sweep-one-kernel-bias-per-block-20261201.json): hidden 64 3.496-3.498 ms held,
    3.062-3.066 per block; hidden 32 1.471-1.473 held, 1.662 per block."""
    return _pow2(spec.widths[1]) >= 64


def _resident_128(spec) -> bool:
    """Hidden padded to 128, and every weight tile (each width padded on its own) takes
    no more than narrow-w128's: the nets whose resident kernels were timed at width 128
    (PERSISTENT_RESIDENT_128)."""
    pads = _own_pads(spec)
    IN_P, H_P, OUT_P = pads["IN_P"], pads["H_P"], pads["OUT_P"]
    return H_P == 128 and H_P * (IN_P + (spec.n_layers - 2) * H_P + OUT_P) \
        <= PERSISTENT_RESIDENT_128


def _persistent(device: torch.device, spec, save: bool = False
                ) -> tuple[int, int, int, int, bool] | None:
    """(BLOCK_M, warps, stages, programs per SM, weights resident) when the forward
    (storing z when ``save``) runs persistent here."""
    if device.type != "cuda" or _FIT.get(("fwd_persistent", device.index, (spec, save))) == 0:
        return None
    return _persistent_nvidia(spec, save)


_SM_COUNT: dict = {}


def _n_programs(device: torch.device, n_blocks: int, per_sm: int = 1) -> int:
    """Persistent-grid size: ``per_sm`` programs per multiprocessor (backward: one, 5.61 ms
    vs 5.63 ms with two, fwd+bwd, P=64, H200)."""
    if device.type == "cuda":
        if device.index not in _SM_COUNT:
            _SM_COUNT[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(n_blocks, per_sm * _SM_COUNT[device.index]))
    if device.type == "xpu":
        return max(1, min(n_blocks, 512))
    return max(1, min(n_blocks, 4))


class TritonBackend(Backend):
    name = "triton"
    device_types = ("cuda", "xpu", "cpu")
    # fp32 dots run on tensor cores as tf32x3 (three tf32 products: near-fp32 accuracy)
    uses_tf32 = True

    def available(self):
        try:
            import triton  # noqa: F401
        except Exception as e:
            return False, f"triton not importable ({type(e).__name__}: {e}); pip install triton"
        from . import narrow  # noqa: F401  (compiles nothing yet; checks the source imports)
        return True, f"triton {triton.__version__}"

    def supports(self, spec, device):
        if device.type == "cpu" and not _interpreting():
            return False, "CPU tensors need TRITON_INTERPRET=1 (the interpreter; for testing)"
        if spec.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return False, f"dtype {spec.dtype} not supported (fp16, bf16, fp32)"
        if not _narrow(spec):
            why = ("wide layers: one GEMM per layer with bias and activation fused in the "
                   "epilogue (wide.py)")
            rows = self.torch_train_rows(spec, device)
            if rows:
                why += (f"; plain eager training calls of <= {rows} rows run as torch ops "
                        "with torch's autograd (measured faster there)")
            if device.type == "cuda":
                from . import gluon_wide

                if gluon_wide.available(device, spec.dtype):
                    why += ("; backward on sm_90: the input gradient through an activation "
                            "is a warp-specialized Gluon GEMM (its epilogue overlapped with "
                            "the next tile's MMAs)")
            return True, why
        why = f"fully-fused narrow kernel (widths <= {MAX_WIDTH}, one kernel)"
        if device.type == "cuda":
            from . import gluon_narrow

            ok, why_not = gluon_narrow.eligible(spec, device)
            why += ("; inference on sm_90 from {} rows: the Gluon kernel (two row blocks "
                    "per warpgroup, asynchronous MMAs, TMA)".format(GLUON_MIN_ROWS) if ok
                    else f"; not the Gluon inference kernel: {why_not}")
        p = _persistent_choice(device, spec)
        if p is not None:
            why += (f"; inference: persistent programs, {p[0]} rows / {p[1]} warps"
                    + (", weights resident" if p[4] else ""))
        if self.recomputes(spec, device):
            why += ("; training: the backward in one kernel too, recomputing the "
                    "pre-activations on chip (the forward saves none)")
            if device.type == "cuda":
                from . import gluon_backward

                ok, why_not = gluon_backward.eligible(spec, device)
                why += ("; that backward on sm_90 from {} rows: the Gluon kernel "
                        "(asynchronous weight-gradient MMAs, TMA)".format(GLUON_MIN_ROWS)
                        if ok else f"; not the Gluon backward: {why_not}")
        return True, why

    # -- launches -----------------------------------------------------------------------
    def _common(self, x, weights, biases, spec):
        from . import narrow

        IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
        wh = _stacked(weights[1:-1]) if spec.n_layers > 2 else None
        return narrow, IN, H, OUT, _launch_meta(spec, x.device.type), wh

    def forward(self, x, weights, biases, spec, save):
        if not _narrow(spec):
            from . import wide

            return wide.forward(x, weights, biases, spec, save)
        return _forward_plan(spec, x.device, save)(x, weights, biases)

    def bind_forward(self, spec, device, weights, biases):
        """A no-grad forward ``x -> y`` bound to these very weights and biases (their
        addresses read now), for a caller that re-checks them every call (module.py); or
        None where nothing is gained: wide layers, no lean launches here, or parameters
        the kernel cannot read in place (copies, misaligned)."""
        if not _narrow(spec):
            return None
        return _forward_plan(spec, device, False).bind(weights, biases)

    def recomputes(self, spec, device):
        """Where the backward is the one kernel (Split.g_dw): it computes every row block's
        pre-activations again from x on chip, so the forward saves nothing (measured
        faster: RECOMPUTE_ON_CHIP)."""
        return RECOMPUTE_ON_CHIP and _narrow(spec) and _one_kernel(
            _split_backward(device, spec), spec)

    def torch_train_rows(self, spec, device):
        return 0 if _narrow(spec) else wide_torch_train_rows(device)

    def backward(self, grad_y, x, weights, biases, saved, spec, needs):
        """Fused: one persistent kernel walks the rows back through every layer and adds
        its weight/bias partials into an fp32 scratch. Split (``_split_backward``): that
        kernel only stores every layer's g (no weight-gradient work in it), then
        _mlp_dw_kernel sums g^T act(z) per program in registers into the same scratch
        layout (costs a [M, S] g buffer beside z). One kernel (``Split.g_dw``, weights
        resident): the chain sums those itself, with no g buffer. Either way one
        reduction follows."""
        if not _narrow(spec):
            from . import wide

            return wide.backward(grad_y, x, weights, biases, saved, spec, needs)
        need_x, need_w, need_b = needs
        weights, biases = _dense(weights), _dense(biases)
        M = x.shape[0]
        if saved is None and M >= GLUON_MIN_ROWS:
            plan = _gluon_backward_plan(spec, x.device, need_x, need_w, need_b)
            out = None if plan is None else _gluon_backward(plan, grad_y, x, weights, biases)
            if out is not None:
                return out
        need_wb = need_w or need_b
        # nothing saved (recompute): the one kernel also when only x needs a gradient
        split = (_split_backward(x.device, spec) if M > 0 and (need_wb or saved is None)
                 else None)
        if _one_kernel(split, spec):  # the backward in one kernel, if it fits
            out = _backward_plan(spec, x.device, split, needs, saved is None)(
                grad_y, x, weights, biases, saved)
            if out is not None:
                return out
            if saved is None:  # refused at every stage count: save, then as if saved
                _, saved = self.forward(x, weights, biases, spec, save=True)
                return self.backward(grad_y, x, weights, biases, saved, spec, needs)
        narrow, IN, H, OUT, meta, wh = self._common(x, weights, biases, spec)
        L_HID = spec.n_layers - 2
        if not need_wb:
            split = None  # x's gradient alone: the fused kernel
        if saved is None:  # recompute: the forward once more, saving
            _, saved = self.forward(x, weights, biases, spec, save=True)
        z = saved if saved.stride(-1) == 1 else saved.contiguous()
        grad_y = grad_y if grad_y.stride(-1) == 1 else grad_y.contiguous()
        T_P = meta["H_P"]  # every tile is padded to this one width
        gx = memory.new_empty(M, IN, like=x) if need_x else x
        # per program and layer: the padded weight tile's partial sum, then the bias's
        W_SLOT, SLOT = T_P * T_P, T_P * T_P + T_P
        block_m, warps, stages = _tuning(x.device, spec, "bwd" if split is None else "g")
        if split is not None:  # the input-gradient chain's rows and warps are the split's
            block_m, warps = split.g_block_m, split.g_warps
        n_blocks = triton_cdiv(M, block_m)
        if split is not None and split.g_per_sm == 0:
            P = n_blocks
        else:
            P = _n_programs(x.device, n_blocks, split.g_per_sm if split is not None else 1)
        g = acc = grad_y  # placeholders for pointers a launch does not use
        if split is not None:
            g = memory.new_empty(M, (L_HID + 1) * H + (
                OUT if spec.output_activation != "none" else 0), like=x)
        elif need_wb:  # every program adds into its slot: zeros first
            acc = torch.zeros(P, spec.n_layers, SLOT, device=x.device, dtype=torch.float32)
        if M > 0:
            ptrs = (grad_y, x, weights[0], wh if wh is not None else weights[0], weights[-1],
                    z, gx)
            strides = (grad_y.stride(0), x.stride(0), x.stride(1), z.stride(0), g.stride(0))
            resident = split is not None and split.g_resident and L_HID <= 4
            with device_guard(x):
                if not (split is not None and split.g_unroll and _fits(
                        "g", x.device, spec, (P,), (*ptrs, g, M, IN, H, OUT, n_blocks, *strides),
                        dict(meta, **_chain_pads(spec, resident), L_HID=L_HID,
                             NEED_X=need_x, BLOCK_M=block_m, STAGES=split.g_stages,
                             RESIDENT=resident), warps)):
                    # the fused kernel adds [T_P, T_P] partials into the scratch: T_P tiles
                    _launcher("bwd").launch(
                        (P,), (*ptrs, acc, g, M, IN, H, OUT, L_HID, n_blocks, *strides),
                        dict(meta, **({} if split is None else _chain_pads(spec, False)),
                             W_SLOT=W_SLOT, SLOT=SLOT, NEED_X=need_x,
                             NEED_W=need_w and split is None, NEED_B=need_b and split is None,
                             STORE_G=split is not None, BLOCK_M=block_m), x.device,
                        num_warps=warps, num_stages=stages)
                if split is not None:
                    acc = _split_weight_grads(grad_y, x, z, g, spec, meta, split, need_b,
                                              W_SLOT, SLOT)
        gws, gbs = [], []
        if need_wb:
            gws, gbs = _reduce_grads(acc, spec, T_P, W_SLOT, SLOT, need_w, need_b, x)
        return (gx if need_x else None), gws, gbs


@functools.lru_cache(maxsize=512)
def _backward_plan(spec, device: torch.device, split: Split, needs: tuple,
                   recompute: bool) -> "_OneKernelBackward":
    return _OneKernelBackward(spec, device, split, needs, recompute)


class _OneKernelBackward:
    """The backward as ONE kernel (``Split.g_dw``) for one (spec, device, split, needs,
    recompute), worked out once: the resident chain also sums the weight gradients
    (_mlp_bwd_resident_kernel) into per-program partials [P, layers, SLOT] (every program
    writes all its slots: no zero-fill), then one reduction writes every gradient.
    ``recompute``: nothing was saved; the kernel computes the pre-activations again from x.

    As _NarrowForward: on CUDA, once both launches have compiled, a later call whose
    arguments specialize alike (x's rows and strides, the pointers' alignment: the rest
    is fixed by the spec) launches the two kept kernels directly: on a train step's
    backward that host work is most of the cost at small row counts."""

    def __init__(self, spec, device: torch.device, split: Split, needs: tuple,
                 recompute: bool):
        self.spec, self.device, self.split, self.recompute = spec, device, split, recompute
        self.need_x, self.need_w, self.need_b = needs
        self.IN, self.H, self.OUT = spec.in_features, spec.widths[1], spec.out_features
        self.L_HID = L_HID = spec.n_layers - 2
        meta = _launch_meta(spec, device.type)
        T_P = meta["H_P"]  # the scratch's slots: a weight tile, then a bias
        W_SLOT, SLOT = T_P * T_P, T_P * T_P + T_P
        self.SLOT = SLOT
        self.mode = "bwd_recompute" if recompute else "bwd_resident"
        self.consts = dict(
            _one_kernel_pads(spec), L_HID=L_HID, T_P=T_P, W_SLOT=W_SLOT, SLOT=SLOT,
            ACT=meta["ACT"], OUT_ACT=meta["OUT_ACT"], NEED_X=self.need_x,
            NEED_W=self.need_w, NEED_B=self.need_b, F32=meta["F32"], PREC=meta["PREC"],
            BLOCK_M=split.g_block_m, STAGES=split.g_stages, RECOMPUTE=recompute,
            HAS_BIAS=recompute and spec.bias,
            BIAS_PER_BLOCK=recompute and spec.bias and _bwd_bias_per_block(spec))
        self.grads = self.need_w or self.need_b
        self.reduce = _reduce_layout(spec, T_P, W_SLOT, SLOT, self.need_w, self.need_b,
                                     device.type)
        self.lean = launch.enabled(device)
        # a register cap only where the GPU compiler takes one (not in the interpreter)
        self.options = ({"maxnreg": split.g_maxnreg}
                        if split.g_maxnreg and device.type == "cuda" else {})
        self._entries: dict = {}  # key bits -> (chain entry, reduction entry)
        if self.lean:
            self._max_programs = _n_programs(device, 1 << 62, max(1, split.g_per_sm))

    def __call__(self, grad_y, x, weights, biases, z):
        """-> (gx or None, weight gradients, bias gradients), or None where the device
        refuses the kernel at every stage count (the caller then runs two kernels)."""
        M, split = x.shape[0], self.split
        z = x if z is None else z if z.stride(-1) == 1 else z.contiguous()
        grad_y = grad_y if grad_y.stride(-1) == 1 else grad_y.contiguous()
        wh = _stacked(weights[1:-1]) if self.L_HID else weights[0]
        b0 = bh = bl = x
        if self.recompute and biases is not None:
            b0, bl = biases[0], biases[-1]
            bh = _stacked(biases[1:-1]) if self.L_HID else x
        gx = memory.new_empty(M, self.IN, like=x) if self.need_x else x
        n_blocks = triton_cdiv(M, split.g_block_m)
        if split.g_per_sm == 0:  # one program per row block
            P = n_blocks
        else:
            P = (min(n_blocks, self._max_programs) if self.lean
                 else _n_programs(self.device, n_blocks, split.g_per_sm))
        acc = torch.empty(P, self.spec.n_layers, self.SLOT, device=x.device,
                          dtype=torch.float32)
        ptrs = (grad_y, x, weights[0], wh, weights[-1], z, gx, acc, b0, bh, bl)
        xs0, xs1 = x.stride()
        args = (*ptrs, M, self.IN, self.H, self.OUT, n_blocks, grad_y.stride(0), xs0, xs1,
                z.stride(0))
        out = memory.new_empty(self.reduce.numel, like=x) if self.grads else None
        key = None
        if self.lean:
            aligned = not (grad_y.data_ptr() | x.data_ptr() | weights[0].data_ptr()
                           | wh.data_ptr() | weights[-1].data_ptr() | z.data_ptr()
                           | gx.data_ptr() | b0.data_ptr() | bh.data_ptr() | bl.data_ptr()
                           | (0 if out is None else out.data_ptr())) & _ALIGN
            # acc is fp32 from the allocator: always aligned; every other int is the spec's
            key = (int_key(M) | int_key(xs0) << 3 | int_key(xs1) << 6
                   | int_key(z.stride(0)) << 9 | int_key(n_blocks) << 12
                   | int_key(P) << 15) if aligned else None
            hit = None if key is None else self._entries.get(key)
            if hit is not None and launch.direct_ok(self.device.index):
                _launcher(self.mode).launch_entry(hit[0], (P,), args, self.device.index)
                if out is not None:
                    _launcher("reduce").launch_entry(
                        hit[1], self.reduce.grid, (acc, out, P, self.IN, self.H, self.OUT,
                                                   self.L_HID), self.device.index)
                return self._grads(gx, out)
        with device_guard(x):
            # recomputing, never at 1 stage: 64 rows / 4 warps / 1 stage, two programs per
            # SM (hidden 32, no biases) read out of bounds on the H200 (NOTES narrow
            # history 23)
            if not _fits(self.mode, self.device, self.spec, (P,), args, self.consts,
                         split.g_warps, 2 if self.recompute else 1, **self.options):
                return None
            if out is not None:
                _reduce_launch(acc, out, self.reduce, self.IN, self.H, self.OUT,
                               self.L_HID, self.device)
        if key is not None and not launch._hooked():
            self._keep(key, args, acc, out)
        return self._grads(gx, out)

    def _keep(self, key, args, acc, out):
        """The two launches just made, kept for direct launches of this specialization."""
        most = self.consts["STAGES"]
        fit = _FIT.get((self.mode, self.device.index, self.spec), most)
        chain = _launcher(self.mode).cached(
            args, self.consts if fit == most else dict(self.consts, STAGES=fit),
            self.device, num_warps=self.split.g_warps, num_stages=NUM_STAGES, **self.options)
        red = None
        if out is not None:
            red = _launcher("reduce").cached(
                (acc, out, acc.shape[0], self.IN, self.H, self.OUT, self.L_HID),
                self.reduce.consts, self.device, num_warps=4, num_stages=1)
        if chain is not None and (out is None or red is not None):
            self._entries[key] = (chain, red)

    def _grads(self, gx, out):
        gws, gbs = self.reduce.views(out) if out is not None else ([], [])
        return (gx if self.need_x else None), gws, gbs


def _one_kernel_pads(spec) -> dict:
    """The one-kernel backward's tile widths: each its own (_own_pads), but in no
    narrower than hidden. With in padded narrower than hidden and hidden-to-hidden layers
    (17 -> 33 x 3 -> 9) the first layer's weight gradient came out NaN on the H200
    (Triton 3.6; right in the interpreter; benchmarks/repro_padding.py --chain
    one-kernel, NOTES history 22). Shared: read, never modify."""
    return _pads(spec, OWN_PADDING, 16, True)


def _chain_pads(spec, resident: bool) -> dict:
    """The split backward's input-gradient chain's tile widths over _launch_meta's (every
    tile at the widest): the resident chain pads each width on its own; a chain that loads
    its weights per row block keeps the widest unless OWN_PADDING_CHAIN_PER_BLOCK (with in
    padded narrower than hidden it gave wrong input gradients on the H200: history 19 of
    benchmarks/NOTES.md)."""
    return _own_pads(spec) if resident or OWN_PADDING_CHAIN_PER_BLOCK else {}


@functools.lru_cache(maxsize=512)
def _forward_plan(spec, device: torch.device, save: bool) -> "_NarrowForward":
    return _NarrowForward(spec, device, save)


_ALIGN = 15  # Triton specializes a pointer on 16-byte alignment


class _NarrowForward:
    """The narrow forward of one (spec, device, save): tuning, constexprs and launch rule
    worked out once, not per call (host time is the whole cost of a small call).

    On CUDA, once a launch has compiled, later calls whose arguments specialize alike
    launch the compiled kernel directly (launch.py). Only x's row count and strides and
    the pointers' alignment can change the specialization here (every tensor has the
    spec's dtype, every other int is fixed by the spec), so that is the key: a few bits
    instead of a key over ~20 arguments. Calls with a misaligned pointer, another current
    device or a launch hook installed take the general path. The launcher gets the
    tensors, not their addresses as ints: ints skip the driver's pointer translation, and
    under compute-sanitizer memcheck int-address launches read wrong values (fp32, padded
    width 128, H200). ``launch.enabled`` (its environment variables) is read when the
    plan is made."""

    def __init__(self, spec, device: torch.device, save: bool):
        self.spec, self.device, self.save = spec, device, save
        self.IN, self.H, self.OUT = spec.in_features, spec.widths[1], spec.out_features
        self.L_HID = spec.n_layers - 2
        self.S = sum(saved_widths(spec))
        meta = _launch_meta(spec, device.type)
        self.consts = dict(meta, HAS_BIAS=spec.bias, SAVE=save)
        self.persistent = _persistent_choice(device, spec, save)
        self.pads = _own_pads(spec)
        self.bias_per_block = _bias_per_block(self.pads)  # the persistent kernel's
        self.tuning = _tuning(device, spec, "fwd_save" if save else "fwd")
        self.lean = launch.enabled(device)
        # the no-grad forward on sm_90: the Gluon kernel (gluon_narrow.py) from
        # GLUON_MIN_ROWS rows, for x it can read by TMA
        self.gluon = None if save else _gluon_plan(spec, device)
        self._entries: dict = {}  # key bits -> (entry, persistent?)
        self._exact: dict = {}  # (rows, strides) -> an entry of _entries (bound calls)
        if self.lean:
            self._max_programs = (_n_programs(device, 1 << 62, self.persistent[3])
                                  if self.persistent else 0)

    def __call__(self, x, weights, biases):
        weights, biases = _dense(weights), _dense(biases)
        M, OUT, L_HID = x.shape[0], self.OUT, self.L_HID
        if self.gluon is not None and M >= GLUON_MIN_ROWS:
            y = self._gluon(x, weights, biases)
            if y is not None:
                return y, None
        y = memory.new_empty(M, OUT, like=x)  # through memory: the tests poison outputs
        z = saved = memory.new_empty(M, self.S, like=x) if self.save else None
        if z is None:
            z = y  # a dummy when not saving
        wh = _stacked(weights[1:-1]) if L_HID else weights[0]
        if biases is not None:
            b0, bl = biases[0], biases[-1]
            bh = _stacked(biases[1:-1]) if L_HID else x
        else:
            b0 = bh = bl = x
        if M == 0:
            return y, saved
        ptrs = (x, weights[0], wh, weights[-1], b0, bh, bl, y, z)
        xs0, xs1 = x.stride()
        strides = (xs0, xs1, OUT, z.stride(0))
        if not self.lean:
            self._launch(x, ptrs, M, strides)
            return y, saved
        aligned = not (x.data_ptr() | weights[0].data_ptr() | wh.data_ptr()
                       | weights[-1].data_ptr() | b0.data_ptr() | bh.data_ptr()
                       | bl.data_ptr() | y.data_ptr() | z.data_ptr()) & _ALIGN
        hit = self._hit(M, xs0, xs1) if aligned else None
        if hit is None or not launch.direct_ok(self.device.index):
            hit = self._launch(x, ptrs, M, strides)
            if aligned and hit is not None:  # kept only for an all-aligned specialization
                self._entries[int_key(M) | int_key(xs0) << 3 | int_key(xs1) << 6] = hit
        else:
            self._launch_kept(hit, ptrs, M, strides)
        return y, saved

    def _hit(self, M: int, xs0: int, xs1: int):
        """The kept (entry, persistent?) for x's row count and strides, or None: the
        specialization key's entry, remembered by the exact values too (a tuple lookup
        instead of three int_key calls on repeats)."""
        shape = (M, xs0, xs1)
        hit = self._exact.get(shape)
        if hit is None:
            hit = self._entries.get(int_key(M) | int_key(xs0) << 3 | int_key(xs1) << 6)
            if hit is not None:
                if len(self._exact) >= 256:
                    self._exact.clear()
                self._exact[shape] = hit
        return hit

    def _launch_kept(self, hit, ptrs, M: int, strides) -> None:
        """Launch a kept entry directly (the caller checked launch.direct_ok)."""
        if hit[1]:  # persistent
            _launcher("fwd_persistent").launch_entry(
                hit[0], (min(self._max_programs, triton_cdiv(M, self.persistent[0])),),
                (*ptrs, M, self.IN, self.H, self.OUT, *strides), self.device.index)
        else:
            _launcher("fwd").launch_entry(
                hit[0], (triton_cdiv(M, self.tuning[0]),),
                (*ptrs, M, self.IN, self.H, self.OUT, self.L_HID, *strides),
                self.device.index)

    def _gluon(self, x, weights, biases):
        """y from the Gluon kernel, or None where it cannot read x, a weight or y by TMA
        (strides or addresses not 16-byte aligned): the caller takes the Triton kernel."""
        if not self.gluon.accepts(x):
            return None
        ws = _gluon_operands(weights, self.L_HID)
        bs = _gluon_operands(biases, self.L_HID)
        return self._gluon_run(x, ws, bs) if _aligned(ws, bs) else None

    def _gluon_run(self, x, ws, bs):
        y = memory.new_empty(x.shape[0], self.OUT, like=x)
        if y.data_ptr() & _ALIGN:  # never from PyTorch's allocators; a test's wrapper
            return None
        return self.gluon(x, ws, bs, y)

    def _gluon_bound(self, ws, bs, triton_bound, x):
        """bind's forward on the Gluon path (the caller re-checks the parameters): ``ws``
        and ``bs`` the parameters' addresses (gluon_narrow.Addr), ``triton_bound`` (or
        None) the Triton kernel's bound forward, for fewer rows."""
        if x.shape[0] < GLUON_MIN_ROWS:
            return None if triton_bound is None else triton_bound(x)
        if not self.gluon.accepts(x):
            return None
        return self._gluon_run(x, ws, bs)

    def bind(self, weights, biases):
        """``x -> y`` for this plan's no-grad forward with the parameters' addresses taken
        now, as ints (see ``_bound``); None where the plan has no lean launches or a
        parameter is not dense, in place and 16-byte aligned. With the Gluon kernel, a
        forward that takes it from GLUON_MIN_ROWS rows and the Triton one below."""
        triton_bound = self._bind_triton(weights, biases)
        if self.gluon is None or triton_bound is None:
            return triton_bound
        from .gluon_narrow import Addr

        i = 1 if self.L_HID else 0
        ws = tuple(Addr(w) for w in (weights[0], weights[i], weights[-1]))
        bs = None if biases is None else tuple(
            Addr(b) for b in (biases[0], biases[i], biases[-1]))
        return functools.partial(self._gluon_bound, ws, bs, triton_bound)

    def _bind_triton(self, weights, biases):
        if not self.lean or self.save or _dense(weights) is not weights \
                or _dense(biases) is not biases:
            return None
        if self.L_HID and not (_back_to_back(weights[1:-1])
                               and (biases is None or _back_to_back(biases[1:-1]))):
            return None
        ts = [weights[0], weights[1 if self.L_HID else 0], weights[-1]]
        if biases is not None:
            ts += [biases[0], biases[1 if self.L_HID else 0], biases[-1]]
        ptrs = tuple(t.data_ptr() for t in ts)
        if any(p & _ALIGN for p in ptrs):
            return None
        return functools.partial(self._bound, ptrs)

    def _bound(self, params, x):
        """The no-grad forward of ``bind``: x is 2-D with the spec's dtype, device and
        width, and the parameters still at the addresses ``params`` (the caller checked).
        None where this call cannot launch a kept kernel directly (a new specialization,
        x misaligned, another device current, a launch hook): the caller then takes the
        general path. Pointers go to the launcher as ints: no per-tensor translation in
        the driver. (An earlier suspicion that int addresses caused wrong values under
        compute-sanitizer was refuted: they came back with tensors, NOTES history 14.)"""
        M, OUT = x.shape[0], self.OUT
        xs0, xs1 = x.stride()
        xp = x.data_ptr()
        hit = self._hit(M, xs0, xs1)
        if hit is None or xp & _ALIGN or M == 0 or not launch.direct_ok(self.device.index):
            return None
        y = memory.new_empty(M, OUT, like=x)
        yp = y.data_ptr()
        if yp & _ALIGN:  # never from PyTorch's allocators; a test's wrapper, perhaps
            return None
        w0, wh, wl = params[:3]
        b0, bh, bl = params[3:] if len(params) > 3 else (xp, xp, xp)
        self._launch_kept(hit, (xp, w0, wh, wl, b0, bh, bl, yp, yp), M, (xs0, xs1, OUT, OUT))
        return y

    def _launch(self, x, ptrs, M, strides):
        """The general path: the launch through launch.py's own key (and Triton's path
        the first time); returns (entry, persistent?) for a direct launch next time, or
        None."""
        spec, device = self.spec, self.device
        IN, H, OUT, L_HID = self.IN, self.H, self.OUT, self.L_HID
        with device_guard(x):
            if self.persistent is not None:
                block_m, warps, stages, per_sm, resident = self.persistent
                grid = (_n_programs(device, triton_cdiv(M, block_m), per_sm),)
                args = (*ptrs, M, IN, H, OUT, *strides)
                consts = dict(self.consts, **self.pads, BLOCK_M=block_m, L_HID=L_HID,
                              STAGES=stages, RESIDENT=resident and L_HID <= 4,
                              BIAS_PER_BLOCK=self.bias_per_block)
                # the stage count that fits, remembered per (spec, save): the two
                # forwards' tunings differ
                fit_key = (spec, self.save)
                if _fits("fwd_persistent", device, fit_key, grid, args, consts, warps):
                    if not self.lean:
                        return None
                    fit = _FIT.get(("fwd_persistent", device.index, fit_key), stages)
                    entry = _launcher("fwd_persistent").cached(
                        args, consts if fit == stages else dict(consts, STAGES=fit), device,
                        num_warps=warps, num_stages=NUM_STAGES)
                    return None if entry is None else (entry, True)
            block_m, warps, stages = self.tuning
            args = (*ptrs, M, IN, H, OUT, L_HID, *strides)
            consts = dict(self.consts, **self.pads, BLOCK_M=block_m)
            _launcher("fwd").launch((triton_cdiv(M, block_m),), args, consts, device,
                                    num_warps=warps, num_stages=stages)
            if not self.lean:
                return None
            entry = _launcher("fwd").cached(args, consts, device, num_warps=warps,
                                            num_stages=stages)
            return None if entry is None else (entry, False)


#: the no-grad narrow forward takes the Gluon kernel from this many rows (fewer are
#: host-bound: its launch builds TMA descriptors)
GLUON_MIN_ROWS = 1 << 14


@functools.lru_cache(maxsize=256)
def _gluon_plan(spec, device: torch.device):
    """gluon_narrow's Plan for spec's no-grad forward on device, or None (eligible)."""
    from . import gluon_narrow

    ok, _ = gluon_narrow.eligible(spec, device) if _narrow(spec) else (False, "")
    return gluon_narrow.Plan(spec, device) if ok else None


def _gluon_operands(ts, L_HID: int):
    """Weights or biases (or None) as the Gluon kernels take them: (first, the hidden ones
    back to back, last), the first standing in for the hidden ones without hidden
    layers."""
    return None if ts is None else (ts[0], _stacked(ts[1:-1]) if L_HID else ts[0], ts[-1])


def _aligned(*groups) -> bool:
    """Whether every tensor of the groups (tuples, or None) is 16-byte aligned: TMA needs
    it, and a kept launch was compiled for aligned pointers."""
    bits = 0
    for g in groups:
        if g is not None:
            for t in g:
                bits |= t.data_ptr()
    return not bits & _ALIGN


@functools.lru_cache(maxsize=256)
def _gluon_backward_plan(spec, device: torch.device, need_x: bool, need_w: bool,
                         need_b: bool = False):
    """gluon_backward's Plan for spec's recomputing backward on device, or None."""
    from . import gluon_backward

    ok, _ = gluon_backward.eligible(spec, device) if _narrow(spec) else (False, "")
    return gluon_backward.Plan(spec, device, need_x, need_w, need_b) if ok else None


def _gluon_backward(plan, grad_y, x, weights, biases=None):
    """(grad_x or None, weight gradients, bias gradients) from the Gluon backward, or
    None where it cannot read an operand by TMA (strides or addresses not 16-byte
    aligned): the caller takes the Triton kernels."""
    grad_y = plan.rows(grad_y)
    if not plan.accepts(x, grad_y):
        return None
    ws = _gluon_operands(weights, plan.L_HID)
    bs = _gluon_operands(biases, plan.L_HID)
    if not _aligned(ws, bs):
        return None
    M = x.shape[0]
    gx = memory.new_empty(M, plan.IN, like=x) if plan.need_x else x
    out = (memory.new_empty(plan.reduce.numel, like=x) if plan.need_w or plan.need_b
           else None)
    if (gx.data_ptr() | (0 if out is None else out.data_ptr())) & _ALIGN:
        return None  # never from PyTorch's allocators; a test's wrapper
    with device_guard(x):
        plan(grad_y, x, ws, bs, gx, out)
    gws, gbs = plan.reduce.views(out) if out is not None else ([], [])
    return (gx if plan.need_x else None), gws, gbs


def _split_weight_grads(grad_y, x, z, g, spec, meta, split, need_b, W_SLOT, SLOT):
    """The split backward's second kernel: per-program partial sums of every layer's
    weight (and bias) gradient, in the scratch layout _reduce_grads reads. Each program
    writes its whole slot, so the scratch needs no zero-fill."""
    IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
    M, L_HID, T_P = x.shape[0], spec.n_layers - 2, meta["H_P"]
    bm, warps, stages = split.block_m, split.warps, split.stages
    nb = triton_cdiv(M, bm)
    P = _n_programs(x.device, nb)
    acc = torch.empty(P, spec.n_layers, SLOT, device=x.device, dtype=torch.float32)
    _launcher("dw").launch(
        (P, spec.n_layers), (
            grad_y, x, z, g, acc, M, IN, H, OUT, L_HID, nb,
            grad_y.stride(0), x.stride(0), x.stride(1), z.stride(0), g.stride(0),
        ),
        dict(_dw_pads(spec, T_P), T_P=T_P, W_SLOT=W_SLOT, SLOT=SLOT, ACT=meta["ACT"],
             OUT_ACT=meta["OUT_ACT"], NEED_B=need_b, F32=meta["F32"], PREC=meta["PREC"],
             BLOCK_M=bm, STAGES=stages), x.device,
        num_warps=warps, num_stages=NUM_STAGES)
    return acc


def _dw_pads(spec, T_P: int) -> dict:
    """The weight-gradient kernel's tile widths: each its own (OWN_PADDING), but none below
    64 (or T_P). Measured on the H200 (h200-sweep-padding-20261130{,b}.json, fp16, 2^22 rows,
    train step, kernel by kernel): in/out 64 around hidden 128, [64, 128] and [128, 64]
    tiles instead of [128, 128] for the first and last layer: 3.95 -> 3.17 ms; hidden 32
    between in/out 64, tiles of 32 instead of 64: 1.28-1.31 -> 1.37 ms, slower."""
    return _pads(spec, OWN_PADDING, min(64, T_P))


class _ReduceLayout(NamedTuple):
    """Where _reduce_grads_kernel writes each gradient in its one output buffer (every
    weight's, then every bias's if wanted), and its launch constants. ``like`` holds a
    meta tensor of each gradient's shape: ``views`` makes them all in one call (~2x
    faster than a slice and view each, host time)."""
    numel: int
    like: tuple
    n_layers: int
    need_w: bool
    need_b: bool
    consts: dict
    grid: tuple

    def views(self, out) -> tuple[list, list]:
        vs = torch._utils._unflatten_dense_tensors(out, self.like)
        n = self.n_layers
        return (list(vs[:n]) if self.need_w else []), (list(vs[n:]) if self.need_b else [])


def _reduce_tuning(device_type: str) -> tuple[int, int]:
    """(floats of a slot one reduction program sums, partials it loads per step of its
    loop over the backward's programs).

    CUDA: spans of 128 floats, 32 partials a step. With spans of 1024 and 8 a step the
    reduction ran 25 programs (T_P 64): ncu on the H200 (h200-ncu-narrow-20261201.txt,
    2^22 rows, caches flushed) put it at 86 us after the 866 us one-kernel backward of
    narrow-w32 (264 programs' partials) and 45 us at w64; 128-float spans give 198
    programs there. The interpreter runs every program in turn: it keeps few (1024) and
    takes 2 a step, so its loop runs several steps; XPU keeps the earlier 1024 / 8
    (not measured)."""
    if device_type == "cpu":
        return 1024, 2
    if device_type == "cuda":
        return 128, 32
    return 1024, 8


@functools.lru_cache(maxsize=512)
def _reduce_layout(spec, T_P: int, W_SLOT: int, SLOT: int, need_w: bool, need_b: bool,
                   device_type: str) -> _ReduceLayout:
    outs, ins = spec.widths[1:], spec.widths[:-1]
    shapes = [(o, i) for o, i in zip(outs, ins)] + ([(o,) for o in outs] if need_b else [])
    span, block_p = _reduce_tuning(device_type)
    rows = min(T_P, max(1, span // T_P))  # weight rows a program sums: a span of the slot
    consts = dict(NEED_W=need_w, NEED_B=need_b, T_P=T_P, ROWS=rows, W_SLOT=W_SLOT,
                  SLOT=SLOT, BLOCK_P=block_p)
    return _ReduceLayout(sum(math.prod(s) for s in shapes),
                         tuple(torch.empty(s, device="meta") for s in shapes),
                         spec.n_layers, need_w, need_b, consts, (spec.n_layers, T_P // rows + 1))


def _reduce_launch(acc, out, layout: _ReduceLayout, IN, H, OUT, L_HID, device):
    _launcher("reduce").launch(layout.grid, (acc, out, acc.shape[0], IN, H, OUT, L_HID),
                               layout.consts, device, num_warps=4, num_stages=1)


def _reduce_grads(acc, spec, T_P, W_SLOT, SLOT, need_w, need_b, x):
    """Every layer's weight and bias gradient from the backward's per-program partials:
    one kernel writing them, unpadded and in x's dtype, as views of one buffer (a sum and
    two copies a layer before: ~10 small launches a train step)."""
    layout = _reduce_layout(spec, T_P, W_SLOT, SLOT, need_w, need_b, x.device.type)
    out = memory.new_empty(layout.numel, like=x)
    with device_guard(x):
        _reduce_launch(acc, out, layout, spec.in_features, spec.widths[1],
                       spec.out_features, spec.n_layers - 2, x.device)
    return layout.views(out)


_LAUNCHERS: dict = {}


def _launcher(mode: str):
    """The narrow kernel of ``mode`` ("fwd", "fwd_persistent", "bwd", "g", "dw",
    "bwd_resident", "bwd_recompute", "reduce") behind the lean launch path (launch.py)."""
    la = _LAUNCHERS.get(mode)
    if la is None:
        from . import narrow
        from .launch import Launcher

        la = _LAUNCHERS[mode] = Launcher({
            "fwd": narrow._mlp_fwd_kernel, "fwd_persistent": narrow._mlp_fwd_persistent_kernel,
            "bwd": narrow._mlp_bwd_kernel, "g": narrow._mlp_g_kernel,
            "bwd_resident": narrow._mlp_bwd_resident_kernel,
            "bwd_recompute": narrow._mlp_bwd_resident_kernel,
            "reduce": narrow._reduce_grads_kernel,
            "dw": narrow._mlp_dw_kernel}[mode])
    return la


@functools.lru_cache(maxsize=512)
def _launch_meta(spec, device_type: str) -> dict:
    """The kernels' constexpr arguments for a spec, computed once (host time per call)."""
    interp = device_type == "cpu"
    # Every tile is padded to ONE width P (masks keep the real sizes). On the H200 with
    # Triton 3.6, mixing tile widths (in or out padded differently from hidden) gave wrong
    # input gradients and illegal addresses, while every equal-width case passed the suite;
    # the price is extra FLOPs in the first/last layer when they are narrower.
    P = _pow2(max(spec.widths))
    return dict(IN_P=P, H_P=P, OUT_P=P, ACT=spec.activation_id,
                OUT_ACT=spec.output_activation_id,
                F32=interp, PREC="ieee" if interp else "tf32x3")


def _dense(ts):
    """ts with every tensor that is not contiguous (a transposed weight, a strided bias)
    replaced by a contiguous copy; the narrow kernels read weights and biases densely."""
    if ts is not None:
        for t in ts:  # a plain loop: this runs on every call
            if not t.is_contiguous():
                return [t if t.is_contiguous() else t.contiguous() for t in ts]
    return ts


def _stacked(ts) -> torch.Tensor:
    """Equal-shaped tensors as one [len, ...] operand for the kernel: the first tensor itself
    when they already lie back to back in memory (FusedMLP keeps its hidden layers so; the
    kernel reads past the first into the next), else a stacked copy (~8 us a call on the
    H200 host)."""
    return ts[0] if _back_to_back(ts) else torch.stack(ts)


def _back_to_back(ts) -> bool:
    """Whether equal-shaped contiguous tensors lie one after another in memory."""
    t0 = ts[0]
    base, step = t0.data_ptr(), t0.numel() * t0.element_size()
    for i, t in enumerate(ts):
        if t.data_ptr() != base + i * step or not t.is_contiguous():
            return False
    return True


@functools.lru_cache(maxsize=1024)
def _narrow(spec) -> bool:
    """The fully-fused kernel's domain: >= 2 layers, equal hidden widths, all <= 128."""
    return (spec.n_layers >= 2 and len(set(spec.widths[1:-1])) == 1
            and max(spec.widths) <= MAX_WIDTH)


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
