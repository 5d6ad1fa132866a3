"""The package's layers point one way, and each subcommand loads only what it needs.

- No import cycle anywhere in ``src/xla_wheels`` (imports inside functions included: a
  cycle hidden in a function body is still a cycle between the modules).
- ``gate --help`` loads the gate and nothing of the build, publish or lock modules.
- The gate is standard library only: it runs (as the builder image's ship check does)
  with nothing but the package source on ``sys.path``, where ``tomli_w`` cannot be found.
- Only the options reader (``cli/settings.py``, and ``options.machine_cache``) reads
  settings from the environment.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.gitrepos import REPO_ROOT

SRC = REPO_ROOT / "src"
PACKAGE = "xla_wheels"


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the package modules it imports, read with ``ast`` from every file."""
    paths = {_module_name(p, src): p for p in (src / PACKAGE).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = name.split(".") if is_package else name.split(".")[:-1]
                    package = package[: len(package) - node.level + 1]
                    base = ".".join([*package, base] if base else package)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        # ``from pkg import mod`` imports pkg (its __init__) and pkg.mod; names that are
        # not modules (functions, classes) drop out here.
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None. Depth-first, three colours."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "xla_wheels.cli.gate" in graph and graph["xla_wheels.cli"]  # the walk saw it
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_sees_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from xla_wheels import high\n")
    (package / "high.py").write_text("from xla_wheels.low import f\n")
    cycle = find_cycle(import_graph(tmp_path))
    assert cycle is not None and set(cycle) == {"xla_wheels.low", "xla_wheels.high"}


def _loaded_modules(*argv: str, python_flags: tuple[str, ...] = ()) -> set[str]:
    """The package modules (and tomli_w) loaded by running the CLI with ``argv``."""
    probe = (
        "import json, sys\n"
        "from xla_wheels.cli import main\n"
        "try:\n"
        f"    main({list(argv)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    process = subprocess.run(
        [sys.executable, *python_flags, "-c", probe],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(process.stderr.strip().splitlines()[-1]))


def test_gate_help_loads_the_gate_and_nothing_of_the_other_stages() -> None:
    loaded = _loaded_modules("gate", "--help")
    assert "xla_wheels.cli.gate" in loaded and "xla_wheels.gate.restart" in loaded
    foreign = sorted(
        m
        for m in loaded
        if m == "tomli_w"
        or m.startswith(
            (
                "xla_wheels.builder",
                "xla_wheels.publish",
                "xla_wheels.cli.stages",
                "xla_wheels.cli.publish",
            )
        )
        or m in {"xla_wheels.wheels_lock", "xla_wheels.pipeline", "xla_wheels.sources"}
    )
    assert foreign == []


def test_the_gate_runs_with_only_the_standard_library() -> None:
    # -S: no site-packages, so nothing the pipeline's venv installed (tomli_w) is
    # importable: the builder image's interpreter with the source on PYTHONPATH.
    bare = [sys.executable, "-S"]
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    absent = subprocess.run(
        [*bare, "-c", "import tomli_w"], env=env, capture_output=True, text=True, check=False
    )
    assert absent.returncode != 0 and "No module named 'tomli_w'" in absent.stderr

    help_run = subprocess.run(
        [*bare, "-m", PACKAGE, "gate", "--help"], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert help_run.returncode == 0, help_run.stderr
    # Every gate module imports, and the ship check's command line reaches its verdict
    # (exit 2: the interpreter to judge does not exist) without the pipeline's deps.
    # The receipt a gate run leaves (release.gate_receipt, reading wheels.lock) too.
    gate_modules = [
        *sorted(f"{PACKAGE}.gate.{p.stem}" for p in (SRC / PACKAGE / "gate").glob("*.py")),
        f"{PACKAGE}.release.gate_receipt",
        f"{PACKAGE}.wheels_lock",
    ]
    imports = subprocess.run(
        [*bare, "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)",
         *gate_modules],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert imports.returncode == 0, imports.stderr
    ship_check = subprocess.run(
        [*bare, "-m", PACKAGE, "gate", "--python", "/nonexistent/python", "--device", "CPU",
         "--checks", "restart", "--out", "/nonexistent-out/gate"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ship_check.returncode == 2, ship_check.stderr
    assert "ModuleNotFoundError" not in ship_check.stderr


#: Variables read from the environment that are not settings of ours: which CI shows the
#: log, a child's PATH, twine's credentials, and the training host's runtime contract
#: that doctor judges and verify-install's import follows, and XLA's own flags, which the
#: gate's cache-key check varies in a child's environment.
NOT_SETTINGS = {
    "GITHUB_ACTIONS",
    "TF_BUILD",
    "PATH",
    "TWINE_USERNAME",
    "TWINE_PASSWORD",
    "PJRT_DEVICE",
    "TPU_WORKER_ID",
    "XLA_FLAGS",
    "XLA_NO_SPECIAL_SCALARS",
    "XLA_PERSISTENT_CACHE_PATH",
    "XLA_PERSISTENT_CACHE_READ_ONLY",
    # The reproducible-builds standard variable, read where the wheel is packed (in the
    # builder) from the environment the recipe was given.
    "SOURCE_DATE_EPOCH",
}


def _environment_reads(tree: ast.AST) -> set[str]:
    """Names read as ``<...env>.get("X")``, ``<...environ>["X"]`` or ``os.getenv("X")``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            receiver = ast.unparse(node.func.value)
            if (node.func.attr == "get" and receiver.endswith(("env", "environ"))) or (
                ast.unparse(node.func) == "os.getenv"
            ):
                key = node.args[0]
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and ast.unparse(node.value).endswith(("env", "environ"))
        ):
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
        elif (
            key is not None
            and isinstance(node, ast.Call)
            and ast.unparse(node.func) in {"os.environ.get", "os.getenv"}
        ):
            names.add(f"<computed: {ast.unparse(key)}>")  # a helper reading any name
    return names


#: The options reader at the CLI edge, and the options' own module (the per-machine cache).
READERS = {"cli/settings.py", "options.py"}


def test_settings_are_read_from_the_environment_only_by_the_options_reader() -> None:
    offenders = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        if path.relative_to(SRC / PACKAGE).as_posix() in READERS:
            continue
        read = _environment_reads(ast.parse(path.read_text())) - NOT_SETTINGS
        if read:
            offenders[str(path.relative_to(SRC))] = sorted(read)
    assert offenders == {}
