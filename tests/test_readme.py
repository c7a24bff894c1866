"""The README's "Use" snippet runs as written, on whatever device this machine has."""
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
