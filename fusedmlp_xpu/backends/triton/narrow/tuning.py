"""The narrow family's tunings and plans' choices, one named place per vendor: which
nets are narrow, tile padding, (rows, warps, stages) per kernel and device, when the
forward runs persistent, and how the backward is split (fused, split, or one kernel).
Each constant carries the measurement behind it. Plain Python: importable without
Triton."""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .... import envvars
from ..common import cdiv, pow2
from . import launchers
from .launchers import NUM_STAGES, _launch_meta


MAX_WIDTH = 128


# Hidden 128: the resident weight tiles (fp16/bf16 elements) up to which the forward runs
# persistent (without biases): narrow-w128's 64 -> 128 x 4 -> 64, the only net timed
# there (128 KB)
PERSISTENT_RESIDENT_128 = 64 * 1024


# The forward kernels, the split backward's weight-gradient kernel and its resident
# input-gradient chain pad each of in, hidden and out to its own power of two; the other
# backward kernels pad every tile to the widest (history 1 and 19 of benchmarks/NOTES.md).
# False: every tile at the widest, as before (a sweep compares the two in one process).
OWN_PADDING = True


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
    return dict(IN_P=max(floor, pow2(IN)), H_P=max(floor, pow2(H)),
                OUT_P=max(floor, pow2(OUT)))


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
    P = pow2(max(spec.widths))
    if mode == "fwd":
        if P > 64 and max(pow2(spec.in_features), pow2(spec.out_features)) < P:
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
    if pow2(max(spec.widths)) > 64:
        if _resident_128(spec):
            return Split(64, 4, 3, g_block_m=64, g_warps=4, g_per_sm=1, g_unroll=True,
                         g_stages=2, g_resident=True)
        return Split(64, 4, 3, g_block_m=64, g_warps=4, g_per_sm=0)
    if spec.n_layers - 2 <= 4:
        if ONE_KERNEL_BACKWARD and spec.widths[1] > 32 and _curved(spec):
            # the two kernels, z saved (the 64/4/1/3 chain below)
            return Split(128, 4, 2, g_block_m=64, g_warps=4, g_per_sm=1, g_unroll=True,
                         g_stages=3)
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


#: hidden activations whose nets the forward still saves z for where the one-kernel
#: Triton backward does not take them, though the Gluon backward could recompute: gelu
#: (erf again in the backward's forward and in its derivative; the w64-gelu net 64 ->
#: 64 x 3 -> 64 with biases, fp16, H200: recomputing 2.76 ms a train step at 2^20 rows
#: against 2.30 saving, h200-narrow-recompute-fp16-20261204.json); gelu_tanh with it,
#: not measured. Every other activation measured recomputes (TritonBackend.recomputes)
GLUON_SAVES = ("gelu", "gelu_tanh")

#: the resident chain sums the weight gradients itself (Split.g_dw) up to 4 hidden-to-
#: hidden weights at hidden width <= 64; off: the two kernels (the sweeps compare both)
ONE_KERNEL_BACKWARD = True


def _curved(spec) -> bool:
    """Whether the hidden activation is one evaluated by transcendentals (gelu, silu,
    sigmoid, tanh, softplus: not relu, leaky relu, none). At hidden 64 those nets train
    faster with the two kernels than with the one-kernel backward, whose registers they
    overflow (sm_90 compile of the sdf net, softplus and biases, 128 rows / 8 warps: 3,040
    B of spills a thread; relu without biases 316 B). Forward + backward of a 32 -> 64 x 4
    -> 16 net, 2^18 rows, fp16, H200 (h200-sdf-bwd-*-20261203.json), ms, one kernel /
    two kernels / the fused kernel:
      softplus, biases   1.525 / 0.839 / 0.923  (eager 1.511)
      softplus           0.712 / 0.629 / 0.683
      relu, biases       0.948 / 1.154 / 0.841  (relu stays on the one kernel)
      tanh, biases       (cut) / 0.932 / 1.001"""
    return spec.activation_id not in (0, 1, 2)


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
    if mode == "fwd" or pow2(max(spec.widths)) > 64:
        return 1
    return 3 if mode == "g" or spec.n_layers - 2 > 4 else 1


def _tuning_intel(spec, mode: str) -> tuple[int, int]:
    """(BLOCK_M, num_warps) on Intel GPUs through Triton's XPU backend (not measured here)."""
    return (64, 8) if pow2(max(spec.widths)) > 64 else (128, 8)


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


# The split backward's g buffer (every layer's g for the rows it holds) sits beside the
# saved pre-activations, which are as large. It is stored for G_CHUNK_BYTES of rows at a
# time (at most G_MAX_CHUNKS chunks, each a chain, a weight-gradient launch and a
# reduction); FUSEDMLP_G_CHUNK_MB overrides the budget, 0 stores g whole. narrow-w128
# fp16 train step on the H200, peak MB above inputs and parameters / ms, g whole against
# chunked (h200-w128-train-gchunk0-20261205d, h200-w128-train-gchunk4-20261205e), eager:
#   2^20 rows: 2218 / 2.18 against 1492 / 2.34 (4 chunks); eager 1664 / 3.27
#   2^22 rows: 8746 / 8.52 against 5716 / 8.67 (4 chunks); eager 6144 / 12.62
# 8 chunks at 2^22: 5204 MB, 8.88 ms (h200-w128-train-gchunk256-20261205d): 4 keep the
# peak below eager's at half the cost.
G_CHUNK_BYTES = 256 << 20
G_MAX_CHUNKS = 4
_CHUNK_ALIGN = 1024  # rows: a multiple of every row block, and 16-byte aligned slices


def g_chunk_rows(M: int, row_bytes: int) -> int:
    """Rows of g the split backward stores at a time for an M-row call (M: g whole)."""
    mb = envvars.get("FUSEDMLP_G_CHUNK_MB")
    try:
        budget = G_CHUNK_BYTES if mb is None else int(float(mb) * (1 << 20))
    except ValueError:
        raise ValueError(f"FUSEDMLP_G_CHUNK_MB must be a number of MiB, got {mb!r}") from None
    if budget <= 0 or M * row_bytes <= budget:
        return M
    rows = max(budget // row_bytes, cdiv(M, G_MAX_CHUNKS))
    rows = cdiv(rows, _CHUNK_ALIGN) * _CHUNK_ALIGN
    return min(rows, M)


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
    return pow2(spec.widths[1]) >= 64


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
    if device.type != "cuda" or launchers._FIT.get(
            ("fwd_persistent", device.index, (spec, save))) == 0:
        return None
    return _persistent_nvidia(spec, save)


def _one_kernel_pads(spec) -> dict:
    """The one-kernel backward's tile widths: each its own (_own_pads), but in no
    narrower than hidden. With in padded narrower than hidden and hidden-to-hidden layers
    (17 -> 33 x 3 -> 9) the first layer's weight gradient came out NaN on the H200
    (Triton 3.6; right in the interpreter; benchmarks/repro_padding.py --chain
    one-kernel, in git history; NOTES history 22). Shared: read, never modify."""
    return _pads(spec, OWN_PADDING, 16, True)


def _chain_pads(spec, resident: bool) -> dict:
    """The split backward's input-gradient chain's tile widths over _launch_meta's (every
    tile at the widest): the resident chain pads each width on its own; a chain that loads
    its weights per row block keeps the widest (padding each width on its own there gave
    wrong input gradients on the H200 with in narrower than hidden: benchmarks/NOTES.md,
    narrow backward; the switch that kept that variant is in git history)."""
    return _own_pads(spec) if resident else {}


#: the no-grad narrow forward takes the Gluon kernel from this many rows (fewer are
#: host-bound: its launch builds TMA descriptors)
GLUON_MIN_ROWS = 1 << 14


def _dw_pads(spec, T_P: int) -> dict:
    """The weight-gradient kernel's tile widths: each its own (OWN_PADDING), but none below
    64 (or T_P). Measured on the H200 (h200-sweep-padding-20261130{,b}.json, fp16, 2^22 rows,
    train step, kernel by kernel): in/out 64 around hidden 128, [64, 128] and [128, 64]
    tiles instead of [128, 128] for the first and last layer: 3.95 -> 3.17 ms; hidden 32
    between in/out 64, tiles of 32 instead of 64: 1.28-1.31 -> 1.37 ms, slower."""
    return _pads(spec, OWN_PADDING, min(64, T_P))


@functools.lru_cache(maxsize=1024)
def _narrow(spec) -> bool:
    """The fully-fused kernel's domain: >= 2 layers, equal hidden widths, all <= 128."""
    return (spec.n_layers >= 2 and len(set(spec.widths[1:-1])) == 1
            and max(spec.widths) <= MAX_WIDTH)
