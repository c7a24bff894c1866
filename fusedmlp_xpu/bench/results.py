"""The results tables: one append-only JSON Lines file per machine
(``benchmarks/results/<machine>.jsonl``), one record a line.

Every record carries ``run`` (the run id), ``kind``, ``date``, ``commit``, ``machine``,
``schema`` (the harness's result format) and ``env`` (the environment the harness
recorded). Kinds:

- ``measurement``: one measured case, its fields flat beside those (config, N, dtype,
  mode, backend, median_ms, ... as the harness records them);
- ``run``: one a run, written last: what the run was (``what``), its run-level fields
  (ceilings, notes, options: ``meta``), how many measurements it wrote and under which
  key its harness listed them (``list_key``), and ``complete``. A run cut short (a time
  limit) has measurements and no ``run`` record;
- ``log``: a raw log a page cites (``file``: its old name, ``text``: its content).

``RunWriter`` appends a run as it is timed; ``documents`` reassembles a run into the
harness's own result (what ``fusedmlp report`` reads). ``python -m
fusedmlp_xpu.bench.results add F.json... --table T`` appends result files written
elsewhere (a device run's ``$OUT``); ``index T...`` prints the Markdown index of runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys

#: the folder of the tables, relative to the repository root (the harnesses' default)
RESULTS_DIR = os.path.join("benchmarks", "results")
SUFFIX = ".jsonl"
KINDS = ("measurement", "run", "log")
#: the fields every record has (tests/test_results.py checks them)
REQUIRED = ("run", "kind", "date", "env")
#: the keys under which harnesses list their measurements, in the order looked for
LIST_KEYS = ("records", "rows", "results", "tunings", "kernels")
_TOP = ("run", "kind", "date", "commit", "commit_note", "machine", "schema", "env")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")

#: what each harness's schema is, for a run that says nothing more
SCHEMAS = {
    "fusedmlp-pvc-isa/1": "ci/aot_sycl.py (the ESIMD kernels compiled for pvc: ISA counts)",
    "fusedmlp-bench/1": "fusedmlp bench (narrow configs, or --suite wide)",
    "fusedmlp-bench-wide/1": "fusedmlp bench --suite wide",
    "fusedmlp-bench-steps/1": "fusedmlp bench --suite steps (whole training steps)",
    "fusedmlp-sweep/1": "benchmarks/sweep_narrow.py (narrow kernel tunings)",
    "fusedmlp-bench-cuda-forward/1": "benchmarks/cuda_forward.py (the cuda backend's forward)",
    "fusedmlp-bench-cuda-backward/1": "benchmarks/cuda_backward.py (the cuda backend's backward)",
    "fusedmlp-bench-second-order/1": "benchmarks/second_order.py (the second-order kernel)",
    "fusedmlp-cpu-eager/1": "benchmarks/cpu_eager.py (the CPU path against nn.Sequential)",
    "fusedmlp-host-overhead/1": "benchmarks/overhead.py (host time of one call)",
    "fusedmlp-bench-narrow-recompute/1": "benchmarks/narrow_recompute.py (recompute vs save)",
}


# --- machines, ids, commits ----------------------------------------------------------
def machine(env: dict) -> str:
    """The table a run belongs to: ``cpu`` for CPU runs, else the device's model in
    lower case (``NVIDIA H200`` -> ``h200``, ``Intel(R) Data Center GPU Max 1550`` ->
    ``max1550``)."""
    if env.get("machine"):
        return env["machine"]
    if env.get("vendor", "cpu") == "cpu":
        return "cpu"
    name = re.sub(r"\(R\)|\(TM\)|NVIDIA|Intel|Data Center GPU|GeForce", " ",
                  str(env.get("device", "")), flags=re.I)
    words, out = re.findall(r"[A-Za-z0-9]+", name), []
    for w in words:  # the words up to the first that holds a digit: the model
        out.append(w.lower())
        if any(c.isdigit() for c in w):
            break
    return "".join(out) or str(env.get("vendor"))


def default_table(env: dict) -> str:
    return os.path.join(RESULTS_DIR, machine(env) + SUFFIX)


def new_run_id(env: dict, what: str) -> str:
    """``<machine>-<what>-<date>-<time>``: ``h200-narrow-20261205-101500``."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{machine(env)}-{what}-{stamp}"


def commit_here(root: str | None = None) -> str | None:
    """The commit of the checkout this package runs from (``+dirty`` with local changes);
    for a tree exported without its ``.git`` (``git archive``), the commit named in its
    ``COMMIT`` file; None otherwise. A tree that is not itself a checkout is never given
    the commit of a repository around it."""
    import subprocess

    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.exists(os.path.join(root, ".git")):
        try:
            with open(os.path.join(root, "COMMIT")) as f:
                sha = f.read().strip()
        except OSError:
            return None
        return sha if re.fullmatch(r"[0-9a-f]{7,40}", sha) else None
    try:
        sha = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "") if sha else None


def check_table_path(path: str, arg: str = "--out") -> None:
    if not str(path).endswith(SUFFIX):
        raise ValueError(f"{arg}: expected a results table ending in {SUFFIX} (one per "
                         f"machine, appended to), got {path!r}")


def check_run_id(run: str, arg: str = "run") -> None:
    if not isinstance(run, str) or not _RUN_ID.match(run):
        raise ValueError(f"{arg}: expected letters, digits and . _ + - (no spaces), got {run!r}")


# --- a result <-> records ------------------------------------------------------------
def _env_of(doc: dict) -> dict:
    env = doc.get("env") if isinstance(doc.get("env"), dict) else doc.get("environment")
    return dict(env) if isinstance(env, dict) else {}


def _list_key(doc: dict) -> str | None:
    for key in LIST_KEYS:
        v = doc.get(key)
        if isinstance(v, list) and all(isinstance(r, dict) for r in v):
            return key
    return None


def _header(run: str, kind: str, doc: dict, env: dict, date: str | None,
            commit: str | None) -> dict:
    return {"run": run, "kind": kind, "date": date or env.get("date"),
            "commit": commit or env.get("commit"), "machine": machine(env),
            "schema": doc.get("schema"), "env": env}


def to_records(doc: dict, run: str, *, date: str | None = None, commit: str | None = None,
               what: str | None = None, start: int = 0, final: bool = True) -> list[dict]:
    """A harness's result ``doc`` as table records: its measurements from index ``start``
    on, then (``final``) the run record holding the rest of it."""
    check_run_id(run)
    env = _env_of(doc)
    key = _list_key(doc)
    items = doc.get(key, []) if key else []
    out = []
    for r in items[start:]:
        clash = sorted(set(r) & set(_TOP))
        if clash:
            raise ValueError(f"run {run}: a measurement has fields the table keeps for "
                             f"itself: {clash}")
        out.append({**_header(run, "measurement", doc, env, date, commit), **r})
    if final:
        meta = {k: v for k, v in doc.items() if k not in ("env", "environment", "schema", key)}
        out.append({**_header(run, "run", doc, env, date, commit),
                    "what": what or SCHEMAS.get(doc.get("schema"), "a benchmark run"),
                    "complete": not any(str(n).startswith("partial")
                                        for n in doc.get("notes", []) or []),
                    "measurements": len(items), "list_key": key, "meta": meta})
    return out


def documents(records: list[dict]) -> dict[str, dict]:
    """run id -> the harness's result, reassembled (schema, env, its run-level fields and
    its measurement list), plus ``run``, ``date``, ``commit`` and ``what``. A run without
    its run record (cut short) gets a note saying so."""
    docs: dict[str, dict] = {}
    for r in records:
        if r["kind"] == "log":
            continue
        d = docs.setdefault(r["run"], {"run": r["run"], "schema": r.get("schema"),
                                       "env": r["env"], "date": r["date"],
                                       "commit": r.get("commit"), "_items": []})
        if r["kind"] == "measurement":
            d["_items"].append({k: v for k, v in r.items() if k not in _TOP})
        else:
            d.update(r.get("meta") or {})
            d["what"], d["_key"] = r.get("what"), r.get("list_key")
    for d in docs.values():
        items, key = d.pop("_items"), d.pop("_key", "records")
        if "what" not in d:
            d.setdefault("notes", []).append(
                "partial: the run wrote no run record (cut short before its end)")
        if key or items:
            d[key or "records"] = items
    return docs


# --- reading and writing tables -----------------------------------------------------
def read(path: str) -> list[dict]:
    """Every record of a table, checked: a JSON object a line with run, kind, date, env."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            if not isinstance(r, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(r).__name__}")
            missing = [k for k in REQUIRED if k not in r or r[k] in (None, "")]
            if missing or not isinstance(r["env"], dict) or r["kind"] not in KINDS:
                raise ValueError(f"{path}:{n}: a record needs {', '.join(REQUIRED)} (env an "
                                 f"object, kind one of {KINDS}); missing or bad: "
                                 f"{missing or ['env' if not isinstance(r['env'], dict) else 'kind']}")
            out.append(r)
    return out


def run_ids(path: str) -> set[str]:
    return {r["run"] for r in read(path)} if os.path.exists(path) else set()


def append(path: str, records: list[dict]) -> None:
    """Add ``records`` at the end of the table at ``path`` (made, with its folder, if
    missing); what is there already is never rewritten."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


class RunWriter:
    """Appends one run to a table as it is timed: ``write(doc)`` after each case adds the
    measurements not written yet (a run cut short keeps what it timed), ``write(doc,
    final=True)`` at the end adds the rest and the run record.

    ``path`` None: the machine's table (``default_table``), ``run`` None:
    ``<machine>-<prefix>-<date>-<time>``, both from the environment of the first ``doc``
    written. ``what``: what the run is, in a line (its command)."""

    def __init__(self, path: str | None, run: str | None, what: str, prefix: str = "run"):
        if path is not None:
            check_table_path(path)
        if run is not None:
            check_run_id(run)
        self.path, self.run, self.what, self.prefix = path, run, what, prefix
        self.written, self.done, self.started = 0, False, False

    def _start(self, env: dict) -> None:
        self.path = self.path or default_table(env)
        self.run = self.run or new_run_id(env, self.prefix)
        if self.run in run_ids(self.path):
            raise ValueError(f"run: {self.run!r} is already in {self.path} (run ids are unique)")
        self.started = True

    def write(self, doc: dict, final: bool = False) -> None:
        if self.done:
            raise RuntimeError(f"run {self.run} is finished: its run record is written")
        if not self.started:
            self._start(_env_of(doc))
        recs = to_records(doc, self.run, what=self.what, start=self.written, final=final)
        append(self.path, recs)
        self.written += len(recs) - (1 if final else 0)
        self.done = final


class Unrecorded:
    """A run no table was asked for (``fusedmlp bench`` without ``--out``): the harness
    prints its table and writes no file, so that a run from a user's project or from the
    checkout leaves no results tree behind unasked. Same interface as ``RunWriter``."""

    path = None

    def __init__(self, what: str):
        self.run, self.what = None, what

    def write(self, doc: dict, final: bool = False) -> None:
        pass


def run_writer(out: str | None, run: str | None, what: str, prefix: str = "run"):
    """The writer of ``fusedmlp bench``'s harnesses: a ``RunWriter`` appending to the table
    ``out``, or, without ``out``, an ``Unrecorded`` run (``run`` then is an error: an id
    names a run in a table)."""
    if out:
        return RunWriter(out, run, what, prefix)
    if run:
        raise ValueError("argument --run: a run id names a run in a results table: "
                         "give the table with --out")
    return Unrecorded(what)


def where_written(writer) -> str:
    """The harness's last line: where the run went."""
    if writer.path is None:
        return ("not recorded: add --out TABLE.jsonl to append this run to a results table "
                "(docs/benchmarks.md: benchmarks/results/<machine>.jsonl in a checkout)")
    return f"appended run {writer.run} to {writer.path}"


def load_documents(paths: list[str], runs: list[str] | None = None) -> list[tuple[str, dict]]:
    """(run id, result) for each run in the tables (``.jsonl``) or result files (``.json``,
    a harness's own output) at ``paths``, in order; only the ``runs`` named, if given
    (each must be found)."""
    out = []
    for path in paths:
        if str(path).endswith(SUFFIX):
            out += list(documents(read(path)).items())
            continue
        with open(path) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not JSON ({e})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(doc).__name__}")
        run = os.path.splitext(os.path.basename(path))[0]
        out.append((run, {"run": run, **doc}))
    if runs:
        have = {r for r, _ in out}
        missing = [r for r in runs if r not in have]
        if missing:
            raise ValueError(f"--run: not in the results given: {', '.join(missing)}")
        out = sorted((x for x in out if x[0] in runs), key=lambda x: runs.index(x[0]))
    return out


# --- the index -----------------------------------------------------------------------
def index(paths: list[str]) -> str:
    """The Markdown index of every run in the tables: id, date, records, what it was."""
    lines = ["# benchmarks/results", "",
             "One append-only table per machine (JSON Lines, one record a line: "
             "`fusedmlp_xpu/bench/results.py` says what a record holds); every figure the "
             "docs cite names its run as `run <id>`. Raw logs are kept (as `log` records) "
             "only where a page cites one. Made by `python -m fusedmlp_xpu.bench.results "
             "index` from the tables; do not edit by hand.", ""]
    for path in paths:
        recs = read(path)
        runs: dict[str, dict] = {}
        for r in recs:
            e = runs.setdefault(r["run"], {"date": r["date"], "n": 0, "what": None,
                                           "log": []})
            e["n"] += r["kind"] == "measurement"
            if r["kind"] == "run":
                e["what"] = r.get("what") + ("" if r.get("complete", True) else " (partial)")
            elif r["kind"] == "log":
                e["log"].append(r.get("file"))
                e["log_what"] = r.get("what")
        lines += [f"## `{os.path.basename(path)}`: {len(runs)} runs", "",
                  "| run | date | measurements | what it was |", "| --- | --- | --- | --- |"]
        for run in sorted(runs, key=lambda k: (runs[k]["date"][:10], k)):
            e = runs[run]
            if e["log"]:
                what = (e["what"] or e.get("log_what") or "a raw log") + "; log " + ", ".join(f"`{f}`" for f in e["log"])
            else:
                what = e["what"] or "(no run record: cut short)"
            lines.append(f"| `{run}` | {e['date'][:10]} | {e['n']} | "
                         f"{what.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def _add_table(path: str, table: str | None) -> None:
    """Append each run of the table at ``path`` to ``table`` (default: its machine's),
    records unchanged; a run id already there is refused before anything is written."""
    by_run: dict[str, list[dict]] = {}
    for r in read(path):
        by_run.setdefault(r["run"], []).append(r)
    plan = [(table or os.path.join(RESULTS_DIR, recs[0]["machine"] + SUFFIX), run, recs)
            for run, recs in by_run.items()]
    clash = [f"{run} ({t})" for t, run, _ in plan if run in run_ids(t)]
    if clash:
        raise ValueError(f"run ids already in the table: {', '.join(clash)}")
    for t, run, recs in plan:
        append(t, recs)
        print(f"{path} -> {t} (run {run}, {len(recs)} records)")


def log_record(path: str, run: str, what: str, machine_name: str, date: str,
               keep: str | None = None, commit: str | None = None) -> dict:
    """A ``log`` record of the text file at ``path`` (only its lines matching the regular
    expression ``keep``, if given: a verbose test log's failures and summary)."""
    check_run_id(run)
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    if keep is not None:
        pat = re.compile(keep)
        lines = [ln for ln in lines if pat.search(ln)]
    return {"run": run, "kind": "log", "date": date, "commit": commit,
            "machine": machine_name, "schema": None,
            "env": {"machine": machine_name, "unrecorded": "a raw log: its environment is in "
                    "its text"}, "what": what, "file": os.path.basename(path),
            "text": "\n".join(lines) + "\n"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedmlp_xpu.bench.results",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="append harness result files (.json) or the runs of "
                       "another table (.jsonl) to the machine's table")
    a.add_argument("files", nargs="+")
    a.add_argument("--table", default=None, help="default: the machine's table in "
                   f"{RESULTS_DIR}")
    a.add_argument("--what", default=None, help="what the run was (default: its harness)")
    i = sub.add_parser("index", help="the Markdown index of the tables' runs, on stdout")
    i.add_argument("tables", nargs="+")
    lg = sub.add_parser("log", help="append a raw log (a device run's test or sanitizer "
                        "output) as one log record")
    lg.add_argument("file")
    lg.add_argument("--run", required=True, metavar="ID")
    lg.add_argument("--what", required=True, help="what the log is of")
    lg.add_argument("--machine", required=True, help="the machine it ran on (its table)")
    lg.add_argument("--date", default=None, help="YYYY-MM-DD (default: today)")
    lg.add_argument("--keep", default=None, metavar="REGEX",
                    help="keep only the lines matching this (default: every line)")
    lg.add_argument("--table", default=None)
    args = p.parse_args(argv)
    try:
        if args.cmd == "index":
            print(index(args.tables))
            return 0
        if args.cmd == "log":
            table = args.table or os.path.join(RESULTS_DIR, args.machine + SUFFIX)
            check_table_path(table, "--table")
            if args.run in run_ids(table):
                raise ValueError(f"run id already in {table}: {args.run}")
            date = args.date or datetime.date.today().isoformat()
            append(table, [log_record(args.file, args.run, args.what, args.machine, date,
                                      args.keep, commit_here())])
            print(f"{args.file} -> {table} (run {args.run}, log)")
            return 0
        for path in args.files:
            if path.endswith(SUFFIX):  # another table (a device run's): its runs as they are
                _add_table(path, args.table)
                continue
            (run, doc), = load_documents([path])
            doc.pop("run")
            w = RunWriter(args.table, run, args.what or SCHEMAS.get(doc.get("schema"),
                                                                    f"a run added from {path}"))
            w.write(doc, final=True)
            print(f"{path} -> {w.path} (run {run})")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
