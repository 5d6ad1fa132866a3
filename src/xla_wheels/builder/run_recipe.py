"""``python -m xla_wheels.builder.run_recipe --spec FILE --recipe NAME``: run one recipe.

The same entry point runs inside the builder image (ENGINE=docker|podman|buildah) and on
the host (BUILD_MODE=host), so both modes run identical recipes. Each command is printed
before it runs, to stderr and to ``<out>/logs/<recipe>.log``; the command's own output
goes, line by line, to the log file and to stderr, where the caller has opened a folded
section for the recipe (``log.section``: a GitHub Actions ``::group::``), as cibuildwheel
streams its build steps: a build that takes hours shows what it is doing, CI folds it
away, and the log keeps all of it. A failure then prints the log's tail and its path, so
the cause is visible even where the section is folded. Exit 0 on success, 1 when a step
fails, 2 on bad arguments, 10 (``disk_faults.DISK_FAULT_EXIT``) when a step or the recipe
itself hit a full disk, a quota or a read-only filesystem: the pipeline reports that as a
disk error naming the directory, not as a failed build or check.

Credentials for the remote compile caches arrive in the 0600 file named by
``XLA_WHEELS_SECRETS_FILE`` (``remote_cache``): they fill the steps' templates at run
time, each command's output is redacted on its way to the log, and the printed commands
show the redaction marker.

Imports only the standard library and this package: the image needs no pipeline
dependencies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from xla_host import filemode, runner, signals
from xla_host.errors import ExitCode
from xla_host.provenance import PROVENANCE_PATH, PatchDigest, Provenance
from xla_host.redact import Redactor
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels import disk_faults, venv_check, wheel_stamp
from xla_wheels.builder import recipes, remote_cache
from xla_wheels.builder.spec import BuildSpec, record_stage, sha256_of
from xla_wheels.upstream_tree import OPENXLA_PATCHES, workspace_openxla_patches

TAIL_LINES = 40


class StepFailed(Exception):
    pass


class StepDiskFault(StepFailed):
    """A step failed and its output says why: no space, a quota, a read-only filesystem."""


def _say(message: str, log_file: TextIO) -> None:
    print(message, file=sys.stderr, flush=True)
    print(message, file=log_file, flush=True)


def run_step(
    step: recipes.Step,
    spec: BuildSpec,
    log_file: TextIO,
    log_path: Path,
    secrets: Mapping[str, str],
) -> None:
    """Run one step. ``secrets`` fill the step's templates; their values never reach the
    log: the command line is printed with the marker and the command's output is
    redacted line by line on its way to the log file."""
    if step.only_if_exists and not Path(step.only_if_exists).exists():
        _say(f"# skip ({step.only_if_exists} does not exist): {step.title}", log_file)
        return
    _say(f"+ {step.render()}", log_file)
    if step.action == "write-private-file":
        path, template = step.args
        remote_cache.write_private_file(Path(path), _filled(template, secrets))
        return
    if step.action:
        ACTIONS[step.action](spec, step.args, log_file)
        return
    argv = recipes.expand_argv(step)
    env = {key: value for key, value in os.environ.items() if key != remote_cache.ENV_SECRETS_FILE}
    env.update(step.env)
    env.update({key: _filled(template, secrets) for key, template in step.secret_env})
    if step.path_prepend:
        env["PATH"] = os.pathsep.join([*step.path_prepend, env.get("PATH", "")])
    if step.cwd:
        Path(step.cwd).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with _git_dir_as_directory(step.git_dir_for, log_file):
        # The output goes, line by line, through the redactor (a build system may echo its
        # environment, e.g. CMake's or setup.py's printing of the compiler setup).
        returncode = runner.run(
            argv,
            cwd=step.cwd,
            base_env=env,
            echo="none",  # printed above, with the secrets' marker
            tee=log_file,
            redact=Redactor(secrets),
            check=False,  # the recipe reports a step's failure with its log's tail
        ).returncode
    _say(f"# {step.title}: exit {returncode} in {time.monotonic() - start:.1f}s", log_file)
    if returncode != 0:
        log_file.flush()
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
        print(f"--- last {len(tail)} lines of {log_path} ---", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr, flush=True)
        fault = disk_faults.fault_in_text("\n".join(tail)) or disk_faults.exhausted(
            _written_dirs(spec)
        )
        if fault is not None:
            raise StepDiskFault(f"{step.title} stopped on a disk fault: {fault}; log: {log_path}")
        raise StepFailed(f"{step.title} failed (exit {returncode}); log: {log_path}")


def _written_dirs(spec: BuildSpec) -> list[Path]:
    """Where the recipes write: a step that failed there on a full or read-only
    filesystem is a disk fault, whatever the tool printed."""
    paths = [
        spec.logs,
        spec.ship_env,
        spec.ship_out,
        spec.buildenv,
        spec.torch_stage,
        spec.torch_xla_stage,
        spec.pip_cache_dir,
        spec.ccache_dir,
        spec.bazel_disk_cache,
        spec.bazel_output_root,
        tempfile.gettempdir(),
    ]
    return [Path(path) for path in paths]


@contextlib.contextmanager
def _git_dir_as_directory(worktree: str | None, log_file: TextIO) -> Iterator[None]:
    """While the step runs, ``<worktree>/.git`` is a symlink to the worktree's own git
    directory instead of the ``gitdir:`` file ``git worktree add`` writes; restored after.

    torch_xla's setup.py reads torch's revision only when ``../.git`` is a directory
    (``recipes.TORCH_GIT_DIR_NOTE``). git treats the symlinked directory as the same
    linked worktree (its HEAD, index and common repository), so ``git rev-parse HEAD``
    there is the worktree's HEAD. Replaced by rename both ways, so the tree is never
    without a ``.git``; a run killed in between leaves the symlink, which git reads as
    the same worktree (and the sources stage removes like any worktree).
    """
    dot_git = Path(worktree, ".git") if worktree else None
    if dot_git is None or not dot_git.is_file():
        yield  # none asked, or a directory already (a clone, or a symlink left by a killed run)
        return
    original = dot_git.read_text(encoding="utf-8")
    if not original.startswith("gitdir:"):
        raise StepFailed(f"{dot_git} is neither a git directory nor a gitdir file")
    target = Path(original.removeprefix("gitdir:").strip())
    if not target.is_absolute():
        target = (dot_git.parent / target).resolve()
    link = dot_git.with_name(".git.xla-wheels-link")
    saved = dot_git.with_name(".git.xla-wheels-file")
    link.unlink(missing_ok=True)
    link.symlink_to(target, target_is_directory=True)
    _say(f"# {dot_git} -> {target} while this step runs (TORCH_GITREV)", log_file)
    os.replace(link, dot_git)
    try:
        yield
    finally:
        saved.write_text(original, encoding="utf-8")
        os.replace(saved, dot_git)


def _filled(template: str, secrets: Mapping[str, str]) -> str:
    try:
        return remote_cache.fill_template(template, secrets)
    except KeyError as error:
        raise StepFailed(str(error.args[0])) from None


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
    if parse_wheel_name(wheel.name).version != expected:
        raise StepFailed(f"{wheel.name} does not carry the version {expected}")
    record_stage(wheel)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _say(f"# stage {package}: {final}/{wheel.name}", log_file)


def _apply_openxla_patches(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    tree, openxla = Path(args[0]), Path(args[1])
    applied = []
    for name in workspace_openxla_patches(tree):
        patch_file = tree / OPENXLA_PATCHES / name
        argv = ["patch", "-p1", "-l", "-N", "-i", str(patch_file)]
        _say(f"+ cd {openxla} && {' '.join(argv)}", log_file)
        log_file.flush()
        process = runner.run(argv, cwd=openxla, echo="none", output=log_file, check=False)
        if process.returncode != 0:
            raise StepFailed(
                f"torch_xla's openxla_patches/{name} does not apply to OpenXLA "
                f"{Provenance.from_json(spec.provenance).components['openxla'].commit}: "
                "the bundle's OpenXLA needs a patch that replaces it (patches/openxla/)"
            )
        applied.append({"path": f"openxla_patches/{name}", "sha256": sha256_of(patch_file)})
    state = Path(spec.logs).parent / recipes.PATCH_STATE
    state.write_text(json.dumps(applied, indent=2) + "\n", encoding="utf-8")
    _say(f"# {len(applied)} openxla_patches/ file(s) applied", log_file)


def _write_file(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    Path(args[0]).write_text(args[1], encoding="utf-8")


def _toolchain(spec: BuildSpec) -> dict[str, str]:
    info = {"python": platform.python_version(), "machine": platform.machine()}
    for key in ("CC", "CXX"):
        compiler = spec.compiler_env.get(key)
        if compiler and shutil.which(compiler):
            out = runner.run([compiler, "--version"], echo="none", check=False)
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
    applied = json.loads(state.read_text(encoding="utf-8")) if state.exists() else []
    provenance = Provenance.from_json(spec.provenance).stamped(
        torch_version=spec.torch_version,
        torch_xla_version=spec.torch_xla_version,
        toolchain=_toolchain(spec),
        openxla_patches=tuple(PatchDigest(row["path"], row["sha256"]) for row in applied),
    )
    wheel_stamp.stamp_provenance(wheels[0], provenance, wheel_stamp.epoch_from(spec.extra_env))
    _say(f"# {PROVENANCE_PATH} added to {wheels[0].name}", log_file)


def _repack_wheel(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    for wheel in sorted(Path(args[0]).glob("*.whl")):
        wheel_stamp.repack_wheel(wheel, wheel, wheel_stamp.epoch_from(spec.extra_env))
        _say(f"# {wheel.name} re-packed reproducibly", log_file)


def _check_venv(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    venv = Path(args[0])
    if (problem := venv_check.outside_venv(venv / "bin" / "python", venv)) is not None:
        raise StepFailed(f"{problem}; nothing was installed ({venv_check.fix_for(venv)})")
    _say(f"# {venv}/bin/python is the venv {venv}", log_file)


def _pip_from_bundle(spec: BuildSpec, args: Sequence[str], log_file: TextIO) -> None:
    venv, unpacked_in = (Path(arg) for arg in args)
    _say(f"# {venv_check.pip_from_bundle(venv, unpacked_in)}", log_file)


ACTIONS = {
    "check-venv": _check_venv,
    "pip-from-bundle": _pip_from_bundle,
    "repack-wheel": _repack_wheel,
    "finish-stage": _finish_stage,
    "apply-openxla-patches": _apply_openxla_patches,
    "write-file": _write_file,
    "stamp-provenance": _stamp_provenance,
}


def run_recipe(spec: BuildSpec, name: str, staging: str | None = None) -> None:
    logs = Path(spec.logs)
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    secrets = remote_cache.read_secrets(os.environ)
    with log_path.open("w", encoding="utf-8") as log_file:
        _say(f"# recipe {name} for bundle {spec.bundle} (log: {log_path})", log_file)
        for step in recipes.recipe(spec, name, staging):
            run_step(step, spec, log_file, log_path, secrets)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xla_wheels.builder.run_recipe")
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--recipe", choices=("torch", "torch_xla", "ship"), required=True)
    parser.add_argument("--staging", help="staged wheels (ship recipe)")
    args = parser.parse_args(argv)
    try:
        with signals.handled():  # SIGTERM/SIGHUP: the running step is ended, as on Ctrl-C
            # The recipe runs in a process group of its own (Engine.call), so a SIGKILL to
            # the run's group, which the run cannot pass on, would leave it running and the
            # next run racing it on the same ship venv: the kernel's SIGTERM when the run
            # dies ends the running step as Ctrl-C does.
            signals.end_with_parent()
            run_recipe(BuildSpec.read(args.spec), args.recipe, args.staging)
    except filemode.NotARegularFile as error:  # the stage cache holds a FIFO or device
        print(f"error: {error.message} (fix: {error.fix})", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except (StepFailed, ValueError, OSError) as error:
        if isinstance(error, StepDiskFault) or disk_faults.is_disk_fault(error):
            # Not `error:`: the pipeline prints the one error line, naming the directory.
            print(f"disk fault: {error}", file=sys.stderr)
            return disk_faults.DISK_FAULT_EXIT
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt as interrupt:
        # The pipeline's CLI (the parent) reports the interruption; no traceback here.
        print(f"recipe {signals.describe(interrupt)}", file=sys.stderr)
        return signals.exit_code(interrupt)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
