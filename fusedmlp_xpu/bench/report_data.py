"""The floor under ``fusedmlp report``: bench runs read from the results tables (or a
harness's JSON file) and checked, their two passes merged, speed-ups computed from the
records, and the Markdown helpers the report's pages share (report.py: the page and its
appendix; report_history.py: every run; report_plots.py: the figures)."""
from __future__ import annotations

import datetime as _dt
from collections import defaultdict
from dataclasses import dataclass, field

from . import results

SCHEMA = "fusedmlp-bench/1"
BASELINES = ("eager", "compile")
#: backends that are not competitors in a speed-up: the baselines themselves, and "bare"
#: (the same matmuls without bias/activation), which is a floor, not an op
NOT_COMPETING = BASELINES + ("bare",)
RECORD_KEYS = ("config", "N", "dtype", "mode", "backend", "timing", "pass", "median_ms",
               "rows_per_s", "floor_ms", "x_floor")
#: two passes of one measurement further apart than this suggest throttling (benchmarks/README.md, protocol)
PASS_SPREAD = 0.05


@dataclass
class Machine:
    """One bench run: its environment, ceilings, notes and records. ``machine`` is the
    table it belongs to (results.machine: ``h200``, ``cpu``), ``complete`` False for a
    run cut short (no run record, or a note saying ``partial``)."""

    label: str
    run: str
    env: dict
    ceilings: dict
    notes: list[str]
    records: list[dict]
    spread: list[tuple[dict, dict, float]] = field(default_factory=list)  # pass disagreements
    host: list[dict] = field(default_factory=list)  # host overhead per call (timing "host")
    raw: list[dict] = field(default_factory=list)  # every record, every pass (targets)
    machine: str = ""
    date: str = ""
    commit: str | None = None
    complete: bool = True


def _check_run(run: str, data: dict) -> dict:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"run {run}: expected schema {SCHEMA!r}, got {data.get('schema')!r}")
    for i, r in enumerate(data.get("records", [])):
        missing = [k for k in RECORD_KEYS if k not in r]
        if missing:
            raise ValueError(f"run {run}: record {i} lacks {', '.join(missing)}")
    return data


def documents(paths: list[str]) -> list[tuple[str, dict, bool]]:
    """(run id, result, from a table) of every run, of every harness, in the tables and
    files at ``paths``, read once: the report takes its bench runs and the Max 1550's
    from them."""
    if not paths:
        raise ValueError("results: give at least one results table or bench JSON file")
    return [(r, d, str(path).endswith(results.SUFFIX))
            for path in paths for r, d in results.load_documents([path])]


def machines(docs: list[tuple[str, dict, bool]], runs: list[str] | None = None,
             also: tuple[str, ...] = ()) -> list[Machine]:
    """Check the bench runs of ``docs`` and make one Machine each, labelled by its device
    name (plus the run id where two runs name the same device): every bench run of the
    tables and every file given by name (refused if it is no bench run), or only the
    ``runs`` named, in that order (a named run of a schema in ``also`` is left to the
    caller, not refused)."""
    if runs:
        have = {r: d for r, d, _ in docs}
        missing = [r for r in runs if r not in have]
        if missing:
            raise ValueError(f"--run: not in the results given: {', '.join(missing)}")
        raw = [(r, have[r]) for r in runs if have[r].get("schema") not in also]
        for r, d in raw:
            try:
                _check_run(r, d)
            except ValueError as e:
                raise ValueError(f"--run: {e}") from None
    else:
        # a table holds every harness's runs: the bench runs are the report's
        raw = [(r, d) for r, d, table in docs if not table or d.get("schema") == SCHEMA]
    raw = [(r, _check_run(r, d)) for r, d in raw]
    names = [d.get("env", {}).get("device") or p for p, d in raw]
    out = []
    for (p, d), name in zip(raw, names):
        label = name if names.count(name) == 1 else f"{name} ({p})"
        recs = list(d.get("records", []))
        env = d.get("env", {})
        m = Machine(label, p, env, d.get("ceilings", {}), list(d.get("notes", [])),
                    [r for r in recs if r["timing"] != "host"],
                    host=[r for r in recs if r["timing"] == "host"], raw=recs,
                    machine=results.machine(env), date=str(d.get("date") or env.get("date") or ""),
                    commit=d.get("commit") or env.get("commit"),
                    complete=not any(str(n).startswith("partial") for n in d.get("notes", [])))
        m.records, m.spread = merge_passes(m.records)
        out.append(m)
    return out


def load(paths: list[str], runs: list[str] | None = None) -> list[Machine]:
    """Read and check bench runs: every ``fusedmlp bench`` run in the tables (``.jsonl``)
    and files (``.json``) at ``paths``, or only the ``runs`` named; one Machine per run."""
    found = machines(documents(paths), runs)
    if not found:
        raise ValueError(f"results: no run of schema {SCHEMA!r} in {', '.join(paths)}")
    return found


def when(m: Machine) -> _dt.datetime:
    """A run's date as a moment (a date alone counts as its midnight, UTC)."""
    try:
        t = _dt.datetime.fromisoformat(m.date)
    except ValueError:
        return _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def key(r: dict) -> tuple:
    return (r["config"], r["N"], r["dtype"], r["mode"], r["backend"], r["timing"])


def merge_passes(records: list[dict]):
    """Keep the faster pass of each measurement (a slower pass is the card throttling or
    the host interfering, not the kernel), and list pairs further apart than PASS_SPREAD."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[key(r)].append(r)
    best, spread = [], []
    for rs in groups.values():
        rs = sorted(rs, key=lambda r: r["median_ms"])
        best.append(rs[0])
        if len(rs) > 1 and rs[0]["median_ms"] > 0:
            s = rs[-1]["median_ms"] / rs[0]["median_ms"] - 1
            if s > PASS_SPREAD:
                spread.append((rs[0], rs[-1], s))
    return best, spread


def speedups(m: Machine) -> dict[tuple, dict[str, float]]:
    """(key) -> {"eager": x, "compile": x}: baseline median / this median, same config,
    N, dtype, mode, both timed from Python (graph replay has no baseline to match)."""
    base = {key(r): r for r in m.records if r["backend"] in BASELINES}
    out = {}
    for r in m.records:
        if r["timing"] != "python":
            continue
        ratios = {}
        for b in BASELINES:
            k = (r["config"], r["N"], r["dtype"], r["mode"], b, "python")
            if k in base and r["median_ms"] > 0:
                ratios[b] = base[k]["median_ms"] / r["median_ms"]
        out[key(r)] = ratios
    return out


# --- formatting helpers --------------------------------------------------------------
def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def fmt_ms(v) -> str:
    """Milliseconds: no exponent notation, 4 significant digits below 1000."""
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def pow2(n: int) -> str:
    """2^k for powers of two (how the benchmark configs name batches), else the number."""
    if n > 0 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return str(n)


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def spread_table(first: str, spread: list[tuple[str, dict, dict, float]]) -> list[str]:
    """The measurements whose two passes disagree, [(first column, faster record, slower
    record, spread)] -> a Markdown table, or one line saying there are none."""
    if not spread:
        return [f"None above {PASS_SPREAD:.0%}."]
    return md_table([first, "config", "mode", "dtype", "N", "backend", "timing", "fast ms",
                     "slow ms", "spread"],
                    [[name, a["config"], a["mode"], a["dtype"], pow2(a["N"]), a["backend"],
                      a["timing"], fmt_ms(a["median_ms"]), fmt_ms(b["median_ms"]), f"{s:.1%}"]
                     for name, a, b, s in spread])


def slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s)
