"""The docs site's pages: every ```python block runs as written, in page order, one
namespace per page; links and pictures point at files that exist. `mkdocs build --strict`
(in .ci/run) checks the nav and the links between pages; this file checks what it cannot."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

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
    run = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"mkdocs build --strict", run), ".ci/run does not build the docs"


def test_every_page_is_in_the_nav():
    nav = open(os.path.join(ROOT, "mkdocs.yml")).read()
    missing = [p for p in PAGES if p.replace(os.sep, "/") not in nav]
    assert not missing, f"mkdocs.yml's nav lacks {missing}"
