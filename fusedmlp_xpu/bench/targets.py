"""The benchmark targets (benchmarks/README.md) as data, checked against bench records.

``check(records)`` takes every record of one bench file, all passes, and returns one
``Verdict`` per target and config that the file has numbers for. A verdict gives the
range of the measured value over every case and pass the target covers, so one slow
pass or dtype is not hidden behind a faster one, and says "met" only when the whole
range is on the right side of the target. Where a case was also replayed from a CUDA
graph, the graph's time is the device time (a small batch called from Python is bound by
the host), and "met on device time" says the target holds for it but not from Python.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

NARROW = ("narrow-w32", "narrow-w64", "narrow-w128")
WIDE = ("wide-gelu", "wide-swiglu")
#: the backends that are not the package's op in a bench file
BASELINES = ("eager", "compile", "bare")


@dataclass(frozen=True)
class Verdict:
    target: str
    config: str
    python: tuple[float, float] | None  # (lowest, highest) as called from Python
    device: tuple[float, float] | None  # the same with graph replays where timed
    unit: str
    status: str  # "met", "met on device time", "missed"
    n: int  # measurements in the ranges (cases x passes)


def _range(vals):
    return (min(vals), max(vals)) if vals else None


def _ok(rng, limit, at_most: bool, strict: bool = False) -> bool:
    if rng is None:
        return False
    if at_most:
        return rng[1] < limit if strict else rng[1] <= limit
    return rng[0] > limit if strict else rng[0] >= limit


def _verdict(target, config, py, dev, unit, limit, at_most, strict=False) -> Verdict:
    py_r, dev_r = _range(py), _range(dev)
    if (py_r is not None and _ok(py_r, limit, at_most, strict)
            and (dev_r is None or _ok(dev_r, limit, at_most, strict))):
        status = "met"
    elif py_r is None and _ok(dev_r, limit, at_most, strict):
        status = "met"  # a graph-replay target: the device time is the measure
    elif _ok(dev_r, limit, at_most, strict):
        status = "met on device time"
    else:
        status = "missed"
    return Verdict(target, config, py_r, dev_r, unit, status, len(py or dev or ()))


def _ours(r) -> bool:
    return r["backend"] not in BASELINES and r["timing"] in ("python", "graph")


def _case(r) -> tuple:
    return r["config"], r["N"], r["dtype"], r["mode"], r["backend"]


def _floor_multiples(records, configs, mode, n_ok):
    """config -> (x_floor from Python, device x_floor) of our op: the device value of a
    case is its graph replay's where it has one, else its Python time."""
    py, graph = defaultdict(list), defaultdict(list)
    for r in records:
        if (r["config"] in configs and r["mode"] == mode and n_ok(r["N"]) and _ours(r)
                and r["x_floor"]):
            (graph if r["timing"] == "graph" else py)[_case(r)].append(r["x_floor"])
    out = defaultdict(lambda: ([], []))
    for case in sorted(set(py) | set(graph)):
        out[case[0]][0].extend(py[case])
        out[case[0]][1].extend(graph[case] or py[case])
    return out


def _graph_only(records, configs, mode, n):
    out = defaultdict(list)
    for r in records:
        if (r["config"] in configs and r["mode"] == mode and r["N"] == n and _ours(r)
                and r["timing"] == "graph" and r["x_floor"]):
            out[r["config"]].append(r["x_floor"])
    return out


def _ratios(records, config_ok, mode, base, timing, n_ok=lambda n: True):
    """config -> base's median / ours, pass by pass, same N, dtype and timing."""
    by = defaultdict(dict)
    for r in records:
        if config_ok(r["config"]) and r["mode"] == mode and r["timing"] == timing and n_ok(r["N"]):
            by[(r["config"], r["N"], r["dtype"], r.get("pass", 1))][r["backend"]] = r["median_ms"]
    out = defaultdict(list)
    for (config, *_), b in by.items():
        for name, ms in b.items():
            if name not in BASELINES and base in b and ms > 0:
                out[config].append(b[base] / ms)
    return out


def check(records: list[dict]) -> list[Verdict]:
    """Every target that ``records`` (one bench file, all passes) has numbers for."""
    v = []
    for mode, limit, name in (("inference", 1.25, "narrow inference, N >= 2^20: <= 1.25x floor"),
                              ("train", 2.0, "narrow train step, N >= 2^20: <= 2x floor")):
        for config, (py, dev) in sorted(_floor_multiples(
                records, NARROW, mode, lambda n: n >= 2 ** 20).items()):
            v.append(_verdict(name, config, py, dev, "x floor", limit, True))
    for config, vals in sorted(_ratios(records, lambda c: c in NARROW, "train",
                                       "compile", "python").items()):
        v.append(_verdict("narrow train step: >= 4x faster than torch.compile", config,
                          vals, None, "x faster", 4.0, False))
    for mode in ("inference", "train"):
        for config, vals in sorted(_graph_only(records, NARROW, mode, 2 ** 16).items()):
            v.append(_verdict(f"narrow {mode}, N = 2^16 from a CUDA graph: <= 3x floor", config,
                              None, vals, "x floor", 3.0, True))
    py = _ratios(records, lambda c: c == "paper-table1", "inference", "eager", "python")
    dev = _ratios(records, lambda c: c == "paper-table1", "inference", "eager", "graph")
    if py or dev:
        vals = py.get("paper-table1", [])
        v.append(_verdict("paper-table1 inference: >= 20x faster than eager", "paper-table1",
                          vals, dev.get("paper-table1") or None, "x faster", 20.0, False))
    host = defaultdict(list)
    for r in records:
        if r["timing"] == "host":
            host[r["config"]].append(r.get("host_us", r["median_ms"] * 1e3))
    for config, vals in sorted(host.items()):
        v.append(_verdict("host time of one eager call: <= 15 us", config, vals, None, "us",
                          15.0, True))
    v += _wide(records)
    return v


def _wide(records) -> list[Verdict]:
    v = []
    for mode in ("inference", "train"):
        xb = defaultdict(list)
        for r in records:
            if (r["config"] in WIDE and r["mode"] == mode and r["N"] == 8192 and _ours(r)
                    and r["timing"] == "python" and r.get("x_bare")):
                xb[r["config"]].append(r["x_bare"])
        for config, vals in sorted(xb.items()):
            v.append(_verdict(f"wide {mode}, M 8192: <= 1.02x the bare matmuls", config, vals,
                              None, "x bare", 1.02, True))
    for configs, rows, name, strict in ((WIDE, 8192, "wide train peak memory: below eager's",
                                         True),
                                        (("narrow-w128",), 1 << 20,
                                         "narrow-w128 train peak memory, 2^20 rows: <= eager's",
                                         False)):
        mem = defaultdict(lambda: defaultdict(dict))
        for r in records:
            if (r["config"] in configs and r["mode"] == "train" and r["N"] == rows
                    and r.get("peak_mem_MB") and r["timing"] == "python"):
                mem[r["config"]][r["dtype"]][r["backend"]] = r["peak_mem_MB"]
        for config, by_dtype in sorted(mem.items()):
            ratios = [mb / m["eager"] for m in by_dtype.values() if "eager" in m
                      for b, mb in m.items() if b not in BASELINES]
            if ratios:
                v.append(_verdict(name, config, ratios, None, "x eager's", 1.0, True,
                                  strict=strict))
    for mode in ("inference", "train"):
        for config, vals in sorted(_ratios(records, lambda c: c in WIDE, mode, "eager", "python",
                                           lambda n: n == 16).items()):
            v.append(_verdict(f"wide {mode}, M 16: no slower than eager", config, vals, None,
                              "x eager's speed", 1.0, False))
    return v
