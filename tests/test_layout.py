"""The layout's rules, read from the source: one import name (kvtrace), imports run one way (the
CLI -> kvtrace.pipelines -> kvtrace.transforms), no module reaches, through any chain of imports,
back to itself, and Beam is imported only by the modules that build or run pipelines."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Folder of the checkout -> its import name and its layer (lower layers never import higher ones).
FOLDERS = {
    "transforms": ("kvtrace.transforms", 0),
    "pipelines": ("kvtrace.pipelines", 1),
    "kvtrace": ("kvtrace", 2),
}


def layer(module: str) -> int:
    return next(
        level for name, level in FOLDERS.values() if module == name or module.startswith(name + ".")
    )


# transforms/ in the order data flows; the shared floor first (storage, errors, batching, pure
# combiners, sorted runs, dead letters, the Beam steps every stage uses, the collector's setting)
STAGES = (
    "storage",
    "errors",
    "trace_format",
    "batching",
    "combiners",
    "sorted_runs",
    "dead_letters",
    "steps",
    "garbage",
    "read",
    "encode",
    "ids",
    "write",
    "stats",
    "cache",
    "synth",
    "replay",
)


# Beam drivers: they build, run or serve pipelines. Every other module is pure of Beam, so that
# the local engine and the CLI's checks never import it.
BEAM_DRIVERS = re.compile(
    r"kvtrace\.pipelines\.(\w+_beam|anonymize_streaming|stream_drain|worker_pool|runner)|"
    r"kvtrace\.transforms(\.\w+)?\.steps"
)
# What a pure module may import of Beam, inside the function that needs it and only then:
# Beam's filesystems for remote paths (gs://, s3://), its secret reader for --salt-secret, and
# its options parser for Beam flags the user gave.
BEAM_SERVICES = {
    "apache_beam.io.filesystems",
    "apache_beam.io.filesystem",
    "apache_beam.transforms.util",
    "apache_beam.options.pipeline_options",
}


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once for all the rules (each walks the whole source)."""
    return ast.parse(path.read_text())


@functools.cache
def modules() -> dict[str, Path]:
    found = {}
    for folder, (name, _) in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join((name,) + (parts[:-1] if parts[-1] == "__init__" else parts))] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """Our modules a module imports, at its top or inside its functions."""
    names = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name in known}


@functools.cache
def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def test_imports_run_one_way():
    against = sorted(
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if layer(target) > layer(module)
    )
    assert not against


def test_stages_import_only_earlier_stages():
    def stage(module: str) -> int | None:
        parts = module.split(".")
        return (
            STAGES.index(parts[2])
            if parts[:2] == ["kvtrace", "transforms"] and len(parts) > 2
            else None
        )

    against = sorted(
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if stage(module) is not None and stage(target) is not None and stage(target) > stage(module)
    )
    assert not against


def test_no_import_circles():
    edges, circles = graph(), []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    # a package's __init__ importing its own submodule is no circle: that is how packages load
    circles = [
        c
        for c in circles
        if not all(
            p.startswith(c.split(" -> ")[0] + ".") or p == c.split(" -> ")[0]
            for p in c.split(" -> ")
        )
        or c.startswith("kvtrace -> ")
    ]
    assert not circles


# An import of ours by a bare folder name, in code or in code a test runs from a string.
BARE_IMPORT = re.compile(r"(?:(?<![\w.])|(?<=\\n))(?:from|import) (?:transforms|pipelines)\.[a-z_]")


def test_one_import_name():
    """Every module of the project and its tests imports ours as kvtrace.*, also in code run
    from a string: a checkout's root on sys.path would let `transforms.x` import as a second
    copy of the same module (its exceptions then escape the other copy's except clauses)."""
    checked = [
        *modules().values(),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
        *(ROOT / "deploy").rglob("*.py"),
    ]
    against = [
        f"{path.relative_to(ROOT)}: {match.group()}"
        for path in checked
        if path != Path(__file__)  # its own examples below
        for match in BARE_IMPORT.finditer(path.read_text())
    ]
    assert not against


def test_the_import_name_rule_sees_code_in_strings():
    assert BARE_IMPORT.search('code = "import os\\nfrom transforms.errors import Rejected"')
    assert BARE_IMPORT.search("import pipelines.export")
    assert not BARE_IMPORT.search("from kvtrace.transforms.errors import Rejected")
    assert not BARE_IMPORT.search("names from transforms/trace_format.py")


def beam_imports(path: Path) -> tuple[set[str], set[str]]:
    """The Beam modules, and Beam drivers of ours, a module imports at its top level, and
    inside its functions."""
    tree = parsed(path)
    top_level = {id(node) for node in tree.body}
    found: tuple[set[str], set[str]] = (set(), set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
            ours = names
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = {node.module}
            ours = names | {f"{node.module}.{alias.name}" for alias in node.names}
        else:
            continue
        beam = {n for n in names if n == "apache_beam" or n.startswith("apache_beam.")}
        beam |= {n for n in ours if BEAM_DRIVERS.fullmatch(n)}
        found[0 if id(node) in top_level else 1].update(beam)
    return found


def test_only_beam_drivers_import_beam():
    """Beam is imported by Beam drivers only (pipelines/*_beam.py, the stream, the runner and
    SDK worker pool, transforms' steps.py); elsewhere only BEAM_SERVICES, lazily, and a driver
    inside the function that runs it (the CLI's)."""
    against = []
    for module, path in sorted(modules().items()):
        if BEAM_DRIVERS.fullmatch(module):
            continue
        top_level, inside = beam_imports(path)
        against += [f"{module} imports {name} at its top" for name in sorted(top_level)]
        against += [
            f"{module} imports {name}"
            for name in sorted(inside - BEAM_SERVICES)
            if not BEAM_DRIVERS.fullmatch(name)
        ]
    assert not against


def test_the_beam_rule_sees_imports_at_the_top_and_inside_functions(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text(
        "import apache_beam as beam\nfrom kvtrace.pipelines.anonymize_beam import build\n"
        "\ndef f():\n    from apache_beam.io.filesystems import FileSystems\n"
        "    from apache_beam import Map\n"
    )
    top_level, inside = beam_imports(module)
    assert top_level == {"apache_beam", "kvtrace.pipelines.anonymize_beam"}
    assert inside == {"apache_beam.io.filesystems", "apache_beam"}
    assert BEAM_DRIVERS.fullmatch("kvtrace.pipelines.anonymize_beam")
    assert BEAM_DRIVERS.fullmatch("kvtrace.transforms.ids.steps")
    assert not BEAM_DRIVERS.fullmatch("kvtrace.pipelines.anonymize_night")
    assert not BEAM_DRIVERS.fullmatch("kvtrace.pipelines.anonymize_local")


# Whole CLI runs live with the end-to-end tests (tests/e2e/); a stage's folder holds its pure
# functions' and its steps' tests, tests/pipelines/ the engines' (driving pipeline functions).
UNIT_FOLDERS = ("transforms", "pipelines")


def cli_runners(helpers: Path) -> set[str]:
    """The names a test module may import from helpers.py that run the CLI: the helpers calling
    kvtrace.cli (its main, or `-m kvtrace.cli` in a child), directly or through another helper."""
    tree = ast.parse(helpers.read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    calls = {
        name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        for name, node in functions.items()
    }
    runners = {name for name, node in functions.items() if runs_the_cli(node, {"main"})}
    while grown := {name for name in functions if calls[name] & runners} - runners:
        runners |= grown
    return runners


def runs_the_cli(tree: ast.AST, cli_names: set[str]) -> bool:
    """Whether code imports kvtrace.cli, names a name bound to it, or starts it in a child."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "kvtrace.cli" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "kvtrace.cli":
            return True
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "kvtrace.cli" in node.value
        ):
            return True
        if isinstance(node, ast.Name) and node.id in cli_names:
            return True
    return False


def test_unit_test_folders_run_no_cli():
    """A test under tests/transforms/ or tests/pipelines/ tests a stage or an engine through its
    own functions: one that imports kvtrace.cli, or a helper that runs it, is a whole run and
    belongs in tests/e2e/ (where the fast set's cost and the slow marks are judged as such)."""
    runners = cli_runners(ROOT / "tests" / "helpers.py")
    against = []
    for folder in UNIT_FOLDERS:
        for path in sorted((ROOT / "tests" / folder).rglob("test_*.py")):
            tree = parsed(path)
            imported = {
                alias.asname or alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "helpers"
                for alias in node.names
                if alias.name in runners
            }
            if runs_the_cli(tree, imported):
                against.append(str(path.relative_to(ROOT)))
    assert not against


def test_the_cli_rule_sees_the_cli_however_it_is_run(tmp_path):
    probes = {
        "from kvtrace.cli import main": True,
        "import kvtrace.cli": True,
        "def f():\n    from kvtrace.cli import main": True,
        "subprocess.run(['python', '-m', 'kvtrace.cli', 'audit'])": True,
        "from kvtrace.transforms.stats.audit import audit": False,
    }
    for source, runs in probes.items():
        assert runs_the_cli(ast.parse(source), set()) is runs, source
    assert runs_the_cli(ast.parse("anonymize(t, [], out)"), {"anonymize"})
    assert {
        "anonymize",
        "anonymize_night",
        "running_stream",
        "run_stream_until_accounted",
        "check_stream_against_batch",
    } <= cli_runners(ROOT / "tests" / "helpers.py")
    assert "write_jsonl" not in cli_runners(ROOT / "tests" / "helpers.py")


def test_test_modules_import_no_beam_at_their_top():
    """Collecting the tests loads no Beam: a test module's top level imports neither Beam nor a
    Beam driver of ours (inside a test it may). Every xdist worker collects every module, and a
    worker that loaded Beam's gRPC cannot fork its in-process runs' encode workers."""
    against = [
        f"{path.relative_to(ROOT)} imports {name} at its top"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for name in sorted(beam_imports(path)[0])
    ]
    assert not against


def test_test_modules_have_names_of_their_own():
    """Test folders are not packages, so pytest imports each module by its file name: two of
    one name collide ("import file mismatch") whenever one worker collects both."""
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
