"""The package's layout stays as DESIGN.md draws it: no import circle anywhere in
fusedmlp_xpu (imports inside functions count: a lazy import is still an arrow), and no
.py file over MAX_LINES lines. CPU only, no imports of the package: its files are read
with ast."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fusedmlp_xpu"
MAX_LINES = 700


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _base(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The module a relative import of ``level`` dots (plus ``name``) refers to."""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def _imports(module: str, path: Path, known: dict) -> set[str]:
    """The package modules that ``module`` imports, at its top or inside functions, by
    import statements or importlib.import_module with a literal name."""
    is_package = path.name == "__init__.py"
    found = set()

    def add(target: str, names=()):
        subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
        found.update(subs)
        if len(subs) < len(names) or not names:
            if target in known:
                found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    found.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            target = (_base(module, is_package, node.level, node.module) if node.level
                      else node.module or "")
            add(target, [a.name for a in node.names])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            name = node.args[0].value
            if name.startswith("."):
                level = len(name) - len(name.lstrip("."))
                name = _base(module, is_package, level, name.lstrip(".") or None)
            add(name)
    found.discard(module)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    known = _modules()
    graph = {m: _imports(m, p, known) for m, p in known.items()}
    assert sum(len(v) for v in graph.values()) > 50, "the import graph came out empty"
    cycles = _cycles(graph)
    detail = [" <-> ".join(c) + ": " + "; ".join(
        f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in cycles]
    assert not cycles, "import circles in the package (move the shared piece down a " \
        "floor):\n" + "\n".join(detail)


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_file_over_max_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them into named modules): {long}"


#: the floors above the backends: a backend or kernel module importing one of these (or the
#: package's face, fusedmlp_xpu itself) is an arrow pointing up
ABOVE_BACKENDS = {"fusedmlp_xpu", "fusedmlp_xpu.module", "fusedmlp_xpu.gated",
                  "fusedmlp_xpu.op", "fusedmlp_xpu.convert", "fusedmlp_xpu.tcnn",
                  "fusedmlp_xpu.dispatch", "fusedmlp_xpu.cli", "fusedmlp_xpu.bench"}


def _above_backends(module: str) -> bool:
    """A floor above the backends: one of ABOVE_BACKENDS, or any of the measuring tools
    (the fusedmlp_xpu.bench subpackage)."""
    return module in ABOVE_BACKENDS or module.startswith("fusedmlp_xpu.bench.")


def test_backends_import_nothing_above_them():
    """Data flows module -> op -> dispatch -> backend -> kernel: no backend or kernel file
    imports a module, an op, the dispatcher or the package face."""
    known = _modules()
    up = {m: sorted(filter(_above_backends, _imports(m, p, known))) for m, p in known.items()
          if m.startswith("fusedmlp_xpu.backends")}
    up = {m: u for m, u in up.items() if u}
    assert not up, f"backends importing floors above them: {up}"
