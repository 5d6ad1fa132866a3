"""The package's layers point one way, and each subcommand loads only what it needs.

- The layers contract in pyproject.toml (import-linter) is kept: imports only go down,
  from the CLI to the leaf modules, and no import cycle anywhere in ``src/xla_wheels``
  (imports inside functions included: a cycle hidden in a function body is still a cycle
  between the modules). The contract breaks when an import runs against it.
- ``gate --help`` loads the gate and nothing of the build, publish or lock modules.
- The gate is standard library only: it runs (as the builder image's ship check does)
  with nothing but the package source on ``sys.path``, where ``tomli_w`` cannot be found.
- Only the options reader (``cli/settings.py``, and ``options.machine_cache``) reads
  settings from the environment.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gitrepos import REPO_ROOT, SOURCE_PATH

SRC = REPO_ROOT / "src"
HOST_SRC = REPO_ROOT / "host" / "src"
PACKAGE = "xla_wheels"

#: The contracts in pyproject.toml ([tool.importlinter]) that ``lint-imports`` checks.
LAYERS = "imports only go down, from the CLI to the leaf modules"
HOST_LAYERS = "the host side's imports only go down too"
HOST_ALONE = "the host side never imports the builder side (it is installed on hosts without it)"
NO_CYCLES = "no import cycle between the modules of any package"
CONTRACTS = (LAYERS, HOST_LAYERS, HOST_ALONE, NO_CYCLES)


def lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` (import-linter) on ``project``'s package with its pyproject.toml."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=project,
        # The packages under ``project`` first, ahead of the checkout's editable installs.
        env={
            "PYTHONPATH": f"{project / 'src'}:{project / 'host' / 'src'}",
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_layers_contract_is_kept() -> None:
    result = lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    # lint-imports folds a long contract name over lines: compare the words.
    words = " ".join(result.stdout.split())
    for contract in CONTRACTS:
        assert f"{contract} KEPT" in words
    assert "4 kept, 0 broken" in words


@pytest.mark.parametrize(
    ("module", "added", "broken"),
    [
        # A leaf module importing the build stage: an import running back up (which also
        # closes a cycle, since the builder imports the leaf).
        ("xla_wheels/options.py", "from xla_wheels.builder import config\n", (LAYERS, NO_CYCLES)),
        # Two modules side by side importing each other, one inside a function body: a
        # cycle hidden where the first import of the module does not run it. Only the
        # cycle contract sees it: the two stand on one layer.
        (
            "xla_host/redact.py",
            "def _later() -> None:\n    import xla_host.filemode\n",
            (NO_CYCLES,),
        ),
        # The host side reaching into the builder side, even lazily: a host installed from
        # a lane has no xla_wheels.
        (
            "xla_host/gate/report.py",
            "def _later() -> None:\n    import xla_wheels.bundle\n",
            (HOST_ALONE,),
        ),
    ],
)
def test_the_contract_breaks_when_an_import_runs_against_it(
    tmp_path: Path, module: str, added: str, broken: tuple[str, ...]
) -> None:
    packages = {"xla_wheels": tmp_path / "src", "xla_host": tmp_path / "host" / "src"}
    for package, into in packages.items():
        source = (SRC if package == "xla_wheels" else HOST_SRC) / package
        shutil.copytree(source, into / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if module == "xla_host/redact.py":  # the other half of the cycle
        with (packages["xla_host"] / "xla_host" / "filemode.py").open("a") as handle:
            handle.write("\nfrom xla_host import redact  # noqa\n")
    package = module.split("/")[0]
    with (packages[package] / module).open("a") as handle:
        handle.write("\n" + added)
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    words = " ".join(result.stdout.split())
    for contract in CONTRACTS:
        verdict = "BROKEN" if contract in broken else "KEPT"
        assert f"{contract} {verdict}" in words


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
        env={"PYTHONPATH": SOURCE_PATH, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(process.stderr.strip().splitlines()[-1]))


def test_gate_help_loads_the_gate_and_nothing_of_the_other_stages() -> None:
    loaded = _loaded_modules("gate", "--help")
    # The gate is a host command (xla_host.host_commands) over the checkout.
    assert "xla_wheels.cli.checkout_source" in loaded and "xla_host.gate.restart" in loaded
    assert "xla_host.host_commands" in loaded
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
    env = {"PYTHONPATH": SOURCE_PATH, "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
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
        *sorted(f"xla_host.gate.{p.stem}" for p in (HOST_SRC / "xla_host" / "gate").glob("*.py")),
        f"{PACKAGE}.release.gate_receipt",
        f"{PACKAGE}.wheels_lock",
    ]
    imports = subprocess.run(
        [*bare, "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)",
         *gate_modules],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert imports.returncode == 0, imports.stderr
    # The ship check runs the host's gate from the host sources alone (no xla_wheels).
    ship_check = subprocess.run(
        [*bare, "-m", "xla_host", "gate", "--python", "/nonexistent/python", "--device", "CPU",
         "--checks", "restart", "--out", "/nonexistent-out/gate"],
        env={**env, "PYTHONPATH": str(HOST_SRC)}, capture_output=True, text=True, timeout=120,
        check=False,
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
    # Passed on to the demo's children so they import this checkout's package.
    "PYTHONPATH",
    "TWINE_USERNAME",
    "TWINE_PASSWORD",
    "PJRT_DEVICE",
    "TPU_WORKER_ID",
    # The TPU environment's facts about its slice (as torch_xla reads them without the
    # metadata server), read by xla_host.gate.slice.
    "TPU_WORKER_HOSTNAMES",
    "TPU_ACCELERATOR_TYPE",
    # torch_xla's number of CPU devices: a CPU host's topology for `cache fetch`.
    "CPU_NUM_DEVICES",
    "XLA_FLAGS",
    # libtpu's own flags: the key probe's child reads them as XLA parses them.
    "LIBTPU_INIT_ARGS",
    "XLA_NO_SPECIAL_SCALARS",
    "XLA_PERSISTENT_CACHE_PATH",
    "XLA_PERSISTENT_CACHE_READ_ONLY",
    # The reproducible-builds standard variable, read where the wheel is packed (in the
    # builder) from the environment the recipe was given.
    "SOURCE_DATE_EPOCH",
    # ccache's own off switch, honoured where the compiled checks choose their compiler.
    "CCACHE_DISABLE",
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


#: The options reader at the CLI edge, and the options' own module and the host's arguments
#: (the per-machine cache).
READERS = {"cli/settings.py", "options.py", "arguments.py"}


def test_settings_are_read_from_the_environment_only_by_the_options_reader() -> None:
    offenders = {}
    for root in (SRC / PACKAGE, HOST_SRC / "xla_host"):
        for path in root.rglob("*.py"):
            if path.relative_to(root).as_posix() in READERS:
                continue
            read = _environment_reads(ast.parse(path.read_text())) - NOT_SETTINGS
            if read:
                offenders[str(path.relative_to(root.parent))] = sorted(read)
    assert offenders == {}
