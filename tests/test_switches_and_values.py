"""Every value the user types means one thing, or is refused before anything runs (exit 2).

Classes, each through make and through the CLI: switches (one set of spellings, any
case; anything else refused, never read as "off"), make variables that are not the
Makefile's (a typo of DRY_RUN must not run for real), numbers (finite, in range, named by
the variable that carried them), and argparse's own refusals (our ``error:``/``fix:``,
not a usage dump naming flags the make user never typed).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult, run_cli
from xla_host.values import SWITCH_FALSE, SWITCH_TRUE, BadValue, parse_switch
from xla_wheels.builder.config import BuildConfig, mem_total_gib
from xla_wheels.cli import build_parser
from xla_wheels.make_help import Target, makefile_text, read_makefile

BUNDLE = "v6e-2.9"
BAD_SWITCHES = ["2", "maybe", "TRUEE", "enable", "-1", "yes please"]


def run_make(*argv: str, tmp_path: Path, env: dict[str, str] | None = None) -> CliResult:
    """``make ARGV`` in the checkout; the pipeline's work and cache go under ``tmp_path``."""
    full_env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "XLA_WHEELS_OUT": str(tmp_path / "out"),
        "XLA_WHEELS_CACHE": str(tmp_path / "cache"),
        **(env or {}),
    }
    process = subprocess.run(
        ["make", "--no-print-directory", *argv], cwd=REPO_ROOT, env=full_env, text=True,
        capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    return CliResult(process.returncode, process.stdout, process.stderr)


def assert_refused_before_anything(result: CliResult, tmp_path: Path) -> None:
    assert result.exit_code == 2, result.output
    assert "usage:" not in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def error_lines(result: CliResult) -> list[str]:
    return [line for line in result.stderr.splitlines() if not line.startswith("make: ***")]


# --- switches ------------------------------------------------------------------------


def _parsed_switch(value: str) -> bool:
    args = build_parser("wheels").parse_args(["wheels", f"--dry-run={value}"])
    assert isinstance(args, argparse.Namespace)
    return bool(args.dry_run)


@pytest.mark.parametrize("spelling", [*SWITCH_TRUE, "TRUE", "Yes", "ON", "Y", " true "])
def test_every_documented_on_spelling_is_on_in_any_case(spelling: str) -> None:
    assert _parsed_switch(spelling) is True


@pytest.mark.parametrize("spelling", [*SWITCH_FALSE, "", "FALSE", "No", "OFF", "N"])
def test_every_documented_off_spelling_is_off_in_any_case(spelling: str) -> None:
    assert _parsed_switch(spelling) is False


@pytest.mark.parametrize("spelling", ["TRUE", "Y", "On"])
def test_make_dry_run_in_capitals_is_a_dry_run(spelling: str, tmp_path: Path) -> None:
    # Once DRY_RUN=TRUE meant "off" in the Makefile and a real upload happened.
    result = run_make("wheels", f"BUNDLE={BUNDLE}", f"DRY_RUN={spelling}", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert "] collect" in result.stdout, result.stdout
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def _each_with_a_value(cases: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """``cases`` each with one of :data:`BAD_SWITCHES` in turn, every value at least once:
    the values all go through one reader (the test below refuses each of them there), so
    each way in needs one of them, not all (the full product cost 78 commands)."""
    assert len(cases) >= len(BAD_SWITCHES)
    return [(*case, BAD_SWITCHES[i % len(BAD_SWITCHES)]) for i, case in enumerate(cases)]


@pytest.mark.parametrize("value", BAD_SWITCHES)
def test_the_one_switch_reader_refuses_each_value_it_does_not_know(value: str) -> None:
    with pytest.raises(BadValue, match="is not a switch value"):
        parse_switch(value)


@pytest.mark.parametrize(
    ("target", "variable", "value"),
    _each_with_a_value([
        (("wheels", f"BUNDLE={BUNDLE}"), "DRY_RUN"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "KEEP_RECORDED"),
        (("patch-export", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "FORCE"),
        (("patch-rebase", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "CONTINUE"),
        (("requirements", f"BUNDLE={BUNDLE}"), "REFRESH"),
        (("verify-install", f"BUNDLE={BUNDLE}"), "NO_DEPS"),
        (("publish", f"BUNDLE={BUNDLE}", "INDEX_URL=http://127.0.0.1:9/simple/"), "DRY_RUN"),
    ]),
)  # fmt: skip
def test_make_refuses_a_switch_value_it_does_not_know(
    target: tuple[str, ...], variable: str, value: str, tmp_path: Path
) -> None:
    result = run_make(*target, f"{variable}={value}", tmp_path=tmp_path)
    assert_refused_before_anything(result, tmp_path)
    lines = error_lines(result)
    assert lines[0].startswith(f"error: {variable}: {value!r} is not a switch value"), lines
    assert "--" not in lines[0]  # the make variable, not the CLI flag
    assert lines[1].startswith(f"  fix: make {target[0]} ")
    if variable == "DRY_RUN":
        assert f"{variable}=1" in lines[1]  # the side that changes nothing
    else:
        # Off, as if not given: FORCE=1 would overwrite patch files, whatever was meant.
        assert f"{variable}=" not in lines[1], lines
    assert len(lines) == 2, lines


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    _each_with_a_value([
        (command, variable)
        for command in [("wheels", "--bundle", BUNDLE), ("bundles",)]
        for variable in ["XLA_WHEELS_DRY_RUN", "XLA_WHEELS_KEEP_RECORDED", "XLA_WHEELS_NO_DEPS"]
    ]),
)  # fmt: skip
def test_the_environment_refuses_a_switch_value_it_does_not_know(
    command: tuple[str, ...], variable: str, value: str, tmp_path: Path
) -> None:
    # Checked for every subcommand, whether it reads the switch or not.
    result = run_cli(
        *command, root=REPO_ROOT,
        env={variable: value, "XLA_WHEELS_OUT": str(tmp_path / "out"),
             "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert_refused_before_anything(result, tmp_path)
    assert f"error: {variable}={value!r} is not a switch value" in result.stderr
    assert f"fix: set {variable}=1 or {variable}=0, or unset it" in result.stderr


@pytest.mark.parametrize("value", ["Y", "TRUE", "On"])
def test_the_environment_dry_run_in_capitals_is_a_dry_run(value: str, tmp_path: Path) -> None:
    result = run_cli(
        "wheels", "--bundle", BUNDLE, root=REPO_ROOT,
        env={"XLA_WHEELS_DRY_RUN": value, "XLA_WHEELS_OUT": str(tmp_path / "out"),
             "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("value", ["0", "no", "OFF", "n"])
def test_dry_run_off_is_accepted_by_a_subcommand_without_a_dry_run(value: str) -> None:
    args = build_parser("verify-install").parse_args(["verify-install", f"--dry-run={value}"])
    assert args.dry_run is False


def test_make_dry_run_on_a_subcommand_without_one_is_refused(tmp_path: Path) -> None:
    result = run_make("verify-install", f"BUNDLE={BUNDLE}", "DRY_RUN=yes", tmp_path=tmp_path)
    assert_refused_before_anything(result, tmp_path)
    assert error_lines(result) == [
        "error: DRY_RUN: verify-install has no dry run",
        f"  fix: make verify-install BUNDLE={BUNDLE}",
    ]


# --- make variables that are not the Makefile's ---------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("DRYRUN=1", "DRY_RUN"), ("dry_run=1", "DRY_RUN"), ("BUNDEL=v6e-2.9", "BUNDLE"),
     ("JBOS=4", "JOBS"), ("ENGNIE=podman", "ENGINE"), ("KEEP_RECORD=1", "KEEP_RECORDED")],
)  # fmt: skip
def test_make_reports_a_variable_that_looks_like_a_typo(
    typo: str, meant: str, tmp_path: Path
) -> None:
    result = run_make("wheels", f"BUNDLE={BUNDLE}", typo, tmp_path=tmp_path)
    assert_refused_before_anything(result, tmp_path)
    name, value = typo.split("=")
    lines = error_lines(result)
    assert lines[0] == (
        f"error: make variable {name} is not read by any target of this Makefile "
        f"(did you mean {meant}?)"
    )
    assert lines[1].startswith("  fix: make wheels ") and f"{meant}={value}" in lines[1]
    assert f"{name}=" not in lines[1]


def test_make_reports_an_unknown_variable_without_a_guess(tmp_path: Path) -> None:
    result = run_make("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1", "FROBNICATE=1", tmp_path=tmp_path)
    assert_refused_before_anything(result, tmp_path)
    assert "error: make variable FROBNICATE is not read by any target" in result.stderr
    assert "FROBNICATE" not in result.stderr.split("fix:")[1]


def test_every_variable_a_target_reads_is_in_the_makefiles_one_table(tmp_path: Path) -> None:
    # All the documented variables together are accepted (the refusal can fail only for
    # a variable missing from MAKE_VARIABLES).
    result = run_make(
        "wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1", "ENGINE=podman", "BUILD_MODE=container",
        "JOBS=2", "BUILDER_IMAGE=x", "HOST_PYTHON=python3", "KEEP_RECORDED=0", "MIRROR=",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output


# --- numbers and choices through make and the CLI ------------------------------------


@pytest.mark.parametrize(
    ("target", "setting", "reason"),
    [
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "JOBS=1e9", "is not a whole number"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "JOBS=99999", "is out of range"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "JOBS=-2", "is out of range"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "ENGINE=nonsense", "invalid choice"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "BUILD_MODE=weird", "invalid choice"),
        (("bench-restart",), "ROUNDS=0", "is out of range"),
        (("bench-restart",), "ROUNDS=1e9", "is not a whole number"),
        (("gate",), "WORKLOAD=huge", "is not a workload"),
        (("doctor", f"BUNDLE={BUNDLE}"), "ROLE=boss", "invalid choice"),
    ],
)
def test_make_names_the_variable_of_a_refused_value(
    target: tuple[str, ...], setting: str, reason: str, tmp_path: Path
) -> None:
    result = run_make(*target, setting, tmp_path=tmp_path)
    assert_refused_before_anything(result, tmp_path)
    variable, value = setting.split("=")
    lines = error_lines(result)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"error: {variable}: {value!r} {reason}") or lines[0].startswith(
        f"error: {variable}: {reason}: {value!r}"
    ), lines
    assert "--" not in lines[0]
    assert lines[1].startswith(f"  fix: make {target[0]}") and f"{variable}=" in lines[1]
    assert f"{setting} " not in lines[1] + " "


@pytest.mark.parametrize(
    "argv",
    [
        ("wheels", "--jobs", "1e9"),
        ("wheels", "--jobs", "0"),
        ("wheels", "--progress-interval", "nan"),
        ("wheels", "--progress-interval", "inf"),
        ("wheels", "--progress-interval", "-1"),
        ("wheels", "--min-disk-gib", "inf"),
        ("gate", "--child-timeout", "-5"),
        ("gate", "--warm-runs", "1"),
        ("gate", "--max-warm-ratio", "nan"),
        ("gate", "--baseline-tolerance", "-0.5"),
        ("bench-restart", "--rounds", "1000000"),
    ],
)
def test_the_cli_refuses_a_number_naming_its_flag(argv: tuple[str, ...], tmp_path: Path) -> None:
    result = run_cli(
        *argv,
        env={"XLA_WHEELS_OUT": str(tmp_path / "out"), "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
    )
    assert_refused_before_anything(result, tmp_path)
    assert result.stderr.startswith(f"error: {argv[1]}: {argv[2]!r} "), result.stderr
    assert f"  fix: pass {argv[1]} " in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [("XLA_WHEELS_JOBS", "1e9"), ("XLA_WHEELS_JOBS", "-1"),
     ("XLA_WHEELS_PROGRESS_INTERVAL", "inf"), ("XLA_WHEELS_PROGRESS_INTERVAL", "-3")],
)  # fmt: skip
def test_the_environment_refuses_a_number_naming_its_variable(
    variable: str, value: str, tmp_path: Path
) -> None:
    result = run_cli(
        "sources", "--bundle", BUNDLE, "--dry-run", root=REPO_ROOT,
        env={variable: value, "XLA_WHEELS_OUT": str(tmp_path / "out"),
             "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert_refused_before_anything(result, tmp_path)
    assert f"error: {variable}={value!r} " in result.stderr
    assert f"fix: set {variable}=" in result.stderr


@pytest.mark.parametrize(
    "argv", [("wheels", "--no-such-flag"), ("diff", "a", "b", "c"), ("frobnicate",), ()]
)
def test_argparse_mistakes_are_our_error_and_fix(argv: tuple[str, ...]) -> None:
    result = run_cli(*argv)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and "\n  fix: " in result.stderr
    assert "usage:" not in result.output and "Traceback" not in result.output


# --- every make target: the same make-variable check ----------------------------------

MAKE_TARGETS = read_makefile(makefile_text()).targets
#: The one target that runs Python without the check: it creates the interpreter the
#: check runs in.
UNCHECKED = {"venv"}
CHECKED_TARGETS = [t for t in MAKE_TARGETS if t.runs_python and t.name not in UNCHECKED]


def _checkout_links(directory: Path) -> Path:
    """A directory that is the checkout for make (its Makefile, .venv and sources, as
    links): whatever a target would do if it ran anyway lands here, not in the checkout."""
    directory.mkdir()
    for name in ("Makefile", ".venv", "src", "host", "requirements-dev.txt", "pyproject.toml"):
        (directory / name).symlink_to(REPO_ROOT / name)
    return directory


def _make_in(directory: Path, *argv: str, env: dict[str, str] | None = None) -> CliResult:
    """``make ARGV`` in ``directory``, ended (with everything it started) after a minute:
    a target that runs for real instead of refusing fails the test, and stops."""
    process = subprocess.Popen(
        ["make", "--no-print-directory", *argv], cwd=directory, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        env={"PATH": os.environ["PATH"], "HOME": str(directory / "home"),
             "XLA_WHEELS_CACHE": str(directory / "cache"), "PYTEST_ADDOPTS": "--collect-only",
             **(env or {})},
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"make {' '.join(argv)} ran instead of refusing: {stdout}{stderr}")
    return CliResult(process.returncode, stdout, stderr)


def _misspelt(name: str) -> str:
    return name.replace("_", "") if "_" in name else name.lower()


def test_every_target_that_runs_python_is_checked() -> None:
    assert {t.name for t in CHECKED_TARGETS} >= {"demo", "test", "lint", "clean", "wheels"}
    assert {t.name for t in MAKE_TARGETS if not t.runs_python} == {"help", "cache-tools"}


@pytest.mark.parametrize("target", CHECKED_TARGETS, ids=lambda t: t.name)
def test_every_make_target_refuses_a_misspelt_variable(target: Target, tmp_path: Path) -> None:
    # DEMODIR=x once ran the demo in out/demo: `make demo` skipped the check.
    meant = target.variables[0] if target.variables else "DRY_RUN"
    checkout = _checkout_links(tmp_path / "checkout")
    result = _make_in(checkout, target.name, f"{_misspelt(meant)}=x")
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert lines[0] == (
        f"error: make variable {_misspelt(meant)} is not read by any target of this Makefile "
        f"(did you mean {meant}?)"
    ), lines
    assert lines[1] == f"  fix: make {target.name} {meant}=x", lines
    assert sorted(p.name for p in checkout.iterdir()) == sorted(
        [".venv", "Makefile", "host", "pyproject.toml", "requirements-dev.txt", "src"]
    )


@pytest.mark.parametrize(
    "target",
    [t for t in CHECKED_TARGETS if "DRY_RUN" not in t.variables or t.name in ("demo",)],
    ids=lambda t: t.name,
)
def test_make_dry_run_on_every_target_without_a_dry_run_is_refused(
    target: Target, tmp_path: Path
) -> None:
    # `make clean DRY_RUN=1` deleted out/, `make attest DRY_RUN=1` signed, `make demo
    # DRY_RUN=1` replaced the demo directory: make passed DRY_RUN to no command.
    checkout = _checkout_links(tmp_path / "checkout")
    (checkout / "out").mkdir()
    result = _make_in(checkout, target.name, "DRY_RUN=1")
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert lines[0].startswith("error: DRY_RUN: ") and lines[0].endswith("has no dry run"), lines
    assert lines[1] == f"  fix: make {target.name}", lines
    assert (checkout / "out").is_dir()
    assert _make_in(checkout, target.name, "DRY_RUN=maybe").stderr.startswith(
        "error: DRY_RUN: 'maybe' is not a switch value"
    )
    # The environment's dry run too: refused, never run for real.
    by_environment = _make_in(checkout, target.name, env={"XLA_WHEELS_DRY_RUN": "1"})
    assert by_environment.exit_code == 2, by_environment.output
    assert "has no dry run, and XLA_WHEELS_DRY_RUN is set" in by_environment.stderr
    assert (checkout / "out").is_dir()


# --- numbers are ASCII digits ---------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "variable", "value"),
    [
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "NET_TIMEOUT", "1_0"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "NET_TIMEOUT", "\u0668"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "JOBS", "\u0668"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "JOBS", "1_0"),
        (("bench-restart",), "ROUNDS", "\u0668"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "BUILD_TAG", "\u0668"),
        (("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1"), "SOURCE_DATE_EPOCH", "1_700_000_000"),
    ],
)
def test_a_number_in_other_digits_or_with_underscores_is_refused(
    argv: tuple[str, ...], variable: str, value: str, tmp_path: Path
) -> None:
    # Python's int and float read them, and the plan showed the default instead.
    result = run_make(*argv, f"{variable}={value}", tmp_path=tmp_path)
    assert_refused_before_anything(result, tmp_path)
    assert "ASCII digits 0-9 only" in error_lines(result)[0], result.stderr


def test_the_environment_refuses_a_number_in_other_digits(tmp_path: Path) -> None:
    result = run_cli(
        "bundles", root=REPO_ROOT,
        env={"XLA_WHEELS_NET_TIMEOUT": "1_0", "XLA_WHEELS_OUT": str(tmp_path / "out")},
    )  # fmt: skip
    assert result.exit_code == 2 and "ASCII digits 0-9 only" in result.stderr, result.output


@pytest.mark.parametrize("setting", ["JOBS=1e9", "JOBS=0"])
def test_a_refused_jobs_value_gets_a_fix_that_fits_this_machine(
    setting: str, tmp_path: Path
) -> None:
    # The fix once proposed JOBS=8 on a 2-core machine.
    result = run_make("wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1", setting, tmp_path=tmp_path)
    assert_refused_before_anything(result, tmp_path)
    (proposed,) = re.findall(r"JOBS=([0-9]+)", error_lines(result)[1])
    assert 1 <= int(proposed) <= (os.cpu_count() or 1)
    total = mem_total_gib()
    config = BuildConfig()
    if total is not None and total >= config.mem_base_gib + config.mem_per_job_gib:
        assert config.mem_base_gib + int(proposed) * config.mem_per_job_gib <= total
    # And it is a fix that works: the same command with it passes the check.
    fixed = run_make(
        "wheels", f"BUNDLE={BUNDLE}", "DRY_RUN=1", f"JOBS={proposed}", tmp_path=tmp_path
    )
    assert fixed.exit_code == 0, fixed.output
