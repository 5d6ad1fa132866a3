"""The one options reader: command line, then ``XLA_WHEELS_*``, then the default.

The environment is a dict here: nothing in the reader looks at this process's own.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.gitrepos import REPO_ROOT
from xla_host.errors import UsageError
from xla_wheels import make_help
from xla_wheels import stock_envs as envs
from xla_wheels.builder.config import DEFAULT_IMAGE
from xla_wheels.cli import COMMANDS, build_parser
from xla_wheels.cli.settings import build_config, pipeline_options, publish_options
from xla_wheels.options import ENV_SETTINGS, env_var, machine_cache


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(argv[0]).parse_args(list(argv))


def test_the_naming_rule() -> None:
    assert env_var("--engine") == "XLA_WHEELS_ENGINE"
    assert env_var("--cache-dir") == "XLA_WHEELS_CACHE"
    assert env_var("--dry-run") == "XLA_WHEELS_DRY_RUN"
    assert env_var("--bazel-remote-cache") == "XLA_WHEELS_BAZEL_REMOTE_CACHE"


def test_every_environment_setting_is_a_flag_of_some_subcommand() -> None:
    flags: set[str] = set()
    for name in COMMANDS:
        sub = build_parser(name)._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
        flags.update(o for action in sub._actions for o in action.option_strings)
    assert set(ENV_SETTINGS) <= flags, set(ENV_SETTINGS) - flags


def test_flag_beats_environment_beats_default(tmp_path: Path) -> None:
    environ = {"XLA_WHEELS_ENGINE": "podman", "XLA_WHEELS_JOBS": "3", "HOME": str(tmp_path)}
    from_env = build_config(parse("wheels", "--bundle", "x"), environ)
    assert (from_env.engine, from_env.jobs, from_env.image) == ("podman", 3, DEFAULT_IMAGE)
    from_flag = build_config(parse("wheels", "--engine", "buildah", "--jobs", "5"), environ)
    assert (from_flag.engine, from_flag.jobs) == ("buildah", 5)
    default = build_config(parse("wheels"), {})
    assert default.engine == "docker" and default.mode == "container"


def test_the_old_short_variables_are_not_read() -> None:
    # One naming rule: ENGINE / DRY_RUN reach the CLI only as flags (the Makefile maps them).
    config = build_config(parse("wheels"), {"ENGINE": "podman", "JOBS": "7"})
    assert (config.engine, config.jobs) == ("docker", os.cpu_count() or 1)
    options = pipeline_options(parse("wheels", "--root", str(REPO_ROOT)), {"DRY_RUN": "1"})
    assert options.dry_run is False


def test_pipeline_options_read_the_environment_given(tmp_path: Path) -> None:
    environ = {
        "XLA_WHEELS_ROOT": str(REPO_ROOT),
        "XLA_WHEELS_CACHE": str(tmp_path / "cache"),
        "XLA_WHEELS_MIRROR": "/srv/git",
        "XLA_WHEELS_DRY_RUN": "yes",
    }
    options = pipeline_options(parse("sources"), environ)
    assert options.root == REPO_ROOT.resolve()
    assert options.cache_dir == (tmp_path / "cache").resolve()
    assert options.out_dir == REPO_ROOT.resolve() / "out"
    assert (options.mirror, options.dry_run) == ("/srv/git", True)


def test_publish_options_and_a_bad_setting(tmp_path: Path) -> None:
    environ = {"XLA_WHEELS_INDEX_URL": "http://127.0.0.1:1/simple/", "XLA_WHEELS_NO_DEPS": "1"}
    settings = publish_options(parse("verify-install"), environ)
    assert settings.index_url == "http://127.0.0.1:1/simple/" and settings.no_deps is True
    assert publish_options(parse("verify-install"), {}).no_deps is False
    refused = r"XLA_WHEELS_ENGINE: 'kaniko' \(from XLA_WHEELS_ENGINE\) is not one of"
    with pytest.raises(UsageError, match=refused):
        build_config(parse("wheels"), {"XLA_WHEELS_ENGINE": "kaniko"})


def test_the_machine_cache_honours_xla_wheels_cache_then_xdg(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert machine_cache({"XLA_WHEELS_CACHE": str(tmp_path / "c"), "HOME": home}) == (
        tmp_path / "c"
    )
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": home}
    assert machine_cache(xdg) == tmp_path / "xdg" / "xla-wheels"
    assert machine_cache({"HOME": home}) == tmp_path / "home" / ".cache" / "xla-wheels"


def test_the_gate_looks_for_its_environment_in_the_pipelines_cache(tmp_path: Path) -> None:
    """``make gate`` and ``make wheels`` share one cache: XDG_CACHE_HOME moves both."""
    cache = machine_cache({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    tag = "cp{}{}".format(*sys.version_info[:2])
    env_dir = cache / "envs" / envs.env_name(envs.STOCK_SPECS[envs.DEFAULT_STOCK], tag)
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / envs.MARKER).write_text("{}")
    # A marked environment whose python has no torch_xla: the gate must pick this one
    # (and say it cannot judge it) instead of building one under ~/.cache.
    (env_dir / "bin" / "python").symlink_to(sys.executable)
    result = run_cli(
        "gate", "--device", "CPU", "--out", str(tmp_path / "out"),
        env={"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")},
        timeout=300,
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert f"torch_xla does not import in {env_dir / 'bin' / 'python'}" in result.stderr


def test_the_makefile_holds_no_default_for_a_cli_setting() -> None:
    text = (REPO_ROOT / "Makefile").read_text()
    assert re.findall(r"^([A-Z_]+) \?=", text, re.MULTILINE) == ["PYTHON_FOR_VENV"]


def _make_dry(*argv: str) -> str:
    """The command ``make -n`` would run for ``argv`` (nothing runs)."""
    process = subprocess.run(
        ["make", "-n", "--no-print-directory", *argv], cwd=REPO_ROOT, text=True,
        capture_output=True, check=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    line = " ".join(process.stdout.strip().splitlines()[-1].split())  # unset ones add spaces
    return line[line.find("-m xla_wheels") :]  # without the make context it passes in front


def test_make_turns_its_variables_into_flags_and_adds_none_unset() -> None:
    command = _make_dry("wheels", "BUNDLE=v6e-2.9", "ENGINE=podman", "JOBS=3", "DRY_RUN=1")
    assert command.startswith("-m xla_wheels wheels ") and "--bundle='v6e-2.9'" in command
    assert "--dry-run='1'" in command and "--engine='podman'" in command
    assert "--jobs='3'" in command
    # make interprets no value: the CLI owns the switch spellings and refuses the others.
    assert "--dry-run='0'" in _make_dry("wheels", "BUNDLE=v6e-2.9", "DRY_RUN=0")
    bare = _make_dry("wheels", "BUNDLE=v6e-2.9")
    assert "--dry-run" not in bare and "--engine" not in bare and "--mode" not in bare
    assert "--xla-cache-dir" not in _make_dry("gate") and _make_dry("gate").endswith("gate")


def test_the_remote_cache_reads_the_environment_and_checkout_it_is_given(tmp_path: Path) -> None:
    # The checkout comes from XLA_WHEELS_ROOT in the given dict (not os.environ), and the
    # remote-cache settings after its build/builders.toml come from that same dict.
    root = tmp_path / "project"
    (root / "build").mkdir(parents=True)
    (root / "build" / "builders.toml").write_text(
        '[builder]\nrole = "writer"\n[ccache]\nremote_storage = "redis://127.0.0.1:1"\n'
    )
    environ = {
        "XLA_WHEELS_ROOT": str(root),
        "XLA_WHEELS_BAZEL_REMOTE_CACHE": "grpc://127.0.0.1:2",
        "XLA_WHEELS_CCACHE_REMOTE_PASSWORD": "s3cret",
    }
    remote = build_config(parse("wheels"), environ).remote_cache
    assert remote.settings.role == "writer"
    assert remote.settings.ccache.storage == "redis://127.0.0.1:1"
    assert remote.settings.bazel.cache == "grpc://127.0.0.1:2"
    assert remote.secret_values() == {"ccache_remote_password": "s3cret"}
    flag = build_config(parse("wheels", "--bazel-remote-cache", "grpc://127.0.0.1:3"), environ)
    assert flag.remote_cache.settings.bazel.cache == "grpc://127.0.0.1:3"
    assert build_config(parse("wheels"), {"XLA_WHEELS_ROOT": str(root)}).remote_cache.secrets == ()


def test_every_variable_a_command_takes_is_passed_by_the_targets_that_run_it() -> None:
    # FLAGS_<COMMAND> is written from the parser: a recipe that lists a command's
    # variables by hand again (and leaves one out) fails here.
    makefile = make_help.read_makefile(make_help.makefile_text())
    left_out = {
        (target.name, name)
        for target in makefile.targets
        for command in target.commands
        if command != "demo"
        for name in re.findall(r"\$\(call (?:flag|arg),([A-Z_]+)\)",
                               " ".join(make_help.command_arguments(command)))
        if name not in target.variables
    }  # fmt: skip
    assert left_out == set()
    assert {"ROLE", "OUT", "WORKLOAD"} <= set(
        next(t for t in makefile.targets if t.name == "gate").variables
    )


@pytest.mark.parametrize(
    ("argv", "refused"),
    [(["status", "BUNDLE=v6e-2.11"], "make status does not read BUNDLE"),
     # Without INDEX_URL the target publishes into a lane, which has no upload URL.
     (["publish", "UPLOAD_URL=http://127.0.0.1:9/", "DRY_RUN=1"],
      "make publish does not read UPLOAD_URL")],
)  # fmt: skip
def test_a_variable_the_target_does_not_pass_on_is_refused_not_ignored(
    argv: list[str], refused: str
) -> None:
    ran = subprocess.run(
        ["make", "--no-print-directory", *argv], cwd=REPO_ROOT, text=True,
        capture_output=True, check=False, env={"PATH": os.environ["PATH"]}, timeout=300,
    )  # fmt: skip
    assert ran.returncode != 0 and refused in ran.stderr, ran.stderr
    assert "  fix: make " in ran.stderr and "Traceback" not in ran.stderr
