"""The house's floors (docs/architecture.md), checked from the source: imports point down only and
no module imports itself back through others. Read with `ast`, so nothing is imported or run."""

from __future__ import annotations

import ast
from pathlib import Path

from tests._repo import REPO

# Floor of each project package or module, by dotted prefix (longest prefix wins).
FLOORS = {
    "src.open_alip": 1,
    "src.recordio": 1,
    "src.caption_record": 1,
    "src.errors": 1,
    "src.fsutil": 1,
    "src.devices": 1,
    "src.jpeg": 1,
    "src.install": 1,
    "src.lock": 1,
    "src.shard_names": 1,
    "src.figures": 1,
    "dataloaders": 2,
    "src.perf": 2,
    "src.convert": 3,
    "src.training": 3,
    "src.evaluation": 3,
    "src.demo": 4,  # runs every stage, as the CLIs do
}
# Floor-1 neighbours that docs/architecture.md allows to use each other.
FLOOR1_ALLOWED = {
    "src.errors",
    "src.fsutil",
    "src.devices",
    "src.recordio",
    "src.open_alip.constants",
    "src.open_alip.hashes",
    "src.jpeg",
    "src.shard_names",
}
PACKAGES = ("src", "dataloaders")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in (REPO / top).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports at any depth of its code (function-level imports count too)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # Imports only a type checker follows (`if TYPE_CHECKING:`) never run, so they make no cycle.
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If)
        and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                mod = ".".join(base[: len(base) - node.level + 1] + ([mod] if mod else []))
            targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _floor(name: str) -> int | None:
    best = max((p for p in FLOORS if name == p or name.startswith(p + ".")), key=len, default=None)
    return FLOORS[best] if best else None


def _package(name: str) -> str:
    best = max((p for p in FLOORS if name == p or name.startswith(p + ".")), key=len, default=name)
    return best


def _graph() -> dict[str, set[str]]:
    mods = _project_modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def test_every_project_module_has_a_floor():
    unplaced = sorted(n for n in _project_modules() if n not in ("src",) and _floor(n) is None)
    assert not unplaced, f"add these to FLOORS and to docs/architecture.md: {unplaced}"


def test_imports_point_down_only():
    wrong = []
    for name, deps in _graph().items():
        here = _floor(name)
        if here is None:
            continue
        for dep in deps:
            there = _floor(dep)
            if there is None or _package(dep) == _package(name):
                continue
            if there > here:
                wrong.append(f"{name} -> {dep} (floor {here} imports floor {there})")
            elif there == here and not (
                here == 1 and any(dep == a or dep.startswith(a + ".") for a in FLOOR1_ALLOWED)
            ):
                wrong.append(f"{name} -> {dep} (a package beside it on floor {here})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_library_imports_only_itself():
    # It is installed alone (pyproject.toml): anything else of the project is missing there.
    outside = sorted(
        f"{name} -> {dep}"
        for name, deps in _graph().items()
        if name.startswith("src.open_alip")
        for dep in deps
        if not dep.startswith("src.open_alip")
    )
    assert not outside, "\n".join(outside)


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    # A package's __init__ re-exporting its modules, which import siblings through the package, is
    # not a cycle of behaviour; only cycles between distinct modules count.
    real = [
        c for c in cycles if not any(a.startswith(b + ".") or b.startswith(a + ".") for a, b in zip(c, c[1:]))
    ]
    assert not real, "\n".join(" -> ".join(c) for c in real)
