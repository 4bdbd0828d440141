"""vime's import layers, read from the source with ``ast`` (nothing is imported).

Layers, lowest first: ``errors types config net`` → ``models observability buffer envs
sandbox engine trainer`` → ``agents`` → ``rl`` → ``cli``. A package may import its own
layer's neighbours and anything below, never above; ``engine``, ``sandbox`` and ``envs``
never import ``rl`` or ``agents``; the trainer never imports ``envs`` or ``agents``; and no
module-level import circle exists. Lazy imports (inside functions) count too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "vime"
LAYER = {
    "errors": 0,
    "types": 0,
    "config": 0,
    "net": 0,
    "models": 1,
    "observability": 1,
    "buffer": 1,
    "envs": 1,
    "sandbox": 1,
    "engine": 1,
    "trainer": 1,
    "agents": 2,
    "rl": 3,
    "cli": 4,
}
FORBIDDEN = {
    "engine": {"rl", "agents"},
    "sandbox": {"rl", "agents"},
    "envs": {"rl", "agents"},
    "trainer": {"rl", "agents", "envs"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module → the vime modules it imports (module level and lazy)."""

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in modules] or [node.module]
            for target in targets:
                if target.startswith("vime") and (found := resolve(target)) not in ("", name):
                    edges[name].add(found)
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vime"


def test_no_package_imports_upwards_or_across_a_forbidden_line():
    edges = _imports(_modules())
    bad = []
    for src, targets in edges.items():
        a = _package(src)
        for dst in targets:
            b = _package(dst)
            if a in ("vime", "suites") or b in ("vime", "suites") or a == b:
                continue
            if a not in LAYER or b not in LAYER:
                bad.append(f"{src} imports {dst}: give vime.{a} / vime.{b} a layer in LAYER")
            elif LAYER[b] > LAYER[a] or b in FORBIDDEN.get(a, set()):
                bad.append(f"{src} imports {dst}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_no_import_circle_between_modules():
    modules = _modules()
    edges = _imports(modules)
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif not state.get(nxt):
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(modules):
        if not state.get(module):
            visit(module, [module])
    # A package's __init__ re-exporting its own modules is not a circle between modules.
    packages = {m for m, path in modules.items() if path.name == "__init__.py"}
    real = [c for c in circles if not packages & set(c)]
    assert not real, f"import circles: {real}"
