"""Series 0003 names the OpenXLA revision in torch_xla's cache key.

torch_xla's setup.py writes the revisions the key hashes into ``version.cpp``; the patched
one adds ``OPENXLA_GITREV``, from ``TORCH_XLA_OPENXLA_REVISION`` (which the pipeline sets,
since it builds OpenXLA through ``--override_repository``) or else WORKSPACE's pin. The two
functions are taken out of the patched setup.py as they are (setup.py as a whole runs a
build when imported), run, and their ``version.cpp`` is compiled and run with g++.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

WORKSPACE_PIN = "9a9aa0e11e4fcda8d6a9c3267dca6776ddbdb0ca"


def _setup_functions(tree: Path, *names: str) -> dict[str, Callable[..., Any]]:
    module = ast.parse((tree / "setup.py").read_text(encoding="utf-8"))
    found = [
        node for node in module.body if isinstance(node, ast.FunctionDef) and node.name in names
    ]
    assert sorted(node.name for node in found) == sorted(names), "setup.py lacks a function"
    namespace: dict[str, Any] = {"os": os, "re": re}
    exec(compile(ast.Module(body=list(found), type_ignores=[]), "setup.py", "exec"), namespace)
    return {name: namespace[name] for name in names}


@pytest.mark.real_source
def test_version_cpp_carries_the_openxla_revision(
    patched_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = shutil.which("g++")
    assert compiler is not None, "g++ is required (Debian: apt-get install g++)"
    functions = _setup_functions(patched_tree, "get_openxla_git_sha", "create_version_files")
    base = tmp_path / "xla"
    (base / "torch_xla" / "csrc").mkdir(parents=True)
    shutil.copy(patched_tree / "WORKSPACE", base / "WORKSPACE")
    shutil.copy(patched_tree / "torch_xla" / "csrc" / "version.h", base / "torch_xla/csrc")

    monkeypatch.delenv("TORCH_XLA_OPENXLA_REVISION", raising=False)
    assert functions["get_openxla_git_sha"](str(base)) == WORKSPACE_PIN
    revision = f"{'a' * 40}+series.0123456789abcdef"
    monkeypatch.setenv("TORCH_XLA_OPENXLA_REVISION", revision)
    assert functions["get_openxla_git_sha"](str(base)) == revision

    functions["create_version_files"](str(base), "2.9.0", "x" * 40, "t" * 40, revision)
    assert f"__openxla_gitrev__ = '{revision}'" in (base / "torch_xla/version.py").read_text()
    main = tmp_path / "main.cpp"
    main.write_text(
        '#include <iostream>\n#include "torch_xla/csrc/version.h"\n'
        "int main() { std::cout << torch_xla::OPENXLA_GITREV; }\n"
    )
    binary = tmp_path / "revision"
    subprocess.run(
        [compiler, "-std=c++17", f"-I{base}", str(main), str(base / "torch_xla/csrc/version.cpp"),
         "-o", str(binary)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    printed = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    assert printed == revision
