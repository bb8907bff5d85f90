"""The layout's rules, read from the source: imports run one way (kvtrace -> pipelines ->
transforms) and no module reaches, through any chain of imports, back to itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"transforms": 0, "pipelines": 1, "kvtrace": 2}
# transforms/ in the order data flows; the shared floor first (storage, errors, batching, pure
# combiners, dead letters, the Beam steps every stage uses, the collector's setting)
STAGES = ("storage", "errors", "trace_format", "batching", "combiners", "dead_letters", "steps", "garbage", "read",
          "encode", "ids", "write", "stats", "cache", "synth", "replay")


def modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """Our modules a module imports, at its top or inside its functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name in known}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def test_imports_run_one_way():
    against = sorted(f"{module} imports {target}" for module, targets in graph().items()
                     for target in targets
                     if LAYERS[target.split(".")[0]] > LAYERS[module.split(".")[0]])
    assert not against


def test_stages_import_only_earlier_stages():
    def stage(module: str) -> int | None:
        parts = module.split(".")
        return STAGES.index(parts[1]) if parts[0] == "transforms" and len(parts) > 1 else None

    against = sorted(f"{module} imports {target}" for module, targets in graph().items()
                     for target in targets
                     if stage(module) is not None and stage(target) is not None
                     and stage(target) > stage(module))
    assert not against


def test_no_import_circles():
    edges, circles = graph(), []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    # a package's __init__ importing its own submodule is no circle: that is how packages load
    circles = [c for c in circles if not all(p.startswith(c.split(" -> ")[0]) for p in
                                               c.split(" -> "))]
    assert not circles
