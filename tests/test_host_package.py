"""The host package (``host/``, the ``xla-wheels-host`` wheel) needs the standard library
alone, as its ``pyproject.toml`` says: a training host's torch environment must gain no
package that could change what the gate judges.

- ``host/pyproject.toml`` declares no dependency;
- every import at a module's top level names the standard library or ``xla_host``
  itself; inside a function, also the stack the gate judges (torch, torch_xla, numpy:
  the children run in the interpreter under test, which has them) and ``packaging`` where
  it is optional (``wheel_filename`` uses it when installed); never the builder side;
- every module imports with nothing but ``host/src`` on the path, site-packages off.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.gitrepos import REPO_ROOT

HOST = REPO_ROOT / "host"
PACKAGE = HOST / "src" / "xla_host"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: What any module may import: the standard library and the package itself.
ANYWHERE = frozenset(sys.stdlib_module_names) | {"xla_host", "__future__"}
#: Imported only where they are used, inside a function, never by the module's import:
#: the gate's children run in the interpreter under test, which has the stack it judges,
#: and ``wheel_filename`` checks names with ``packaging`` when it is installed; ``gcs``
#: imports Google's client library (``google.*``) only when a gs:// address is used.
IN_FUNCTIONS = frozenset({"torch", "torch_xla", "numpy", "packaging", "google"})


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []  # a relative import is the package's own


def foreign_imports(source: str) -> list[str]:
    """The names ``source`` imports beyond what the host package may (see the module
    docstring): at the top level of the module, or inside a function."""
    tree = ast.parse(source)
    in_functions = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for inner in ast.walk(node)
    }
    found: list[str] = []
    for node in ast.walk(tree):
        allowed = ANYWHERE | IN_FUNCTIONS if id(node) in in_functions else ANYWHERE
        found += [name for name in _imported(node) if name.split(".")[0] not in allowed]
    return found


def test_the_host_wheel_declares_no_dependency() -> None:
    project = tomllib.loads((HOST / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == []
    assert "optional-dependencies" not in project


def test_every_host_module_imports_only_the_standard_library_and_itself() -> None:
    modules = _modules()
    assert len(modules) > 10  # the package, not an empty glob
    foreign = {
        str(path.relative_to(HOST)): names
        for path in modules
        if (names := foreign_imports(path.read_text()))
    }
    assert foreign == {}


def test_the_scan_sees_an_import_inside_a_function() -> None:
    # What the scan is for: a third-party or builder import, wherever it hides.
    hidden = "def f():\n    import tomli_w\n    from xla_wheels import cli\n    import torch\n"
    assert foreign_imports(hidden) == ["tomli_w", "xla_wheels"]
    # The judged stack inside a function only: at a module's top level it is foreign.
    assert foreign_imports("import json\nimport torch\n") == ["torch"]


def test_every_host_module_imports_from_host_src_alone() -> None:
    # -S: no site-packages (nothing the venv installed); -I: no PYTHONPATH nor user site.
    # The path is host/src and nothing of this checkout's builder side.
    names = [_module_name(path) for path in _modules() if path.name != "__main__.py"]
    program = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(HOST / 'src')!r})\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "assert 'xla_wheels' not in sys.modules\n"
    )
    imported = subprocess.run(
        [sys.executable, "-I", "-S", "-c", program, *names],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
