"""The dispatcher: (device, MLPSpec) -> backend, with a reason for every choice.

For a device it walks that device type's backends, fastest first, and takes the first
whose ``supports()`` and ``preferred()`` say yes; for a training call (``train``: a
forward that autograd will differentiate, or the backward) only a backend that trains
(``Backend.train_support``). ``FUSEDMLP_BACKEND=name`` or ``backend=name`` forces one (then
``supports()`` alone decides, and an inference-only backend cannot take a training call);
if that backend cannot run the input it is an error, never a silent fallback.
Decisions are cached per (device, spec, forced name, training or not).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import envvars
from .backends import Backend
from .backends.reference import ReferenceBackend
from .spec import MLPSpec

ENV_VAR = "FUSEDMLP_BACKEND"

#: every known backend by name; a backend module joins by calling ``register``
REGISTRY: dict[str, Backend] = {}

#: per device type, the order in which backends are tried (fastest first)
ORDER: dict[str, tuple[str, ...]] = {
    "cuda": ("cuda", "triton", "reference"),
    "xpu": ("sycl", "triton", "reference"),
    "cpu": ("reference",),
}

_decisions: dict[tuple, Backend] = {}
_availability: dict[str, tuple[bool, str]] = {}

#: bumped whenever a backend registers: any choice made before may no longer hold
generation = 0


def register(backend: Backend) -> Backend:
    global generation
    REGISTRY[backend.name] = backend
    generation += 1
    _decisions.clear()
    _availability.pop(backend.name, None)
    return backend


def availability(name: str) -> tuple[bool, str]:
    """(available, reason) of one backend, computed once per process."""
    if name not in _availability:
        try:
            _availability[name] = REGISTRY[name].available()
        except Exception as e:  # a broken optional dependency must not break import
            _availability[name] = (False, f"{type(e).__name__}: {e}")
    return _availability[name]


class BackendUnavailableError(RuntimeError):
    """An explicitly requested backend cannot run this input."""


@dataclass
class Consideration:
    name: str
    taken: bool
    reason: str


@dataclass
class Explanation:
    """Which backend runs ``spec`` on ``device``, and why each other one does not."""

    device: torch.device
    spec: MLPSpec
    backend: str | None
    forced: str | None = None
    considered: list[Consideration] = field(default_factory=list)
    #: the choice for training calls (a differentiated forward, the backward)
    train: bool = False
    #: train -> the row ranges where plain eager calls run as torch ops instead of the
    #: chosen backend's kernels (Backend.torch_rows); None: never
    torch_rows: Callable[[bool], tuple] | None = None

    def route(self, x: torch.Tensor | int, train: bool = False) -> str:
        """What a plain eager call with ``x`` (or that many rows) runs: the chosen
        backend's kernels, or torch ops where those were measured faster at that row
        count (compiled calls, a forced backend and ``recompute=True`` training always
        take the backend)."""
        if isinstance(x, torch.Tensor):
            rows = x.shape[:-1].numel()
        elif isinstance(x, int) and not isinstance(x, bool):
            rows = x
        else:
            raise TypeError(f"x: expected a tensor or a row count, got {type(x).__name__}")
        what = f"{rows} rows, {'training' if train else 'inference'}: "
        if self.backend is None:
            return what + "no backend can run it"
        ranges = self.torch_rows(train) if self.torch_rows is not None else ()
        if any(lo <= rows <= hi for lo, hi in ranges):
            if self.backend == "reference":
                return what + ("the reference's torch ops with torch's own autograd graph "
                               "(nn.Sequential's backward and derivatives of every order), "
                               "measured faster than the op's autograd node there")
            return what + ("torch ops (cuBLAS GEMMs, eager's epilogues" +
                           (", torch's autograd" if train else "") +
                           f"), measured faster than the {self.backend} kernels there")
        if self.backend == "reference":
            return what + "the reference's torch ops"
        return what + f"the {self.backend} kernels"

    def __str__(self) -> str:
        head = f"device {self.device}, widths {list(self.spec.widths)}, {self.spec.dtype}, " \
               f"activation {self.spec.activation}/{self.spec.output_activation}, " \
               f"bias {self.spec.bias}"
        how = f"forced by {self.forced!r}" if self.forced else "first that supports it"
        head += ", for training" if self.train else ", for inference"
        lines = [head, f"chosen: {self.backend or 'NONE'} ({how})"]
        for c in self.considered:
            mark = "->" if c.taken else "  "
            lines.append(f" {mark} {c.name:<10} {c.reason}")
        return "\n".join(lines)


def requested(backend: str | None = None) -> str | None:
    """The forced backend name: the argument, else $FUSEDMLP_BACKEND, else None (auto)."""
    name = backend or envvars.get(ENV_VAR) or None
    if name is not None and name != "auto" and name not in REGISTRY:
        src = "backend" if backend else ENV_VAR
        raise ValueError(f"{src}: unknown backend {name!r}; known: {sorted(REGISTRY)}")
    return None if name == "auto" else name


def explain_choice(device: torch.device, spec: MLPSpec, forced: str | None = None,
                   train: bool = False) -> Explanation:
    names = (forced,) if forced else ORDER.get(device.type, ("reference",))
    ex = Explanation(device, spec, None, forced, train=train)
    for name in names:
        if name not in REGISTRY:
            ex.considered.append(Consideration(name, False, "not part of this installation"))
            continue
        be = REGISTRY[name]
        ok, why = availability(name)
        if ok and device.type not in be.device_types:
            ok, why = False, f"does not run on {device.type} (only {', '.join(be.device_types)})"
        if ok:
            ok, why = be.supports(spec, device)
        if ok and train:
            trains, says = be.train_support(spec, device)
            if not trains:
                ok, why = False, (f"{says}: a training call takes " +
                                  ("nothing, as forced" if forced else "the next backend"))
            elif says:
                why = f"{why}; trains: {says}"
        if ok and forced is None:  # unforced, a backend may decline what it supports
            pref, says = be.preferred(spec, device, train)
            ok, why = (True, f"{why}; {says}" if says else why) if pref else (False, says)
        taken = ok and ex.backend is None
        if taken:
            ex.backend = name
            if forced is None:
                ex.torch_rows = lambda train, be=be: be.torch_rows(spec, device, train)
        ex.considered.append(Consideration(name, taken, why))
    if forced is None:
        # name the backends that are never tried on this device type, for completeness
        for name in REGISTRY:
            if name not in names:
                ex.considered.append(
                    Consideration(name, False, f"not used automatically on {device.type}")
                )
    return ex


def choose(device: torch.device, spec: MLPSpec, backend: str | None = None,
           train: bool = False) -> Backend:
    """The backend that runs ``spec`` on ``device`` (``train``: for a call autograd will
    differentiate, or its backward); raises if a forced one cannot."""
    forced = requested(backend)
    key = (device.type, device.index, spec, forced, train)
    be = _decisions.get(key)
    if be is None:
        ex = explain_choice(device, spec, forced, train)
        if ex.backend is None:
            msg = "; ".join(f"{c.name}: {c.reason}" for c in ex.considered)
            if forced:
                raise BackendUnavailableError(f"backend {forced!r} cannot run this input: {msg}")
            raise BackendUnavailableError(f"no backend can run this input on {device}: {msg}")
        be = _decisions[key] = REGISTRY[ex.backend]
    return be


@dataclass
class BackendInfo:
    name: str
    available: bool
    reason: str
    device_types: tuple[str, ...]


def backends() -> list[BackendInfo]:
    """Every known backend, whether it is usable in this process, and why (not)."""
    out = []
    for name, be in REGISTRY.items():
        ok, why = availability(name)
        out.append(BackendInfo(name, ok, why, be.device_types))
    return out


register(ReferenceBackend())
