"""The narrow forward's host side: a plan per (spec, device, save) that picks the kernel
(the Gluon kernel on sm_90 from GLUON_MIN_ROWS rows without saving; else the persistent
or the per-block Triton kernel of forward_kernels.py), works out its constexprs once,
and keeps compiled launches for direct launches on later calls."""
from __future__ import annotations

import functools

import torch

from ... import device_guard, memory, saved_widths
from .. import launch
from ..common import cdiv
from ..launch import int_key
from . import launchers, tuning
from .launchers import NUM_STAGES, _fits, _launch_meta
from .operands import _ALIGN, _aligned, _back_to_back, _dense, _gluon_operands, _stacked
from .tuning import GLUON_MIN_ROWS, _narrow, _own_pads, _persistent_choice, _tuning


@functools.lru_cache(maxsize=512)
def _forward_plan(spec, device: torch.device, save: bool) -> "_NarrowForward":
    return _NarrowForward(spec, device, save)


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
        self.bias_per_block = tuning._bias_per_block(self.pads)  # the persistent kernel's
        self.tuning = _tuning(device, spec, "fwd_save" if save else "fwd")
        self.lean = launch.enabled(device)
        # the no-grad forward on sm_90: the Gluon kernel (hopper_forward.py) from
        # GLUON_MIN_ROWS rows, for x it can read by TMA
        self.gluon = None if save else _gluon_plan(spec, device)
        self._entries: dict = {}  # key bits -> (entry, persistent?)
        self._exact: dict = {}  # (rows, strides) -> an entry of _entries (bound calls)
        if self.lean:
            self._max_programs = (launchers._n_programs(device, 1 << 62, self.persistent[3])
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
            launchers._launcher("fwd_persistent").launch_entry(
                hit[0], (min(self._max_programs, cdiv(M, self.persistent[0])),),
                (*ptrs, M, self.IN, self.H, self.OUT, *strides), self.device.index)
        else:
            launchers._launcher("fwd").launch_entry(
                hit[0], (cdiv(M, self.tuning[0]),),
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
        and ``bs`` the parameters' addresses (hopper_forward.Addr), ``triton_bound`` (or
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
        from .hopper_forward import Addr

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
                grid = (launchers._n_programs(device, cdiv(M, block_m), per_sm),)
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
                    fit = launchers._FIT.get(("fwd_persistent", device.index, fit_key), stages)
                    entry = launchers._launcher("fwd_persistent").cached(
                        args, consts if fit == stages else dict(consts, STAGES=fit), device,
                        num_warps=warps, num_stages=NUM_STAGES)
                    return None if entry is None else (entry, True)
            block_m, warps, stages = self.tuning
            args = (*ptrs, M, IN, H, OUT, L_HID, *strides)
            consts = dict(self.consts, **self.pads, BLOCK_M=block_m)
            launchers._launcher("fwd").launch((cdiv(M, block_m),), args, consts, device,
                                    num_warps=warps, num_stages=stages)
            if not self.lean:
                return None
            entry = launchers._launcher("fwd").cached(args, consts, device, num_warps=warps,
                                            num_stages=stages)
            return None if entry is None else (entry, False)


@functools.lru_cache(maxsize=256)
def _gluon_plan(spec, device: torch.device):
    """hopper_forward's Plan for spec's no-grad forward on device, or None (eligible)."""
    from . import hopper_forward

    ok, _ = hopper_forward.eligible(spec, device) if _narrow(spec) else (False, "")
    return hopper_forward.Plan(spec, device) if ok else None
