"""vime's import layers, read from the source with ``ast`` (nothing is imported).

Layers, lowest first: the core files (``errors types config net paths gc_freeze
extensions``) → the rooms
that use only them and each other (``models observability buffer envs sandbox engine
trainer``) → ``agents runs`` → ``sync placement`` → ``eval conf`` → ``rl`` (the loop) →
``cli``. A package may import its own layer's neighbours and anything below, never above;
``engine``, ``sandbox`` and ``envs`` never import ``rl`` or ``agents``; the trainer never
imports ``envs`` or ``agents``; observability imports only the core files (everything
traces, so it is the ground floor); and no import circle exists, between modules
(the bundled suites under ``envs/`` included, relative imports too) or between packages.
Lazy imports (inside functions) count too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "vime"
SUITES = REPO / "envs"  # installed as vime.suites
CORE = {"errors", "types", "config", "net", "paths", "gc_freeze", "extensions"}
LAYER = {
    **dict.fromkeys(CORE, 0),
    "models": 1,
    "observability": 1,
    "buffer": 1,
    "store": 1,
    "envs": 1,
    "sandbox": 1,
    "engine": 1,
    "trainer": 1,
    "agents": 2,
    "runs": 2,
    "sync": 3,
    "placement": 3,
    "eval": 4,
    "conf": 4,
    "rl": 5,
    "cli": 6,
}
FORBIDDEN = {
    "engine": {"rl", "agents"},
    "sandbox": {"rl", "agents"},
    "envs": {"rl", "agents"},
    "trainer": {"rl", "agents", "envs"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for top, prefix in ((ROOT, ("vime",)), (SUITES, ("vime", "suites"))):
        for path in top.rglob("*.py"):
            parts = prefix + path.relative_to(top).with_suffix("").parts
            if "tests" in parts:  # a suite's own tests are not part of the package graph
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module → the vime modules it imports (module level and lazy, absolute and relative)."""

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in modules] or [base]
            for target in targets:
                if target.startswith("vime") and (found := resolve(target)) not in ("", name):
                    edges[name].add(found)
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vime"


def _package_edges() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for src, targets in _imports(_modules()).items():
        for dst in targets:
            a, b = _package(src), _package(dst)
            if a != b and "vime" not in (a, b):
                out[a].add(b)
    return out


def _circles(edges: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
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

    for node in sorted(nodes):
        if not state.get(node):
            visit(node, [node])
    return circles


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
    circles = _circles(_imports(modules), list(modules))
    # A package's __init__ re-exporting its own modules is not a circle between modules;
    # one that reaches outside its package (and back) is.
    packages = {m for m, path in modules.items() if path.name == "__init__.py"}

    def re_export(circle: list[str]) -> bool:
        return any(
            all(m == p or m.startswith(p + ".") for m in circle) for p in packages & set(circle)
        )

    real = [c for c in circles if not re_export(c)]
    assert not real, f"import circles: {real}"


def test_no_import_circle_between_packages():
    edges = _package_edges()
    assert not _circles(edges, list(edges)), _circles(edges, list(edges))


def test_observability_imports_only_the_core_files():
    """Everything traces and records, so observability is the ground floor: the run
    viewers that read buffers and models live in vime.runs."""
    above = _package_edges()["observability"] - CORE
    assert not above, f"vime.observability imports {sorted(above)}"
