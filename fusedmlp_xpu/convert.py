"""Converters: find the MLPs in a model, swap them for fused modules, and say what they did.

    fuse_mlps(model)        nn.Sequential chains (torchvision.ops.MLP is one), timm ``Mlp``
                            -> FusedMLP; timm ``GluMlp``/``SwiGLU`` -> the gated op
    fuse_gated_mlps(model)  gate/up/down MLPs (Llama, Mistral, Qwen2/3, Gemma, OLMo2, ...) ->
                            GatedMLP; Phi-3's packed ``gate_up_proj`` and timm ``GluMlp``/
                            ``SwiGLU`` -> GatedMLPView

Both swap in place and return the model (or the fused module when the model itself is
one MLP). ``report=True`` returns ``(model, FusionReport)`` instead: every candidate
module, swapped or left, and why. When nothing is swapped a warning says so. The fused
modules share the original Linears (same Parameters: optimizers and state_dict keys
stay), except Sequentials, whose values FusedMLP.from_sequential copies under the same
keys. Activations are recognised by what they compute (activations.recognise).

What is left, with its reason: dropout with p > 0 (random in training; we do not fuse it
in eval mode either, so a module's behaviour never depends on the mode it was converted
in), a norm inside the MLP, activations outside the registry (or outside the gated op's
silu/gelu/gelu_tanh), mixed biases, Conv projections, and MoE experts (out of scope: no
grouped op; their shared dense MLPs are still searched).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from torch import nn

from . import activations
from .gated import GATE_ACTIVATIONS, GatedMLP, GatedMLPView, _gated_plan, check_linears, \
    find_activation
from .module import FusedMLP, _plan


@dataclass(frozen=True)
class Candidate:
    path: str       # where in the model ("" is the model itself)
    kind: str       # the module's class name
    swapped: bool
    reason: str     # what it became, or why it was left


@dataclass
class FusionReport:
    """What a converter did: one Candidate per MLP-like module it looked at."""
    converter: str
    model: str
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def swapped(self) -> list[Candidate]:
        return [c for c in self.candidates if c.swapped]

    @property
    def left(self) -> list[Candidate]:
        return [c for c in self.candidates if not c.swapped]

    def __str__(self) -> str:
        lines = [f"{self.converter}({self.model}): {len(self.swapped)} swapped, "
                 f"{len(self.left)} left"]
        for c in self.candidates:
            lines.append(f"  {'swapped' if c.swapped else 'left   '}  {c.path or '<model>'} "
                         f"({c.kind}): {c.reason}")
        return "\n".join(lines)


def _drop_reason(mod: nn.Module, name: str) -> str | None:
    d = getattr(mod, name, None)
    if d is None or type(d) is nn.Identity:
        return None
    if isinstance(d, nn.modules.dropout._DropoutNd):
        return None if d.p == 0 else (f"{name} is {type(d).__name__}(p={d.p}): dropout with "
                                      "p > 0 is not fused")
    return f"{name} is {type(d).__name__}, not dropout"


def _norm_reason(mod: nn.Module) -> str | None:
    norm = getattr(mod, "norm", None)
    if norm is None or type(norm) is nn.Identity:
        return None
    return f"norm is {type(norm).__name__}: a norm inside the MLP is not fused"


def _is_timm(mod: nn.Module, *names: str) -> bool:
    t = type(mod)
    return t.__module__.split(".")[0] == "timm" and t.__name__ in names


# --- handlers: each returns None (not a candidate) or (new module or None, reason) -------
def _sequential(mod, opts):
    if not isinstance(mod, nn.Sequential) or isinstance(mod, FusedMLP):
        return None
    if not any(type(m) is nn.Linear for m in mod.children()):
        return None
    plan = _plan(mod)
    if isinstance(plan, str):
        return None, plan
    new = FusedMLP.from_sequential(mod, backend=opts["backend"])
    return new, f"FusedMLP widths={list(new.widths)}, activation={new.activation!r}"


def _timm_mlp(mod, opts):
    if not _is_timm(mod, "Mlp"):
        return None
    lins = {"fc1": mod.fc1, "fc2": mod.fc2}
    why = (check_linears(list(lins.values())) or _norm_reason(mod)
           or _drop_reason(mod, "drop1") or _drop_reason(mod, "drop2"))
    if why:
        return None, why
    act, how = activations.recognise(mod.act)
    if act is None:
        return None, f"act: {how}"
    new = FusedMLP.from_linears(lins, act.name, backend=opts["backend"], training=mod.training)
    return new, f"FusedMLP widths={list(new.widths)}, activation={act.name!r}"


def _timm_glu(mod, opts):
    """timm GluMlp (fc1 packed; gate_last=True: x1 * act(x2), the gate is the SECOND half)
    and SwiGLU (fc1_g gate, fc1_x up)."""
    if not _is_timm(mod, "GluMlp", "SwiGLU"):
        return None
    packed = type(mod).__name__ == "GluMlp"
    names = ("fc1", "fc2") if packed else ("fc1_g", "fc1_x", "fc2")
    lins = {n: getattr(mod, n) for n in names}
    why = (check_linears(list(lins.values())) or _norm_reason(mod)
           or _drop_reason(mod, "drop1") or _drop_reason(mod, "drop2"))
    if why:
        return None, why
    if packed and getattr(mod, "chunk_dim", -1) != -1:
        return None, "chunk_dim is not -1 (use_conv)"
    act, why = find_activation(mod)
    if act is None:
        return None, why
    gate_first = not getattr(mod, "gate_last", False)
    new = GatedMLPView(lins, names[:1] if packed else names[:2], "fc2", act,
                       gate_first=gate_first, backend=opts["backend"],
                       recompute=opts["recompute"])
    new.train(mod.training)
    return new, f"GatedMLPView ({'packed fc1' if packed else 'fc1_g/fc1_x'}, activation={act!r})"


_LLAMA_CHILDREN = {"gate_proj", "up_proj", "down_proj", "act_fn", "activation_fn"}


def _extra_children(mod, allowed) -> str | None:
    """A gated MLP whose class holds more than its projections and activation may compute
    more in forward than the op does: such modules are left (Identity and p=0 dropout pass)."""
    for name, child in mod.named_children():
        if name in allowed or type(child) is nn.Identity:
            continue
        if isinstance(child, nn.modules.dropout._DropoutNd) and child.p == 0:
            continue
        return f"holds {name} ({type(child).__name__}) besides its projections"
    if getattr(mod, "activation_sparsity", 0):  # Gemma-3n: a top-k on the gate
        return "activation_sparsity > 0 (a top-k the gated op does not compute)"
    return None


def _gate_up_down(mod, opts):
    if isinstance(mod, GatedMLP) or not all(
            hasattr(mod, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return None
    act, why = _gated_plan(mod)
    why = why or _extra_children(mod, _LLAMA_CHILDREN)
    if why:
        return None, why
    new = GatedMLP.from_module(mod, backend=opts["backend"], recompute=opts["recompute"])
    return new, f"GatedMLP activation={act!r}"


def _packed_gate_up(mod, opts):
    """Phi-3's MLP: gate_up_proj packs [gate; up] (gate first: ``gate, up = y.chunk(2)``)."""
    if isinstance(mod, GatedMLPView) or not (hasattr(mod, "gate_up_proj")
                                             and hasattr(mod, "down_proj")):
        return None
    packed, down = mod.gate_up_proj, mod.down_proj
    if not isinstance(packed, nn.Module):  # an MoE experts' 3-D Parameter, not a Linear
        return None, "gate_up_proj is not a Linear (MoE experts are out of scope)"
    why = check_linears([packed, down])
    if why:
        return None, why
    if packed.out_features != 2 * down.in_features:
        return None, "gate_up_proj's rows are not twice down_proj's inputs"
    act, why = find_activation(mod)
    why = why or _extra_children(mod, {"gate_up_proj", "down_proj", "activation_fn", "act_fn"})
    if why:
        return None, why
    new = GatedMLPView({"gate_up_proj": packed, "down_proj": down}, ("gate_up_proj",),
                       "down_proj", act, gate_first=True, backend=opts["backend"],
                       recompute=opts["recompute"])
    new.train(mod.training)
    return new, f"GatedMLPView (packed gate_up_proj, views; activation={act!r})"


def _gated_hint(mod, opts):
    if _is_timm(mod, "GluMlp", "SwiGLU"):
        return None
    if all(hasattr(mod, n) for n in ("gate_proj", "up_proj", "down_proj")) or (
            hasattr(mod, "gate_up_proj") and hasattr(mod, "down_proj")):
        return None, "a gated MLP: fuse_gated_mlps swaps it"
    return None


def _is_experts(name: str, child: nn.Module) -> bool:
    return name == "experts" or type(child).__name__.endswith("Experts")


# --- the walk ------------------------------------------------------------------------
def _convert(model, handlers, converter, opts, report):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    if not isinstance(report, bool):
        raise TypeError(f"report: expected a bool, got {type(report).__name__}")
    rep = FusionReport(converter, type(model).__name__)

    def visit(mod, path):
        for handler in handlers:
            res = handler(mod, opts)
            if res is not None:
                new, reason = res
                rep.candidates.append(Candidate(path, type(mod).__name__, new is not None,
                                                reason))
                if new is not None:
                    return new
                break
        for name, child in list(mod.named_children()):
            sub = f"{path}.{name}" if path else name
            if _is_experts(name, child):
                rep.candidates.append(Candidate(sub, type(child).__name__, False,
                                                "MoE experts are out of scope"))
                continue
            new = visit(child, sub)
            if new is not child:
                setattr(mod, name, new)
        return mod

    out = visit(model, "")
    if not rep.swapped:
        found = (f"{len(rep.left)} candidates left" if rep.left
                 else "no MLP-like module found")
        warnings.warn(f"{converter}: nothing swapped in {type(model).__name__} ({found}); "
                      f"pass report=True to see why", stacklevel=3)
    return (out, rep) if report else out


def fuse_mlps(model: nn.Module, *, backend: str | None = None, report: bool = False):
    """Swap, in place, every MLP chain in ``model`` for a fused module: nn.Sequential chains
    of Linear and activations (nn.Identity and Dropout(p=0) skipped; torchvision.ops.MLP is
    one), timm ``Mlp`` (norm must be Identity, dropouts p=0), timm ``GluMlp``/``SwiGLU``
    (through the gated op). Returns ``model`` (or the fused module when ``model`` itself is
    one), or ``(that, FusionReport)`` with ``report=True``. Gate/up/down MLPs are reported
    and left for fuse_gated_mlps."""
    return _convert(model, (_timm_mlp, _timm_glu, _sequential, _gated_hint), "fuse_mlps",
                    {"backend": backend, "recompute": False}, report)


def fuse_gated_mlps(model: nn.Module, *, backend: str | None = None, recompute: bool = False,
                    report: bool = False):
    """Swap, in place, every gated MLP in ``model`` for one gated op: modules with gate_proj/
    up_proj/down_proj Linears and an activation (act_fn, activation_fn, act: a module or a
    function computing silu, gelu or gelu_tanh), Phi-3-style packed gate_up_proj (read as
    views), timm ``GluMlp``/``SwiGLU``. MoE experts are reported and left. Returns as
    fuse_mlps does."""
    if not isinstance(recompute, bool):
        raise TypeError(f"recompute: expected a bool, got {type(recompute).__name__}")
    return _convert(model, (_gate_up_down, _packed_gate_up, _timm_glu), "fuse_gated_mlps",
                    {"backend": backend, "recompute": recompute}, report)


__all__ = ["fuse_mlps", "fuse_gated_mlps", "FusionReport", "Candidate", "GATE_ACTIVATIONS"]
