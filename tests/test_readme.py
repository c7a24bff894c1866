"""The README: its "Use" snippet runs as written on whatever device this machine has, it
stays short, its test command is CI's, and its headline figures name their runs."""
from __future__ import annotations

import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _use_snippet() -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README's Use section has no python code block"
    return blocks[0]


@pytest.mark.readme
def test_readme_use_snippet_runs(capsys):
    scope: dict = {}
    exec(compile(_use_snippet(), "README.md (Use)", "exec"), scope)
    assert tuple(scope["y"].shape) == (1024, 64)  # the GatedMLP's output, the last y
    assert "chosen:" in capsys.readouterr().out


def test_readme_is_short():
    lines = open(os.path.join(ROOT, "README.md")).read().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the docs site takes the rest"


def _tests_block() -> list[str]:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)
    return [ln.split("#", 1)[0].strip() for ln in block.splitlines() if ln.split("#", 1)[0].strip()]


def test_readme_test_command_is_what_ci_runs():
    cmd = _tests_block()[-1]
    run = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^python3? " + re.escape(cmd.removeprefix("python ")) + r"\s*$", run, re.M), (
        f"README's test command {cmd!r} is not the one .ci/run runs")


def _extra(name: str) -> str:
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    found = re.search(rf"^{name} = \[(.*)\]\s*$", text, re.M)
    assert found, f"pyproject.toml has no {name!r} extra"
    return found.group(1)


def test_readme_installs_what_its_test_command_needs():
    """The Tests block installs the `test` extra before the command, and that extra holds
    pytest and, for `-n`, pytest-xdist."""
    *installs, cmd = _tests_block()
    extras = [e for ln in installs if ln.startswith("pip install")
              for group in re.findall(r"\.\[([^\]]+)\]", ln) for e in group.split(",")]
    assert "test" in extras, f"README's Tests block installs no `test` extra: {installs}"
    needs = ["pytest"] + (["pytest-xdist"] if re.search(r"\s-n\s", cmd) else [])
    test_extra = _extra("test")
    for pkg in needs:
        assert f'"{pkg}>' in test_extra or f'"{pkg}"' in test_extra, (
            f"the test extra lacks {pkg}, which {cmd!r} needs")


PAGES = ["README.md"] + sorted(os.path.relpath(os.path.join(d, f), ROOT)
                              for d, _, fs in os.walk(os.path.join(ROOT, "docs"))
                              for f in fs if f.endswith(".md"))


@pytest.mark.parametrize("page", PAGES)
def test_no_install_from_pypi_until_published(page):
    """fusedmlp-xpu is not on PyPI: an install line naming it resolves to nothing."""
    text = open(os.path.join(ROOT, page)).read()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    bad = [ln for ln in blocks.splitlines() if "pip install" in ln.split("#", 1)[0] and any(
        re.fullmatch(r"fusedmlp[-_]xpu(\[.*\])?", tok)
        for tok in shlex.split(ln.split("#", 1)[0]))]  # a `name @ git+URL` is fine
    assert not bad, f"{page}: installs the unpublished name: {bad}"


def test_readme_figures_cite_their_runs():
    """Every row of the headline table names the run its numbers come from."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("\n## Headline numbers", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert 6 <= len(rows) <= 8, f"{len(rows)} headline rows; keep 6-8"
    for row in rows:
        assert re.search(r"`run [A-Za-z0-9][A-Za-z0-9._+-]*`", row), f"no `run <id>` in: {row}"
