"""The README: its "Use" snippet runs as written on whatever device this machine has, it
stays short, its test command is CI's, and its headline figures name their runs."""
from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _use_snippet() -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README's Use section has no python code block"
    return blocks[0]


def test_readme_use_snippet_runs(capsys):
    scope: dict = {}
    exec(compile(_use_snippet(), "README.md (Use)", "exec"), scope)
    assert tuple(scope["y"].shape) == (1024, 64)  # the GatedMLP's output, the last y
    assert "chosen:" in capsys.readouterr().out


def test_readme_is_short():
    lines = open(os.path.join(ROOT, "README.md")).read().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the docs site takes the rest"


def test_readme_test_command_is_what_ci_runs():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    cmd = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()
    run = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^python3? " + re.escape(cmd.removeprefix("python ")) + r"\s*$", run, re.M), (
        f"README's test command {cmd!r} is not the one .ci/run runs")


def test_readme_figures_cite_their_runs():
    """Every row of the headline table names the run its numbers come from."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("\n## Headline numbers", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert 6 <= len(rows) <= 8, f"{len(rows)} headline rows; keep 6-8"
    for row in rows:
        assert re.search(r"`run [A-Za-z0-9][A-Za-z0-9._+-]*`", row), f"no `run <id>` in: {row}"
