"""Every build setting is read by the one cascade: its flag, then the ``XLA_WHEELS_*``
variable its row names, then its row's default; a value that is not one is refused naming
the flag and the variable, with a fix that works. Seen in the plan a dry run prints (the
same objects a real run executes)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult
from xla_host.errors import ExitCode
from xla_wheels.settings_rows import SETTINGS, Setting, by_flag

HOST_SRC = REPO_ROOT / "host" / "src"
DRY_WHEELS = ("wheels", "--bundle", "v6e-2.9", "--dry-run")


@pytest.mark.parametrize(
    ("flag", "value", "in_the_plan", "other"),
    [
        ("--host-tools", "git,my-special-tool", "host tools on PATH: python3, git, my-special-tool",
         "git,env-tool"),
        ("--min-disk-gib", "123", "disk >= 123 GiB free", "77"),
        ("--remote-probe-timeout", "30", "`git ls-remote` within 30s", "45"),
        ("--compiler-env", "CC=gcc-13 CXX=g++-13", " CC=gcc-13 ", "CC=icc"),
        ("--pip-args", "--no-cache-dir", "--no-cache-dir -r ", "--pre"),
        ("--ship-pip-args", "--no-index --find-links '{wheels}'", "pip install --no-index --find",
         "--pre"),
        ("--container-python", "python3.12", "python3.12 -m xla_wheels.builder.run_recipe",
         "python3.13"),
        ("--bazel-disk-cache", "/srv/bazel-disk", "BAZEL_DISK_CACHE_PATH=/srv/bazel-disk ",
         "/srv/other"),
    ],
)  # fmt: skip
def test_a_build_settings_variable_reaches_the_plan_and_its_flag_wins(
    run_cli: Callable[..., CliResult], flag: str, value: str, in_the_plan: str, other: str
) -> None:
    variable = by_flag(flag).env
    assert variable is not None, f"{flag}'s row names no XLA_WHEELS_* variable"
    mode = ("--mode", "host") if flag == "--host-tools" else ()
    default = run_cli(*DRY_WHEELS, *mode)
    assert default.exit_code == 0, default.output
    assert in_the_plan not in default.stdout  # so that the next line proves something
    given = run_cli(*DRY_WHEELS, *mode, env={variable: value})
    assert given.exit_code == 0, given.output
    assert in_the_plan in given.stdout
    both = run_cli(*DRY_WHEELS, *mode, f"{flag}={value}", env={variable: other})
    assert both.exit_code == 0, both.output
    assert in_the_plan in both.stdout


def test_the_memory_variables_reach_the_preflight(run_cli: Callable[..., CliResult]) -> None:
    env = {"XLA_WHEELS_MEM_PER_JOB_GIB": "10", "XLA_WHEELS_MEM_BASE_GIB": "3"}
    result = run_cli(*DRY_WHEELS, "--jobs", "1", env=env)
    assert result.exit_code == 0, result.output
    assert "memory >= 13 GiB for JOBS=1" in result.stdout


@pytest.mark.parametrize(
    ("flag", "bad", "reason"),
    [
        ("--compiler-env", "CC=clang CXX", "has 'CXX', which is not NAME=VALUE"),
        ("--pip-args", "--index-url 'http://mirror", "is not shell-quoted words"),
        ("--ship-pip-args", "--find-links '{wheels}", "is not shell-quoted words"),
        ("--min-disk-gib", "lots", "is not a number"),
        ("--mem-per-job-gib", "-1", "from 0 to"),
        ("--mode", "cloud", "is not one of container, host"),
    ],
)
def test_a_bad_variable_names_the_flag_and_the_variable_and_its_fix_works(
    run_cli: Callable[..., CliResult], flag: str, bad: str, reason: str
) -> None:
    variable = str(by_flag(flag).env)
    result = run_cli(*DRY_WHEELS, env={variable: bad})
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    error, fix = result.stderr.splitlines()[:2]
    assert flag in error and variable in error and reason in error, error
    # The fix sets the same variable to a value that works: run it as it is.
    (assignment,) = re.findall(rf"set ({variable}=.*), or unset it", fix)
    name, _, value = shlex.split(assignment)[0].partition("=")
    fixed = run_cli(*DRY_WHEELS, env={name: value})
    assert fixed.exit_code == 0, fixed.output


def test_a_bad_flag_value_names_the_flag_and_the_variable_and_its_fix_works(
    run_cli: Callable[..., CliResult],
) -> None:
    result = run_cli(*DRY_WHEELS, "--compiler-env", "CC=clang CXX")
    assert result.exit_code == 2, result.output
    error, fix = result.stderr.splitlines()[:2]
    assert "--compiler-env" in error and "XLA_WHEELS_COMPILER_ENV" in error, error
    assert "'CXX'" in error and "NAME=VALUE" in error
    (given,) = re.findall(r"pass --compiler-env (.*)", fix)
    fixed = run_cli(*DRY_WHEELS, "--compiler-env", *shlex.split(given))
    assert fixed.exit_code == 0, fixed.output


def _host_doctor(
    tmp_path: Path, *flags: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``xla-host doctor`` against a bundle document given as a file, from the host's
    sources alone (as a host without the builder runs it); ``--json``: the stamp on
    stdout names the role it judged with."""
    from xla_host import bundle_document as doc

    document = tmp_path / "b1.json"
    wheel = doc.LockedFile("torch_xla-2.9.0-cp311-cp311-linux_x86_64.whl", "a" * 64, 10)
    document.write_bytes(doc.dumps(doc.BundleDocument("b1", "validation", "3.11", (wheel,))))
    return subprocess.run(
        [sys.executable, "-m", "xla_host", "doctor", "--bundle-document", str(document),
         "--bundle-sha256", doc.sha256_of(document.read_bytes()), "--json", *flags],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(HOST_SRC), **env},
    )  # fmt: skip


def test_the_host_doctor_takes_its_role_from_xla_wheels_role_and_the_flag_wins(
    tmp_path: Path,
) -> None:
    # This interpreter has no torch_xla: the doctor fails (exit 1), its stamp still says
    # which role it judged the cache with.
    given = _host_doctor(tmp_path, env={"XLA_WHEELS_ROLE": "writer"})
    assert given.returncode == ExitCode.FAILED, given.stderr
    assert json.loads(given.stdout)["role"] == "writer"
    # The finding names how the role was decided (xla_host.cache_role).
    assert "cache role" in given.stderr
    assert "writer (XLA_WHEELS_ROLE=writer), writes" in given.stderr
    both = _host_doctor(tmp_path, "--role", "reader", env={"XLA_WHEELS_ROLE": "writer"})
    assert json.loads(both.stdout)["role"] == "reader"
    neither = _host_doctor(tmp_path, env={})
    # No TPU_WORKER_ID either: the rule's last line, one process alone writes its cache.
    assert json.loads(neither.stdout)["role"] == "writer"


def test_the_host_doctor_refuses_a_bad_xla_wheels_role_naming_the_flag(tmp_path: Path) -> None:
    result = _host_doctor(tmp_path, env={"XLA_WHEELS_ROLE": "owner"})
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr
    error, fix = result.stderr.splitlines()[:2]
    assert "--role" in error and "XLA_WHEELS_ROLE" in error and "'owner'" in error
    assert "fix: set XLA_WHEELS_ROLE=writer, or unset it" in fix
    assert "Traceback" not in result.stderr


def _a_value_of(setting: Setting) -> str:
    """A value ``setting`` takes that is not its default, as a variable would give it."""
    if setting.kind in ("count", "amount"):
        return f"{setting.low:g}" if setting.default != setting.low else f"{setting.high:g}"
    texts = {"switch": "1", "names": "git,a-tool", "arguments": "--pre", "path": "/srv/x",
             "assignments": "CC=gcc-13"}  # fmt: skip
    if setting.flag == "--build-tag":  # a number (PEP 427), checked where it is read
        return "7"
    return setting.choices[-1] if setting.choices else texts.get(setting.kind, "some-text")


def test_every_build_field_named_as_a_row_is_read_from_its_variable(tmp_path: Path) -> None:
    """A new build setting is its row and its field: the options reader needs no line of
    its own, so none can be forgotten."""
    import dataclasses
    import os

    from xla_host.arguments import parse_text
    from xla_wheels.builder.config import BuildConfig
    from xla_wheels.cli import build_parser
    from xla_wheels.cli.settings import build_config

    args = build_parser("wheels").parse_args(["wheels", "--bundle", "v6e-2.9"])
    rows = {s.flag.lstrip("-").replace("-", "_"): s for s in SETTINGS if s.flag and s.env}
    named = [f.name for f in dataclasses.fields(BuildConfig) if f.name in rows]
    assert {"host_tools", "compiler_env", "container_python", "min_disk_gib"} <= set(named)
    for name in named:
        setting = rows[name]
        text = _a_value_of(setting)
        environ = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], str(setting.env): text}
        config = build_config(args, environ)
        # (--jobs: its example, the jobs that fit, is no one value of the row)
        expected = int(text) if name == "jobs" else parse_text(setting, text)
        assert getattr(config, name) == expected, (name, setting.env)


def test_the_host_wheel_carries_only_the_rows_its_commands_read() -> None:
    """The host's rows (``xla_host.settings``) are those its code names; every other row is
    the builder's (``xla_wheels.settings_rows``), and together they are the one table."""
    from xla_host import settings as host
    from xla_wheels import settings_rows

    code = "\n".join(
        path.read_text(encoding="utf-8")
        for path in sorted(HOST_SRC.rglob("*.py"))
        if path.name != "settings.py"
    )
    unread = [
        s.flag or s.env
        for s in host.SETTINGS
        if not any(f'"{name}"' in code for name in (s.flag, s.env) if name)
    ]
    assert not unread, f"rows no host command reads, which belong in settings_rows: {unread}"
    whole = settings_rows.SETTINGS
    assert set(whole) == {*host.SETTINGS, *settings_rows.ROWS}
    flags = [s.flag for s in whole if s.flag]
    assert len(flags) == len(set(flags)), "a flag in both parts of the table"


@pytest.mark.parametrize("flag", ["--host-tools", "--compiler-env", "--ship-pip-args"])
def test_an_empty_list_flag_asks_for_none_and_an_empty_variable_for_the_default(
    tmp_path: Path, flag: str
) -> None:
    # A stand-in build passes --compiler-env "" for no compilers: the row's CC=clang would
    # send its C extension to a compiler the machine does not have.
    import os

    from xla_wheels.cli import build_parser
    from xla_wheels.cli.settings import build_config

    name = flag.lstrip("-").replace("-", "_")
    environ = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    given = build_parser("wheels").parse_args(["wheels", "--bundle", "v6e-2.9", flag, ""])
    assert getattr(build_config(given, environ), name) == ()
    unset = build_parser("wheels").parse_args(["wheels", "--bundle", "v6e-2.9"])
    default = getattr(build_config(unset, environ), name)
    assert default != ()
    assert getattr(build_config(unset, {**environ, str(by_flag(flag).env): ""}), name) == default
