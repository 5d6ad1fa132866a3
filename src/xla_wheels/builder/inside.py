"""``python -m xla_wheels.builder.inside --spec FILE --recipe NAME``: run one recipe.

The same entry point runs inside the builder image (ENGINE=docker|podman|buildah) and on
the host (BUILD_MODE=host), so both modes run identical recipes. Each command is printed
before it runs, to stderr and to ``<out>/logs/<recipe>.log``; the command's own output
goes to the log file only (a torch build writes hundreds of MB), and a failure prints the
log's tail. Exit 0 on success, 1 when a step fails, 2 on bad arguments.

Imports only the standard library and this package: the image needs no pipeline
dependencies.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from xla_wheels.builder import recipes, stamp
from xla_wheels.builder.spec import BuildSpec

TAIL_LINES = 40


class StepFailed(Exception):
    pass


def _say(message: str, log_file: TextIO) -> None:
    print(message, file=sys.stderr, flush=True)
    print(message, file=log_file, flush=True)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_step(step: recipes.Step, spec: BuildSpec, log_file: TextIO, log_path: Path) -> None:
    if step.only_if_exists and not Path(step.only_if_exists).exists():
        _say(f"# skip ({step.only_if_exists} does not exist): {step.title}", log_file)
        return
    _say(f"+ {step.render()}", log_file)
    if step.action:
        ACTIONS[step.action](spec, step.args, log_file)
        return
    argv = recipes.expand_argv(step)
    # The recipe step's child environment: the container's or host's plus the step's own.
    env = {**os.environ, **dict(step.env)}
    if step.path_prepend:
        env["PATH"] = os.pathsep.join([*step.path_prepend, env.get("PATH", "")])
    if step.cwd:
        Path(step.cwd).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    process = subprocess.run(
        argv, env=env, cwd=step.cwd, stdout=log_file, stderr=subprocess.STDOUT, check=False
    )
    _say(f"# {step.title}: exit {process.returncode} in {time.monotonic() - start:.1f}s", log_file)
    if process.returncode != 0:
        log_file.flush()
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
        print("\n".join(tail), file=sys.stderr)
        raise StepFailed(f"{step.title} failed (exit {process.returncode}); log: {log_path}")


def _finish_stage(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    tmp, final, package = Path(args[0]), Path(args[1]), args[2]
    wheels = sorted(tmp.glob("*.whl"))
    if len(wheels) != 1 or not wheels[0].name.startswith(f"{package}-"):
        raise StepFailed(
            f"expected exactly one {package}-*.whl in {tmp}, found "
            f"{', '.join(w.name for w in wheels) or 'none'}"
        )
    wheel = wheels[0]
    expected = spec.torch_version if package == "torch" else spec.torch_xla_version
    if wheel.name.split("-")[1] != expected:
        raise StepFailed(f"{wheel.name} does not carry the version {expected}")
    (tmp / "stage.json").write_text(
        json.dumps({"wheel": wheel.name, "sha256": _sha256(wheel)}, indent=2) + "\n",
        encoding="utf-8",
    )
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _say(f"# stage {package}: {final}/{wheel.name}", log_file)


def _apply_openxla_patches(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    tree, openxla = Path(args[0]), Path(args[1])
    applied = []
    for name in recipes.workspace_openxla_patches(tree):
        patch_file = tree / "openxla_patches" / name
        argv = ["patch", "-p1", "-l", "-N", "-i", str(patch_file)]
        _say(f"+ cd {openxla} && {' '.join(argv)}", log_file)
        process = subprocess.run(
            argv, cwd=openxla, stdout=log_file, stderr=subprocess.STDOUT, check=False
        )
        if process.returncode != 0:
            raise StepFailed(
                f"torch_xla's openxla_patches/{name} does not apply to OpenXLA "
                f"{spec.provenance.get('components', {}).get('openxla', {}).get('commit')}: "
                "the bundle's OpenXLA needs a patch that replaces it (patches/openxla/)"
            )
        applied.append({"path": f"openxla_patches/{name}", "sha256": _sha256(patch_file)})
    state = Path(spec.logs).parent / recipes.PATCH_STATE
    state.write_text(json.dumps(applied, indent=2) + "\n", encoding="utf-8")
    _say(f"# {len(applied)} openxla_patches/ file(s) applied", log_file)


def _write_file(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    path, text = Path(args[0]), args[1]
    path.write_text(text, encoding="utf-8")


def _toolchain(spec: BuildSpec) -> dict[str, str]:
    info = {"python": platform.python_version(), "machine": platform.machine()}
    for key in ("CC", "CXX"):
        compiler = spec.compiler_env.get(key)
        if compiler and shutil.which(compiler):
            out = subprocess.run([compiler, "--version"], capture_output=True, text=True)
            info[key] = (out.stdout.splitlines() or [""])[0]
    bazelversion = Path(spec.torch_xla_tree) / ".bazelversion"
    if bazelversion.exists():
        info["bazel"] = bazelversion.read_text(encoding="utf-8").strip()
    return info


def _stamp_provenance(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    tmp = Path(args[0])
    wheels = sorted(tmp.glob("torch_xla-*.whl"))
    if len(wheels) != 1:
        raise StepFailed(f"expected one torch_xla wheel in {tmp}, found {len(wheels)}")
    state = Path(spec.logs).parent / recipes.PATCH_STATE
    provenance = dict(spec.provenance)
    provenance["torch_xla_openxla_patches"] = (
        json.loads(state.read_text(encoding="utf-8")) if state.exists() else []
    )
    provenance["toolchain"] = _toolchain(spec)
    provenance["torch_xla_version"] = spec.torch_xla_version
    provenance["torch_version"] = spec.torch_version
    stamp.add_file_to_wheel(
        wheels[0], f"torch_xla/{stamp.PROVENANCE_NAME}", stamp.provenance_bytes(provenance)
    )
    _say(f"# torch_xla/{stamp.PROVENANCE_NAME} added to {wheels[0].name}", log_file)


ACTIONS = {
    "finish-stage": _finish_stage,
    "apply-openxla-patches": _apply_openxla_patches,
    "write-file": _write_file,
    "stamp-provenance": _stamp_provenance,
}


def run_recipe(spec: BuildSpec, name: str, staging: str | None = None) -> None:
    logs = Path(spec.logs)
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with log_path.open("w", encoding="utf-8") as log_file:
        _say(f"# recipe {name} for bundle {spec.bundle} (log: {log_path})", log_file)
        for step in recipes.recipe(spec, name, staging):
            run_step(step, spec, log_file, log_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xla_wheels.builder.inside")
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--recipe", choices=("torch", "torch_xla", "ship"), required=True)
    parser.add_argument("--staging", default=None, help="staged wheels (ship recipe)")
    args = parser.parse_args(argv)
    try:
        run_recipe(BuildSpec.read(args.spec), args.recipe, args.staging)
    except (StepFailed, FileNotFoundError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
