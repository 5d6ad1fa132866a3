"""``make demo``: every stage of the pipeline, end to end, on a demonstration upstream.

This is NOT PyTorch. A newcomer without a builder host (no Bazel, no TPU, maybe no
network) can still watch the real pipeline work: this module writes the stand-in upstream
the tests build too (:mod:`xla_wheels.stand_in`: three tiny git repositories for torch,
torch_xla and OpenXLA, each a few lines of Python with the build interface the recipes
expect, every file saying it is NOT PyTorch), a project root with a bundle manifest
``demo`` and a patch series, and then runs the same CLI subcommands ``make wheels``,
``make publish``, ``make verify-install`` and ``make doctor`` run, as child processes,
in host mode:

1. manifest -> sources -> patch series -> build -> collect and lock: ``wheels``
2. publish into the project's static validation lane: ``publish-lane``
3. install by hash into a fresh venv from the lane's simple page: ``verify-install``
4. the host check against the bundle and the lane: ``doctor``

Everything is written under one directory (``--dir``, default ``out/demo``), including
the children's HOME, TMPDIR, per-machine cache and pip configuration (none: pip reads no
pip.conf and installs only from the lane or the build's own wheels), so the demo needs
no network and leaves nothing elsewhere. Nothing is started that outlives it.

The demonstration torch_xla has the persistent-cache defect in miniature
(``torch_xla.load_cache()`` returns False); the series' patch 0001 fixes it, and the build's
ship check runs it, so the demo passes only for a patched build.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from xla_host import runner
from xla_host.arguments import RefusedSwitchAction
from xla_host.cache_contract import directory_name
from xla_host.errors import BundleBusy, PipelineError, UsageError
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.cli import Parser, checked_arguments, exit_code_of
from xla_wheels.run_lock import LOCK_NAME, bundle_run_lock
from xla_wheels.stand_in import NOTICE, make_stand_in, wheels_flags
from xla_wheels.wheels_lock import read_lock

BUNDLE = "demo"
DEFAULT_DIR = Path("out") / "demo"
#: Left in the demo directory, so a second run may replace it (and nothing else).
MARKER = ".xla-wheels-demo"
STAGE_TIMEOUT_S = 900.0
PYTHON_MINOR = f"{sys.version_info[0]}.{sys.version_info[1]}"

LANES_TOML = """\
# Lanes of the demonstration project (see the main project's build/lanes.toml).
publish-lane = "validation"

[lanes.validation]
description = "demonstration: every published bundle"
path = "dist/lanes/validation"
"""


def make_demo_project(base: Path) -> Path:
    """The three stand-in repositories under ``base/upstream`` and a project root
    ``base/project`` (returned: build/, patches/, then wheels.lock, dist/, out/) whose
    bundle ``demo`` pins them with a two-patch series."""
    stand_in = make_stand_in(base / "upstream", who="demo")
    commits = stand_in.commits
    root = base / "project"
    stand_in.write_series(root / "patches")
    (root / "build" / "bundles").mkdir(parents=True)
    (root / "build" / "lanes.toml").write_text(LANES_TOML)
    (root / "build" / "bundles" / f"{BUNDLE}.toml").write_text(
        f"""\
# {NOTICE.format(who="demo", what="a torch / torch_xla bundle")}
[bundle]
name = "{BUNDLE}"
description = "DEMONSTRATION upstream written by make demo (NOT PyTorch)"
python = "{PYTHON_MINOR}"

[components.torch]
remote = "{stand_in.repos["torch"]}"
commit = "{commits["torch"]}"
version = "2.9.0a0"
submodules = false
patches = []

[components.torch_xla]
remote = "{stand_in.repos["torch_xla"]}"
commit = "{commits["torch_xla"]}"
version = "2.9.0"
patches = ["torch_xla/0001-load-cache.patch"]

[components.openxla]
remote = "{stand_in.repos["openxla"]}"
commit = "{commits["openxla"]}"
patches = ["openxla/0001-api.patch"]

[build]
bundle_libtpu = false
tpuvm_mode = true
build_cpp_tests = false
cxx_abi = 1

# The demonstration runs on CPU: its platform, which doctor checks PJRT_DEVICE against.
[profiles.demo.device]
PJRT_DEVICE = "CPU"
"""
    )
    return root


@dataclass(frozen=True)
class Stage:
    title: str
    args: tuple[str, ...]
    env: Callable[[], Mapping[str, str]] | None = None
    """Extra environment, computed when the stage starts (it may need earlier results)."""


def doctor_env(directory: Path, root: Path) -> dict[str, str]:
    """The runtime contract doctor checks, as a host would set it (CPU: there is no TPU
    here), with a persistent-cache directory named the way the cache contract asks: after
    the bundle and the full torch_xla version the build just locked."""
    entry = read_lock(root / "wheels.lock").bundles[BUNDLE]
    (torch_xla,) = [
        parse_wheel_name(w.name) for w in entry.wheels or () if w.name.startswith("torch_xla-")
    ]
    cache = directory / "xla-cache" / directory_name(BUNDLE, torch_xla.version, None)
    cache.mkdir(parents=True, exist_ok=True)
    return {
        "PJRT_DEVICE": "CPU",
        "XLA_NO_SPECIAL_SCALARS": "1",
        "XLA_PERSISTENT_CACHE_PATH": str(cache),
    }


def stages(directory: Path, root: Path) -> list[Stage]:
    """The CLI subcommands of the demo, in order (what the make targets run)."""

    def command(name: str, flags: Mapping[str, str], *switches: str) -> tuple[str, ...]:
        every = {"--root": str(root), "--bundle": BUNDLE, **flags}
        return (name, *itertools.chain.from_iterable(every.items()), *switches)

    wheels = {
        "--mode": "host",
        "--host-python": sys.executable,
        **wheels_flags(directory / "cache"),
    }
    lane_index = (root / "dist" / "lanes" / "validation" / "simple").as_uri() + "/"
    venv_python = root / "out" / BUNDLE / "verify-install" / "venv" / "bin" / "python"
    doctor = {"--python": str(venv_python), "--lane": "validation"}
    return [
        Stage(
            "manifest -> sources -> patch series -> build -> collect and lock (make wheels)",
            command("wheels", wheels),
        ),
        Stage("publish to the validation lane (make publish)", command("publish-lane", {})),
        Stage(
            "install by hash into a fresh venv from the lane (make verify-install)",
            command("verify-install", {"--index-url": lane_index}, "--require-provenance"),
        ),
        Stage(
            "check the installed environment against the bundle and lane (make doctor)",
            command("doctor", doctor),
            env=lambda: doctor_env(directory, root),
        ),
    ]


def _child_env(directory: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PIP_", "XLA_WHEELS_", "XLA_", "PJRT_", "TPU_", "TWINE_"))
    }
    return {
        **env,
        # Everything the children write goes under the demo directory.
        "HOME": str(directory / "home"),
        "TMPDIR": str(directory / "tmp"),
        "XLA_WHEELS_CACHE": str(directory / "cache"),
        # No pip.conf: pip installs only from the lane or the build's own wheels.
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INPUT": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
        ),
        **(extra or {}),
    }


#: What the demo's path cannot hold: it is written into TOML strings (the manifests,
#: lanes.toml) and environment files, where a quote or a backslash ends or escapes it and
#: a tab or line break is refused late, with a fix about the file instead of the path.
_UNWRITABLE = frozenset('"\\') | {chr(n) for n in (*range(0x20), 0x7F)}


def _check_characters(directory: Path) -> None:
    found = sorted({char for char in str(directory) if char in _UNWRITABLE})
    if found:
        names = ", ".join(ascii(char) for char in found)
        raise UsageError(
            f"DEMO_DIR {str(directory)!a} holds {names}, which the demo cannot write "
            "into its manifests and environment files",
            fix="name a directory whose path has no double quote, backslash, tab or line "
            "break: `make demo DEMO_DIR=<dir>`",
        )


def _check_directory(directory: Path) -> list[Path]:
    """What a previous demo left in ``directory`` (to be replaced); a directory that holds
    anything else is refused. The lock file of a running demo is neither."""
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise UsageError(
            f"{directory} is not a directory",
            fix="name an empty or new directory: `make demo DEMO_DIR=<dir>`",
        )
    previous = [child for child in directory.iterdir() if child.name != LOCK_NAME]
    if previous and not (directory / MARKER).is_file():
        raise UsageError(
            f"{directory} exists and is not a previous demo's directory (no {MARKER})",
            fix="name an empty or new directory: `make demo DEMO_DIR=<dir>`",
        )
    return previous


def _one_demo_at_a_time(directory: Path) -> ExitStack:
    """The lock the pipeline's runs take (:mod:`xla_wheels.run_lock`), on the demo
    directory: a second demo there would delete the first one's files under it."""
    held = ExitStack()
    try:
        held.enter_context(bundle_run_lock(directory.parent, directory.name, "make demo"))
    except BundleBusy:
        holder = (directory / LOCK_NAME).read_text(errors="replace").strip() or "unknown"
        raise BundleBusy(
            f"another demo is running in {directory} (pid and command: {holder})",
            fix="wait for it to finish, or give this one a directory of its own: "
            "`make demo DEMO_DIR=<dir>`",
        ) from None
    return held


def _prepare(directory: Path) -> None:
    # Checked again under the lock: the directory may have changed while we waited.
    for child in _check_directory(directory):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text("written by `make demo`; removed by the next run\n")
    (directory / "home").mkdir()
    (directory / "tmp").mkdir()


def run_demo(directory: Path) -> int:
    """Generate the demonstration project under ``directory`` and run every stage (0: all
    passed; a stage that fails raises)."""
    _check_characters(directory)
    directory = directory.resolve()
    # Refused before the lock is taken, which would write into a directory not ours.
    _check_directory(directory)
    with _one_demo_at_a_time(directory):
        return _run_stages(directory)


def _run_stages(directory: Path) -> int:
    _prepare(directory)
    started = time.monotonic()
    print(f"== demo: a DEMONSTRATION upstream (NOT PyTorch) in {directory}/upstream", flush=True)
    root = make_demo_project(directory)
    print(f"   project root {root} (bundle {BUNDLE}, patches/, build/lanes.toml)")
    plan = stages(directory, root)
    logs = directory / "logs"
    logs.mkdir()
    for number, stage in enumerate(plan, 1):
        argv = [sys.executable, "-m", "xla_wheels", *stage.args]
        log_path = logs / f"{number}-{stage.args[0]}.log"
        print(f"== [{number}/{len(plan)}] {stage.title}", flush=True)
        print(f"   python -m xla_wheels {stage.args[0]} ... (log: {log_path})", flush=True)
        env = _child_env(directory, stage.env() if stage.env else None)
        begun = time.monotonic()
        with log_path.open("w") as handle:
            handle.write("$ " + " ".join(argv) + "\n")
            handle.flush()
            result = runner.run(
                argv, cwd=directory, base_env=env, echo="none", output=handle,
                step=f"demo stage {number} ({stage.args[0]})", timeout=STAGE_TIMEOUT_S,
                own_group=True,  # ended with the demo (SIGTERM to it alone included)
                check=False,
            )  # fmt: skip
        summary = _summary(log_path)
        for line in summary:
            print(f"   {line}")
        if result.returncode != 0:
            raise PipelineError(
                f"demo stage {number} ({stage.args[0]}) failed with exit {result.returncode}; "
                f"its output is in {log_path}",
                fix=f"read {log_path}: the error:/fix: lines at its end name the cause",
            )
        print(f"   done in {time.monotonic() - begun:.1f}s", flush=True)
    report = root / "out" / BUNDLE / "verify-install" / "report.json"
    print(
        f"== demo: every stage passed in {time.monotonic() - started:.0f}s. Where to look:\n"
        f"   {root / 'build' / 'bundles' / (BUNDLE + '.toml')}   the manifest\n"
        f"   {root / 'patches'}/   the patch series\n"
        f"   {root / 'out' / BUNDLE / 'src'}/   the patched sources\n"
        f"   {root / 'dist' / BUNDLE}/   the wheels, and {root / 'wheels.lock'}\n"
        f"   {root / 'dist' / 'lanes' / 'validation'}/   the lane (simple/ index)"
        f" and {root / 'lanes.lock'}\n"
        f"   {report}   the install check\n"
        f"   {logs}/   each stage's full output"
    )
    return 0


def _summary(log_path: Path) -> list[str]:
    """The lines of a stage's output worth showing here: its checks, results and timings
    (the progress and the commands stay in the log)."""
    checks = ("ok ", "FAIL ", "WARN ", "error:", "fix:", "copied ", "skipped ")
    results = ("lane ", "collect: ", "verify-install ", "doctor")
    timings = (" ran", " reused", " skipped")  # the build's stage timings
    lines = (line.strip() for line in log_path.read_text(errors="replace").splitlines())
    shown = [text for text in lines if text.startswith(checks + results) or text.endswith(timings)]
    # A stage that prints each check as it happens ("ok  install: ...") and again in its
    # closing table ("ok  install  ...") shows it once: the table's line, in its place.
    # Only verdict lines are merged: two equal fix: lines belong to two different checks.
    keys = [
        _check_key(text) if text.startswith(VERDICTS) else str(n) for n, text in enumerate(shown)
    ]
    last = {key: number for number, key in enumerate(keys)}
    return [text for number, text in enumerate(shown) if last[keys[number]] == number]


VERDICTS = ("ok ", "FAIL ", "WARN ")


def _check_key(line: str) -> str:
    """A check line as words, whether its name ends in a colon or in padding."""
    return " ".join(line.replace(":", " ", 1).split())


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line (``make help`` reads DEMO_DIR's text from it)."""
    parser = Parser(
        prog="python -m xla_wheels.demo",
        description="Run every stage of the pipeline on a demonstration upstream (NOT torch).",
    )
    parser.set_defaults(command="demo")
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"the one directory the demo writes (default: {DEFAULT_DIR})",
    )
    # The demo has no dry run: asked for one, it refuses rather than replace DEMO_DIR.
    parser.add_argument(
        "--dry-run", action=RefusedSwitchAction, default=False, help=argparse.SUPPRESS
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    return exit_code_of(lambda: _checked_run(arguments))


def _checked_run(arguments: list[str]) -> int:
    # The checks every make target's command makes before anything runs (make variables,
    # switches, the environment; the demo has no dry run, so DRY_RUN=1 is refused).
    args = checked_arguments(build_parser, arguments)
    return run_demo(args.dir)


if __name__ == "__main__":
    sys.exit(main())
