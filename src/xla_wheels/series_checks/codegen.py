"""torch_xla's generated code (``XLANativeFunctions.h``, ``LazyIr.h``, ...) for series-compile.

torch_xla's Bazel build makes these with its own ``codegen/lazy_tensor_generator.py`` and
the torchgen of the torch it builds against (the ``gen_lazy_tensor`` genrule of
``torch_xla/csrc/BUILD``), then fixes their includes with ``codegen/fix_includes.sh``. Here
the same two scripts of the tree run with the torch wheel's torchgen (its packaged ATen
yaml and templates) in a runfiles-like directory laid out as the generator expects. The
output is cached per machine by content: the generator's inputs (the tree's ``codegen/``,
``aten_xla_type.cpp``, whose kernels it reads) and the header set's identity.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from xla_host import log, runner
from xla_host.waitlock import make_once
from xla_wheels.series_checks.xla_headers import SUBDIR, Headers

GENERATOR = "codegen/lazy_tensor_generator.py"
FIX_INCLUDES = "codegen/fix_includes.sh"
SOURCE_YAML = "codegen/xla_native_functions.yaml"
#: What the generator reads of the tree besides codegen/ (the kernels it has).
IMPL = "torch_xla/csrc/aten_xla_type.cpp"
OUTPUT_SUBDIR = "torch_xla/csrc"
SHAPE_INFERENCE = "torch/csrc/lazy/core/shape_inference.h"
TIMEOUT_S = 900.0
MARKER = ".complete.json"


def codegen_inputs(tree: Path) -> list[Path]:
    return [*sorted(p for p in (tree / "codegen").rglob("*") if p.is_file()), tree / IMPL]


def generate_code(tree: Path, headers: Headers, cache_dir: Path) -> Path | None:
    """A directory holding ``torch_xla/csrc/<generated files>`` for ``tree``; None when
    the tree has no generator (not a pytorch/xla tree)."""
    if not (tree / GENERATOR).is_file() or not (tree / IMPL).is_file():
        return None
    digest = hashlib.sha256(headers.identity.encode())
    for path in codegen_inputs(tree):
        digest.update(f"\0{path.relative_to(tree)}\0".encode() + path.read_bytes())
    name = f"codegen-{digest.hexdigest()[:16]}"

    def make(staging: Path) -> dict[str, object]:
        runfiles = staging / "runfiles"
        aten = runfiles / "torch" / "aten" / "src"
        aten.mkdir(parents=True)
        (aten / "ATen").symlink_to(headers.torchgen / "torchgen" / "packaged" / "ATen")
        (runfiles / "torch" / "torchgen").symlink_to(headers.torchgen / "torchgen")
        shape = runfiles / "torch" / SHAPE_INFERENCE
        shape.parent.mkdir(parents=True)
        shape.symlink_to(headers.root / "torch" / SHAPE_INFERENCE)
        (runfiles / "__main__").symlink_to(tree.resolve())
        output = staging / OUTPUT_SUBDIR
        output.mkdir(parents=True)
        log.info(f"generating torch_xla's {OUTPUT_SUBDIR} code with torchgen ({name})")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        runner.run(
            [sys.executable, GENERATOR, str(runfiles), SOURCE_YAML, str(output)],
            cwd=tree, base_env=env, echo="none", timeout=TIMEOUT_S,
            fix="the tree's codegen does not run with torch 2.9.0's torchgen: see its output",
        )  # fmt: skip
        generated = sorted(str(p) for p in output.iterdir())
        runner.run(["bash", FIX_INCLUDES, *generated], cwd=tree, base_env=env, echo="none",
                   timeout=TIMEOUT_S)  # fmt: skip
        # Absolute paths into the runfiles become what the include path finds.
        prefix = f"{runfiles}/torch/"
        for path in output.iterdir():
            text = path.read_text(encoding="utf-8")
            path.write_text(text.replace(prefix, ""), encoding="utf-8")
        _remove_tree(runfiles)
        return {"files": sorted(p.name for p in output.iterdir())}

    return make_once(cache_dir / SUBDIR / name, make, marker=MARKER, doing=f"making {name}")


def _remove_tree(path: Path) -> None:
    """Remove the runfiles directory: its links point into the tree, gone after the run."""
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_symlink() or child.is_file():
            child.unlink()
        else:
            child.rmdir()
    path.rmdir()
