"""The README's two commands on a fresh machine: a new venv, the README's CPU install
lines and its Tests block run as written (from a copy of this checkout), then its test
command over the quick subset marked ``readme``. Either breaking fails the test.

Minutes of installs: it runs where FUSEDMLP_REQUIRE_README_INSTALL=1 (CI sets it) and
skips elsewhere, saying so."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = "FUSEDMLP_REQUIRE_README_INSTALL"


def _bash_block(section: str) -> list[str]:
    text = open(os.path.join(ROOT, "README.md")).read()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```bash\n(.*?)\n```", body, re.S).group(1).splitlines()


def cpu_install_lines() -> list[str]:
    """The Install block's CPU group: the lines after its ``# CPU`` comment, up to the
    blank line that ends the group (the GPU lines need a GPU build of torch)."""
    lines = _bash_block("Install")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# CPU"))
    group = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        group.append(ln)
    return group


def test_the_install_block_has_a_cpu_group():
    group = cpu_install_lines()
    assert any("torch" in ln for ln in group) and any("-e ." in ln for ln in group), group


def _copy_checkout(dst: str) -> None:
    skip = shutil.ignore_patterns(".git", ".clean", "*.egg-info", "build", "dist",
                                  "__pycache__", ".pytest_cache", "site", "node_modules")
    shutil.copytree(ROOT, dst, ignore=skip)


@pytest.mark.skipif(os.environ.get(ENV) != "1",
                    reason=f"minutes of installs into a fresh venv: {ENV}=1 runs it (CI does)")
def test_readme_install_then_test_command_in_a_fresh_venv(tmp_path):
    checkout, venv = str(tmp_path / "checkout"), str(tmp_path / "venv")
    _copy_checkout(checkout)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith(
               ("FUSEDMLP_REQUIRE", "PYTEST_"))}
    env.update(VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + env["PATH"])
    *installs, command = _bash_block("Tests")
    steps = cpu_install_lines() + [ln for ln in installs if ln.strip()]
    for line in steps:  # as written: `pip` and `python` are the venv's (first on PATH)
        r = subprocess.run(["bash", "-c", "set -e\n" + line], cwd=checkout, env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"README line {line!r} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    command = command.split("#", 1)[0].strip()
    r = subprocess.run(["bash", "-c", f"{command} -m readme -p no:cacheprovider"],
                       cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    tail = (r.stdout[-3000:] + r.stderr[-2000:])
    assert r.returncode == 0, f"README's test command {command!r} failed:\n{tail}"
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed.group(1)) >= 3, f"too few tests ran:\n{tail}"
