"""Kernel launches with less host time once a kernel is compiled (CUDA only).

``kernel[grid](...)`` binds and specializes every argument, builds a string cache key and
walks Triton's hook and global checks on every call; for the autotuned kernels the
autotuner and the heuristics layer add their own argument dicts on top. At decode-sized
inputs that host work is the whole cost of a call. Here the first call of each
*specialization* goes through Triton as usual and keeps the compiled kernel it returns;
later calls with the same specialization call that kernel's launcher directly.

The specialization key is deliberately finer than Triton's own: per tensor its dtype and
whether its address is 16-byte aligned, per int whether it is 1, a multiple of 16, and
fits 32 bits, plus every constexpr value, the launch options and the device. Two calls
with one key therefore always map to the same compiled kernel. Falls back to Triton's
own path when a launch hook is set (profilers such as proton), on non-CUDA devices (the
XPU launcher is not verified here), under the interpreter, or with
``FUSEDMLP_FAST_LAUNCH=0``.
"""
from __future__ import annotations

import contextlib
import threading
import time

import torch

from ... import envvars
from ..notes import LOG, QUIET_ENV, note_compile  # noqa: F401  (QUIET_ENV, LOG: re-exported)

FAST_ENV = "FUSEDMLP_FAST_LAUNCH"
_I32 = 1 << 31

#: Triton's interpreter (CPU tensors) patches triton.language module-wide while a kernel
#: runs: two threads interpreting at once break each other (8 threads on one FusedMLP:
#: "Did you forget to add @triton.jit?" in 5-8 of them). Interpreted launches take turns.
_INTERPRETER = threading.Lock()


def _interpreted(device: torch.device):
    """The lock interpreted launches hold (the CPU), else a no-op context."""
    return _INTERPRETER if device.type == "cpu" else contextlib.nullcontext()


#: a launch through Triton's own path that takes this long compiled (or autotuned)
COMPILE_NOTE_S = 0.5


def _through_triton(name: str, run):
    """``run()`` (a launch through Triton's own path: compiles on a first call), noting a
    slow one (note_compile)."""
    t = time.perf_counter()
    out = run()
    dt = time.perf_counter() - t
    if dt >= COMPILE_NOTE_S:
        note_compile(name, dt)
    return out


try:
    from triton import knobs as _knobs
except ImportError:  # an older Triton: no knobs, no way to see hooks -> Triton's own path
    _knobs = None


def _hooked() -> bool:
    """Whether a launch hook is installed (None, or an empty HookChain in newer Triton,
    means none)."""
    if _knobs is None:
        return True
    rt = _knobs.runtime  # no generator: this runs on every lean launch
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True)))


def direct_ok(device_index: int) -> bool:
    """Whether a plan may launch a kept entry directly now: no launch hook installed and
    the entry's device current (the launcher takes the current stream of that index)."""
    return not _hooked() and torch.cuda.current_device() == device_index


_THREAD = threading.local()  # bind_context's devices, per thread


def bind_context(device: torch.device) -> None:
    """Make the CUDA context of ``device`` current on this thread (once a thread; nothing
    for other devices: the interpreter's CPU tensors, XPU).
    Triton's launcher turns TMA descriptors into tensor maps, a driver call that needs a
    current context, before its launch code binds one: a kernel with descriptors that is
    the first CUDA work of a thread (autograd's device thread running this op's backward
    as the graph's first node, a new Python thread) fails with "invalid device context".
    Asking whether the stream is capturing binds it (the runtime makes the device's
    primary context current for a call that needs one), and is allowed while it is (a
    stream query would end a CUDA graph's capture)."""
    bound = _THREAD.__dict__
    if device.index not in bound and device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.is_current_stream_capturing()
        bound[device.index] = True


def enabled(device: torch.device) -> bool:
    return (device.type == "cuda" and envvars.get(FAST_ENV, "1") != "0"
            and envvars.get("TRITON_INTERPRET", "0") in ("", "0"))


def int_key(a: int) -> int:
    """What Triton specializes an int argument on, as 3 bits: == 1, a multiple of 16,
    fits 32 bits."""
    return (a == 1) | (a % 16 == 0) << 1 | (-_I32 <= a < _I32) << 2


def arg_key(a):
    """What Triton specializes a runtime argument on (or finer)."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if type(a) is int:
        return int_key(a)
    return type(a), a


_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))


def args_key(args) -> tuple:
    """arg_key of every argument, in one loop (host time: ~20 arguments a launch, the
    same tensor often passed several times in a row as a placeholder)."""
    out = []
    last = last_key = None
    for a in args:
        t = type(a)
        if t is int:  # int_key inline: ~20 arguments a launch
            out.append((a == 1) | (a % 16 == 0) << 1 | (-_I32 <= a < _I32) << 2)
        elif a is last:
            out.append(last_key)
        elif t in _TENSORS:
            last, last_key = a, (a.dtype, a.data_ptr() % 16 == 0)
            out.append(last_key)
        else:
            out.append(arg_key(a))
    return tuple(out)


def fitting(memo: dict, key, stages: int, run, least: int = 1) -> bool:
    """``run(s)`` launches a kernel with ``s`` pipeline stages; try up to ``stages``. Where
    the device refuses the shared memory that asks (Triton's OutOfResources), one stage
    fewer, down to ``least``; the count that fits is remembered in ``memo[key]``, so
    later calls start there. False when not even ``least`` stages fit."""
    stages = min(stages, memo.get(key, stages))
    while stages >= least:
        try:
            run(stages)
            return True
        except Exception as e:  # only the refusal of resources steps down
            if type(e).__name__ != "OutOfResources":
                raise
            stages -= 1
            memo[key] = stages
    return False


#: every launcher made in this process (diagnostics: stats())
_ALL: list = []


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", "?")


def stats() -> dict[str, int]:
    """Launches that took the lean path so far, per kernel (a benchmark records it: a
    zero where calls repeat means the lean path did not engage)."""
    out: dict[str, int] = {}
    for la in _ALL:
        out[_name(la.fn)] = out.get(_name(la.fn), 0) + la.direct
    return out


def _constexpr_names(fn) -> tuple[str, ...]:
    return tuple(p.name for p in fn.params if p.is_constexpr)


def _direct(entry, grid, args, device_index):
    run, function, packed, tail = entry
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    stream = torch._C._cuda_getCurrentRawStream(device_index)
    run(grid[0], g1, g2, stream, function, packed, None, None, None, *args, *tail)


def _entry(ck, names, values: dict):
    """What a direct launch needs from a compiled kernel: its launcher, function handle,
    packed metadata, and the constexpr values in signature order (the launcher takes every
    argument, constexprs included, and skips the constexprs itself)."""
    if ck is None or not hasattr(ck, "packed_metadata"):
        return None
    return ck.run, ck.function, ck.packed_metadata, tuple(values[n] for n in names)


class Launcher:
    """A @triton.jit kernel. ``launch(grid, args, consts, device, **options)``: ``args``
    are the runtime arguments in signature order (all of them come before the
    constexprs), ``consts`` the constexprs by name, ``options`` num_warps/num_stages."""

    def __init__(self, fn):
        self.fn = fn
        self._names = None  # read from the JITFunction on first use (the interpreter's
        self._arg_names = None  # function has no params; it never takes the lean path)
        self._cache: dict = {}
        self.direct = 0  # launches that took the lean path (diagnostics)
        _ALL.append(self)

    def _prepare(self):
        self._names = _constexpr_names(self.fn)
        self._arg_names = [p.name for p in self.fn.params]

    def _take(self, key, grid, args, device) -> bool:
        """Launch the cached kernel of ``key`` directly, if there is one and no hook."""
        entry = self._cache.get(key)
        if entry is None or _hooked():
            return False
        e, cfg = entry
        _direct(e, grid if cfg is None else grid(cfg), args, device.index)
        self.direct += 1
        return True

    def _keep(self, key, ck, values: dict, cfg=None):
        """Cache what a direct launch of the compiled kernel ``ck`` needs."""
        e = _entry(ck, self._names, values)
        if e is not None:
            self._cache[key] = (e, cfg)

    @staticmethod
    def _key(args, consts, device, options) -> tuple:
        return device.index, tuple(options.items()), tuple(consts.items()), args_key(args)

    def launch(self, grid, args: tuple, consts: dict, device: torch.device, **options):
        if not enabled(device):
            with _interpreted(device):
                if device.type == "cpu":  # the interpreter compiles nothing
                    self.fn[grid](*args, **consts, **options)
                else:
                    _through_triton(_name(self.fn), lambda: self.fn[grid](*args, **consts,
                                                                           **options))
            return
        key = self._key(args, consts, device, options)
        if self._take(key, grid, args, device):
            return
        ck = _through_triton(_name(self.fn), lambda: self.fn[grid](*args, **consts, **options))
        if not _hooked():
            if self._names is None:
                self._prepare()
            self._keep(key, ck, consts)

    def cached(self, args: tuple, consts: dict, device: torch.device, **options):
        """The direct-launch entry a launch with these arguments would take (None: none
        kept yet, or a tuned kernel). A caller that knows which arguments of its launches
        can vary keeps it under a shorter key of its own and calls ``launch_entry``."""
        entry = self._cache.get(self._key(args, consts, device, options))
        return None if entry is None or entry[1] is not None else entry[0]

    def launch_entry(self, entry, grid, args: tuple, device_index: int) -> None:
        """Launch ``entry`` (from ``cached``) directly: no key, no hook check; the caller
        checked ``_hooked()`` and that the arguments specialize as when it was cached."""
        _direct(entry, grid, args, device_index)
        self.direct += 1

    def cache_size(self) -> int:
        return len(self._cache)


class TunedLauncher(Launcher):
    """An autotuned kernel (``triton.autotune`` over ``triton.heuristics`` over the
    @triton.jit function ``fn``). The autotuner runs as usual on the first call of each
    key; afterwards its chosen config is launched directly. ``launch(grid, args, consts,
    device)``: ``grid(meta)`` gives the grid for a config's constexprs; ``heuristics``
    are the values the heuristics layer adds, as functions of all arguments by name;
    ``tune`` names every runtime int the tuning key or a heuristic reads: the fast key
    holds their values (the autotuner picks by value), the other ints only their
    specialization."""

    def __init__(self, tuner, fn, heuristics: dict, tune: tuple[str, ...]):
        super().__init__(fn)
        self.tuner, self.heuristics, self.tune = tuner, heuristics, tune

    def _prepare(self):
        super()._prepare()
        self._tune = tuple(self._arg_names.index(n) for n in self.tune if n in self._arg_names)

    def _key(self, args, consts, device, options) -> tuple:
        return (device.index, tuple(args[i] for i in self._tune), tuple(consts.items()),
                args_key(args))

    def cached(self, args: tuple, consts: dict, device: torch.device):
        """(entry, the chosen config's constexprs) that a launch with these arguments
        would take directly, or None (see Launcher.cached)."""
        if self._names is None:
            return None
        entry = self._cache.get(self._key(args, consts, device, None))
        return None if entry is None or entry[1] is None else entry

    def launch(self, grid, args: tuple, consts: dict, device: torch.device):
        if not enabled(device):
            with _interpreted(device):
                if device.type == "cpu":
                    self.tuner[grid](*args, **consts)
                else:
                    _through_triton(_name(self.fn), lambda: self.tuner[grid](*args, **consts))
            return
        if self._names is None:
            self._prepare()
        key = self._key(args, consts, device, None)
        if self._take(key, grid, args, device):
            return
        ck = _through_triton(_name(self.fn) + " (autotuning)",
                             lambda: self.tuner[grid](*args, **consts))
        cfg = getattr(self.tuner, "best_config", None)
        if cfg is None or _hooked() or cfg.pre_hook is not None:
            return
        values = {**dict(zip(self._arg_names, args)), **consts, **cfg.kwargs}
        for name, h in self.heuristics.items():
            values[name] = h(values)
        self._keep(key, ck, values, dict(cfg.kwargs))
