"""The suite's draws (conftest's FUSEDMLP_TEST_SEED): one number gives every test the same
data in any process, order or number of pytest-xdist workers; a new number, new data; a
failure names the number that draws it again."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import SEED_ENV, case_seed

HERE = os.path.dirname(os.path.abspath(__file__))
# conftest as a plugin, and the package from this tree where it is not installed
PATH = os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])

# each test writes what it drew (the default generator: the autouse seeding; a case's
# generator: case_seed) to a file of its own: pytest-xdist's workers print nothing
_DRAWS = '''
import os, pytest, torch
from conftest import case_seed

@pytest.mark.parametrize("i", range(4))
def test_draw(i):
    g = torch.Generator().manual_seed(case_seed("case", i))
    with open(os.path.join(os.environ["DRAWS"], f"{i}.txt"), "w") as f:
        f.write(f"{torch.rand(()).item():.12f} {torch.rand((), generator=g).item():.12f}")

def test_fails():
    assert False
'''


def _draws(tmp_path, seed, *opts):
    f = tmp_path / "test_draws.py"
    f.write_text(_DRAWS)
    out_dir = tmp_path / f"draws-{seed}-{'-'.join(opts)}"
    out_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": PATH, SEED_ENV: str(seed), "DRAWS": str(out_dir)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-rf",
                        "-p", "no:cacheprovider", *opts, str(f)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    return {p.stem: p.read_text() for p in out_dir.iterdir()}, r.stdout + r.stderr


def test_one_seed_one_draw_in_any_process(tmp_path):
    pytest.importorskip("xdist")
    alone, out = _draws(tmp_path, 12345, "-p", "no:xdist")
    # beside the failure: the number and the command that draw it again
    assert f"{SEED_ENV}=12345 python -m pytest 'test_draws.py::test_fails'" in out, out
    spread, out = _draws(tmp_path, 12345, "-n", "2")
    assert f"{SEED_ENV}=12345 python -m pytest" in out, out
    alone2, _ = _draws(tmp_path, 12345, "-p", "no:xdist", "-k", "test_draw and 2")
    other, _ = _draws(tmp_path, 54321, "-p", "no:xdist")
    assert len(alone) == 4 and spread == alone and alone2 == {"2": alone["2"]}
    assert len(set(alone.values())) == 4  # each test its own data
    assert not set(other.values()) & set(alone.values())


def test_case_seed_is_a_function_of_the_run_and_the_case(monkeypatch):
    monkeypatch.setenv(SEED_ENV, "7")
    a = case_seed("relu", True, (3, 16))
    assert a == case_seed("relu", True, (3, 16)) != case_seed("relu", False, (3, 16))
    assert 0 <= a < 2 ** 31
    monkeypatch.setenv(SEED_ENV, "8")
    assert case_seed("relu", True, (3, 16)) != a


@pytest.mark.parametrize("bad", ["x", "-1", str(2 ** 31)])
def test_a_bad_seed_is_a_usage_error(tmp_path, bad):
    f = tmp_path / "test_none.py"
    f.write_text("def test_nothing():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": PATH, SEED_ENV: bad}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-q",
                        "-p", "no:cacheprovider", "-p", "no:xdist", str(f)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 4 and SEED_ENV in r.stderr, r.stdout + r.stderr
