"""The Triton backend: one source for NVIDIA GPUs, Intel GPUs (Triton's XPU backend) and,
under TRITON_INTERPRET=1, CPU tensors (so CPU CI runs the kernel code itself).

This file is the backend class and its dispatch rules. The kernels live in two families:

    narrow/   every width <= 128, equal hidden widths, >= 2 layers: the whole network in
              ONE kernel. tuning.py (tunings, splits), forward.py / backward.py (host
              side), forward_kernels.py / backward_kernels.py (Triton), hopper_forward.py /
              hopper_backward.py (Gluon on sm_90), reduce.py (the weight gradients' sums)
    wide/     everything else, layer by layer as GEMMs with fused epilogues: layers.py and
              gated.py (host side), gemm_kernels.py / gated_kernels.py (Triton),
              hopper_gemm.py (Gluon on sm_90), configs.py, tma.py, cublas.py (routing)

routes.py (which plain eager calls of wide layers run as torch ops instead), launch.py
(the lean launch path), act.py (activations in the kernels), gluon.py (Gluon's Hopper
API, the FUSEDMLP_GLUON switch, the device check) and common.py are shared by both.
Everything here is plain Python: importable without Triton.
"""
from __future__ import annotations

import torch

from .. import Backend
from .common import interpreting
from .narrow import backward as narrow_backward
from .narrow import forward as narrow_forward
from . import routes as wide_routes
from .narrow import tuning


def routes_note(device: torch.device, gated: bool) -> str:
    """explain()'s words on the plain eager calls that run as torch ops (routes.py)."""
    parts = []
    for train, what in ((False, "inference"), (True, "training")):
        r = wide_routes.describe_rules(device, gated, train)
        if r:
            parts.append(f"{what} of {r}")
    if not parts:
        return ""
    return ("; plain eager calls: " + " and ".join(parts) + " run as torch ops (cuBLAS GEMMs, "
            "eager's epilogues, torch's autograd), measured faster there ("
            + ", ".join(wide_routes.sources(device, gated)) + ")")


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
        from .narrow import forward_kernels  # noqa: F401  (compiles nothing; checks the source)
        return True, f"triton {triton.__version__}"

    def supports(self, spec, device):
        if device.type == "cpu" and not interpreting():
            return False, "CPU tensors need TRITON_INTERPRET=1 (the interpreter; for testing)"
        if spec.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return False, f"dtype {spec.dtype} not supported (fp16, bf16, fp32)"
        if not tuning._narrow(spec):
            why = ("wide layers: one GEMM per layer with bias and activation fused in the "
                   "epilogue (wide/)")
            why += routes_note(device, gated=False)
            if device.type == "cuda":
                from .wide import hopper_gemm

                if hopper_gemm.available(device, spec.dtype):
                    why += ("; backward on sm_90: the input gradient through an activation "
                            "is a warp-specialized Gluon GEMM (its epilogue overlapped with "
                            "the next tile's MMAs)")
            return True, why
        why = f"fully-fused narrow kernel (widths <= {tuning.MAX_WIDTH}, one kernel)"
        if device.type == "cuda":
            from .narrow import hopper_forward

            ok, why_not = hopper_forward.eligible(spec, device)
            why += ("; inference on sm_90 from {} rows: the Gluon kernel (two row blocks "
                    "per warpgroup, asynchronous MMAs, TMA)".format(tuning.GLUON_MIN_ROWS) if ok
                    else f"; not the Gluon inference kernel: {why_not}")
        p = tuning._persistent_choice(device, spec)
        if p is not None:
            why += (f"; inference: persistent programs, {p[0]} rows / {p[1]} warps"
                    + (", weights resident" if p[4] else ""))
        if self.recomputes(spec, device):
            why += ("; training: the backward in one kernel too, recomputing the "
                    "pre-activations on chip (the forward saves none)")
            if device.type == "cuda":
                from .narrow import hopper_backward

                ok, why_not = hopper_backward.eligible(spec, device)
                pad = hopper_backward.tma_out(spec).out_features - spec.out_features
                one = tuning._one_kernel(tuning._split_backward(device, spec), spec)
                why += ("; that backward on sm_90 {}: the Gluon kernel "
                        "(asynchronous weight-gradient MMAs, TMA{}{})".format(
                            f"from {tuning.GLUON_MIN_ROWS} rows" if one else "at every row count",
                            f"; {spec.activation}'s derivative from its stored output"
                            if hopper_backward.from_output(spec.activation_id) else "",
                            f"; out width padded with {pad} zero columns" if pad else "")
                        if ok else f"; not the Gluon backward: {why_not}")
        from .narrow import second_order as so

        P = so.padded_width(spec)
        so_tune, small = so.tuning(device, P), so.tuning(device, P, so.SMALL_ROWS)
        why += ("; second derivatives through the input gradient (an eikonal loss: "
                "autograd.grad(y, x, create_graph=True), then backward): the closed form "
                + (f"up to {so.SMALL_ROWS} rows (outside a CUDA graph's capture) in one "
                   f"kernel, {small}; above " if small != so_tune else "")
                + ("in whole-batch passes of " + ("row-block GEMM kernels with the "
                   "pointwise step after each product fused in" if so_tune.fuse else
                   "cuBLAS GEMMs and pointwise kernels") + ", its first pass run as the "
                   "input gradient itself and kept, its last pass shared with y's "
                   "first-order backward where the loss also takes y" if so_tune.split
                   else f"in one kernel, {so_tune}") + " (narrow/second_order.py)")
        return True, why

    # -- launches -----------------------------------------------------------------------
    def forward(self, x, weights, biases, spec, save):
        if not tuning._narrow(spec):
            from . import wide

            return wide.forward(x, weights, biases, spec, save)
        return narrow_forward._forward_plan(spec, x.device, save)(x, weights, biases)

    def bind_forward(self, spec, device, weights, biases):
        """A no-grad forward ``x -> y`` bound to these very weights and biases (their
        addresses read now), for a caller that re-checks them every call (module.py); or
        None where nothing is gained: wide layers, no lean launches here, or parameters
        the kernel cannot read in place (copies, misaligned)."""
        if not tuning._narrow(spec):
            return None
        return narrow_forward._forward_plan(spec, device, False).bind(weights, biases)

    def recomputes(self, spec, device):
        """Where the backward is one kernel that computes every row block's pre-activations
        again from x on chip, so the forward saves nothing (measured faster:
        tuning.RECOMPUTE_ON_CHIP): the one-kernel Triton backward (Split.g_dw) or, on
        sm_90, the Gluon backward (narrow_backward.gluon_takes)."""
        if not (tuning.RECOMPUTE_ON_CHIP and tuning._narrow(spec)):
            return False
        return (tuning._one_kernel(tuning._split_backward(device, spec), spec)
                or (spec.activation not in tuning.GLUON_SAVES
                    and narrow_backward.gluon_takes(spec, device)))

    def torch_rows(self, spec, device, train):
        """Wide layers: routes.py's measured ranges; narrow nets: never."""
        if tuning._narrow(spec):
            return ()
        return wide_routes.torch_rows(device, False, train, spec.widths[0],
                                      max(spec.widths[1:-1], default=spec.widths[-1]))

    def second_order(self, gg, v, x, weights, biases, spec, needs):
        """Narrow nets: one kernel (narrow/second_order.py); wide layers: not here."""
        if not tuning._narrow(spec):
            return None
        from .narrow import second_order

        return second_order.second_order(gg, v, x, weights, biases, spec, needs)

    def second_order_form(self, spec, device, rows=None):
        """Narrow nets where the second order is the GEMM form (the default on GPUs but at
        few rows, narrow/second_order.tuning): its passes (narrow/second_order.GemmForm);
        else None (the one kernel)."""
        if not tuning._narrow(spec):
            return None
        from .narrow import second_order as so

        tune = so.tuning(device, so.padded_width(spec), rows)
        return so.GemmForm(spec, tune) if tune.split else None

    def backward(self, grad_y, x, weights, biases, saved, spec, needs):
        """Narrow nets: narrow/backward.py (which runs this backend's forward again where
        the pre-activations must be saved after all); wide layers: wide/layers.py."""
        if not tuning._narrow(spec):
            from . import wide

            return wide.backward(grad_y, x, weights, biases, saved, spec, needs)
        return narrow_backward.backward(grad_y, x, weights, biases, saved, spec, needs,
                                        self.forward)
