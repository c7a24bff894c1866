"""The docs site's pages: every ```python block runs as written, in page order, one
namespace per page; links and pictures point at files that exist. `mkdocs build --strict`
(in .ci/run) checks the nav and the links between pages; this file checks what it cannot."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PAGES = sorted(os.path.relpath(os.path.join(d, f), DOCS)
               for d, _, files in os.walk(DOCS) for f in files if f.endswith(".md"))
# A fence of exactly ```python runs; other fences (```bash, ```text, ```python title=...
# for a GPU-only snippet) are shown, not run.
PY_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks(page: str) -> list[str]:
    with open(os.path.join(DOCS, page)) as f:
        return PY_BLOCK.findall(f.read())


RUNNABLE = [p for p in PAGES if _blocks(p)]
# Pages whose blocks need an optional extra: (extra, its modules the blocks use, the
# variable under which CI requires them). Without them the page skips, naming the extra.
PAGE_EXTRAS = {"deploy.md": ("deploy", ("onnx", "onnxscript", "onnxruntime"),
                             "FUSEDMLP_REQUIRE_DEPLOY")}


def _skip_without_extra(page: str) -> None:
    if page not in PAGE_EXTRAS:
        return
    extra, modules, require = PAGE_EXTRAS[page]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing and os.environ.get(require) != "1":
        pytest.skip(f"docs/{page} needs {', '.join(missing)}: pip install '.[{extra}]'")


def test_the_profiling_guide_has_runnable_blocks():
    assert len(_blocks(os.path.join("guide", "profiling.md"))) >= 6


# The guide quotes one GPU run of its own blocks, named in its note; the run's log record
# (docs/guide/run_guide.py's <run>.json, logged with `fusedmlp_xpu.bench.results log`)
# is in the machine's table.
_GUIDE_RUN = re.compile(r"Every output below is from run `(?P<run>(?P<machine>[a-z0-9]+)-guide-[\w-]+)`")


def _guide_run() -> tuple[str, dict]:
    import json

    text = open(os.path.join(DOCS, "guide", "profiling.md")).read()
    m = _GUIDE_RUN.search(text)
    assert m, "docs/guide/profiling.md: its note names no run (`Every output below is from run `...``)"
    table = os.path.join(ROOT, "benchmarks", "results", f"{m['machine']}.jsonl")
    with open(table) as f:
        logs = [r for r in map(json.loads, f) if r["run"] == m["run"] and r["kind"] == "log"]
    assert len(logs) == 1, f"{table}: {len(logs)} log records of run {m['run']}, want 1"
    return text, json.loads(logs[0]["text"])


def test_the_guide_quotes_its_committed_run(tmp_path):
    """Every output on docs/guide/profiling.md is, in full, what its block printed in the
    run the page names: the page is what `run_guide.py --quote` writes from that run's
    committed record, so neither can change without the other."""
    import json

    text, run = _guide_run()
    assert run["page"] == "docs/guide/profiling.md" and run["complete"], run.get("page")
    assert len(run["blocks"]) == len(_blocks(os.path.join("guide", "profiling.md"))), (
        "the page's blocks and the run's differ in number: quote a run of these blocks")
    assert f"an {run['device']}" in text, f"the note does not name the card, {run['device']}"
    spec = importlib.util.spec_from_file_location(
        "run_guide", os.path.join(DOCS, "guide", "run_guide.py"))
    run_guide = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_guide)
    page, run_json = tmp_path / "profiling.md", tmp_path / "run.json"
    page.write_text(text)
    run_json.write_text(json.dumps(run))
    assert run_guide.quote(str(run_json), str(page)) == len(run["blocks"])
    requoted = page.read_text()
    assert requoted == text, (
        "docs/guide/profiling.md's outputs differ from run "
        f"{run['run']}'s: python docs/guide/run_guide.py --quote <its json>")


@pytest.mark.parametrize("page", RUNNABLE)
def test_python_blocks_run(page, tmp_path):
    """Each page in a fresh interpreter (torch.compile and the profiler keep global state),
    its blocks joined in order with a marker line before each, so a failure names the block."""
    _skip_without_extra(page)
    parts = []
    for i, block in enumerate(_blocks(page), 1):
        parts.append(f"print('--- block {i}', flush=True)\n{block}")
    script = tmp_path / "page.py"
    script.write_text("\n".join(parts))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.environ.get(
        "TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor")))
    # the page runs in tmp_path: a relative PYTHONPATH (the GPU machine runs the suite
    # from the tree with PYTHONPATH=.) must still find the package
    env["PYTHONPATH"] = os.pathsep.join(
        [ROOT] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("--- block ")]
    where = last[-1].removeprefix("--- ") if last else "before the first block"
    assert proc.returncode == 0, (
        f"docs/{page}: {where} failed:\n{proc.stderr[-3000:]}")


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", ["README.md"] + [os.path.join("docs", p) for p in PAGES])
def test_relative_links_resolve(page):
    path = os.path.join(ROOT, page)
    text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)
    missing = [t for t in _LINK.findall(text)
               if "://" not in t and not t.startswith("mailto:")
               and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), t)))]
    assert not missing, f"{page}: links to missing files: {missing}"


def test_docs_extra_lists_the_site_tools():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    docs = re.search(r"^docs = \[(.*)\]\s*$", text, re.M)
    assert docs, "pyproject.toml: no `docs` extra"
    for tool in ("mkdocs", "mkdocs-material", "mkdocstrings[python]"):
        assert f'"{tool}' in docs.group(1), f"the docs extra lacks {tool}"


def test_ci_builds_the_site_strictly():
    """The `site` fixture below builds it with --strict; CI must not let it skip."""
    run = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^export FUSEDMLP_REQUIRE_DOCS=1$", run, re.M), (
        ".ci/run lets the site build skip")


def test_every_page_is_in_the_nav():
    nav = open(os.path.join(ROOT, "mkdocs.yml")).read()
    missing = [p for p in PAGES if p.replace(os.sep, "/") not in nav]
    assert not missing, f"mkdocs.yml's nav lacks {missing}"


# --- the built site ----------------------------------------------------------------------
class _DocObjects(HTMLParser):
    """Every id of a page, and each mkdocstrings object's heading text (its signature) and
    own text: the text of its ``doc-contents`` outside its members' and outside the
    ``Bases:`` line."""

    def __init__(self):
        super().__init__()
        self.ids, self.heading, self.own = [], {}, {}
        self._divs, self._in_heading, self._last, self._bases = [], None, None, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(a["id"])
        classes = (a.get("class") or "").split()
        if "doc-heading" in classes:
            self._in_heading = self._last = a.get("id")
            self.heading[self._last] = ""
        if tag == "div":
            self._divs.append(self._last if "doc-contents" in classes else None)
            if "doc-contents" in classes:
                self.own.setdefault(self._last, "")
        if "doc-class-bases" in classes:
            self._bases += 1

    def handle_endtag(self, tag):
        if tag == "div" and self._divs:
            self._divs.pop()
        elif tag == "p" and self._bases:
            self._bases -= 1
        elif tag.startswith("h") and self._in_heading:
            self._in_heading = None

    def handle_data(self, data):
        if self._in_heading:
            self.heading[self._in_heading] += data
            return
        owner = next((d for d in reversed(self._divs) if d is not None), None)
        if owner is not None and not self._bases:
            self.own[owner] += data


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` makes it (the docs extra; CI requires it)."""
    missing = [m for m in ("mkdocs", "material", "mkdocstrings_handlers.python")
               if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing and os.environ.get("FUSEDMLP_REQUIRE_DOCS") != "1":
        pytest.skip(f"the site needs {', '.join(missing)}: pip install '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-4000:]}"
    return out


def _api_page(site) -> _DocObjects:
    parser = _DocObjects()
    parser.feed((site / "api" / "index.html").read_text())
    return parser


def test_api_page_has_unique_ids(site):
    ids = _api_page(site).ids
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert not dup, f"docs/api.md renders these ids more than once: {dup}"


def test_api_page_documents_every_member(site):
    page = _api_page(site)
    assert len(page.own) >= 20, f"only {len(page.own)} documented objects: {sorted(page.own)}"
    empty = sorted(name for name, text in page.own.items() if not text.strip())
    assert not empty, f"API members rendered without a word of documentation: {empty}"


def test_api_page_shows_constructor_signatures(site):
    import inspect

    import fusedmlp_xpu as fm

    page = _api_page(site)
    for cls in (fm.FusedMLP, fm.GatedMLP):
        heading = page.heading.get(f"fusedmlp_xpu.{cls.__name__}", "")
        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        lacking = [p for p in params if p not in heading]
        assert not lacking, f"{cls.__name__}'s rendered signature lacks {lacking}: {heading!r}"


def test_performance_tables_fit_the_column():
    """docs/performance.md's tables: at most 5 columns (wider ones ran off the page's
    column) and no header twice in one table (which eager? which compile?)."""
    text = open(os.path.join(DOCS, "performance.md")).read()
    headers = [ln for i, ln in enumerate(text.splitlines()[:-1])
               if ln.startswith("|") and re.match(r"^\|\s*-+", text.splitlines()[i + 1])]
    assert headers, "no table found"
    for ln in headers:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        assert len(cells) <= 5, f"{len(cells)} columns: {ln}"
        assert len(set(cells)) == len(cells), f"a header repeats: {ln}"
