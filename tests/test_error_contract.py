"""One contract for errors: every file the user edits or keeps in the checkout is bad input
when it is malformed (exit 2, ``error:`` naming the file in the user's terms, ``fix:``),
whichever file it is and whichever subcommand reads it; a lock that is well formed but no
longer matches the manifests is stale, a failed check (exit 1).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult, run_cli

BUNDLE = "v6e-2.9"


def project_copy(tmp_path: Path) -> Path:
    """The checkout's inputs (manifests, patches, lock, lanes, scripts) in ``tmp_path``."""
    root = tmp_path / "project"
    for name in ("build", "patches", "scripts"):
        shutil.copytree(REPO_ROOT / name, root / name)
    shutil.copy2(REPO_ROOT / "wheels.lock", root / "wheels.lock")
    return root


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli(
        *args,
        root=root,
        env={"XLA_WHEELS_OUT": str(root / "out"), "HOME": str(root), **(env or {})},
    )


def assert_bad_input(result: CliResult, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "usage:" not in result.output
    error = next(line for line in result.stderr.splitlines() if line.startswith("error: "))
    for word in words:
        assert word in error, result.stderr
    assert "  fix: " in result.stderr, result.stderr


# --- damaged files, each read by the subcommands that read it -----------------------


def _truncate(path: Path) -> None:
    # Cut inside a quoted value, as a full disk or an interrupted copy leaves a file.
    # Inside a value (`key = "...`) of a line that is not a comment: a cut in a comment
    # would leave valid TOML.
    raw = path.read_bytes()
    offset = 0
    for line in raw.splitlines(keepends=True):
        quote = line.find(b'= "')
        if offset >= len(raw) // 3 and quote >= 0 and not line.lstrip().startswith(b"#"):
            path.write_bytes(raw[: offset + quote + 5])
            return
        offset += len(line)
    raise AssertionError(f"{path} has no quoted value after its first third to cut inside")


def _not_utf8(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"\n", b"\n# \xff\xfe\n", 1))


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _wrong_type(path: Path) -> None:
    # A key of the right name with a value of the wrong type.
    text = path.read_text()
    path.write_text(text.replace('sha256 = "', "sha256 = 1 # ", 1))


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, "not valid TOML"),
    "not UTF-8": (_not_utf8, "not UTF-8"),
    "a directory": (_directory, "is a directory"),
    "wrong type": (_wrong_type, "expected str"),
}

LOCK_READERS = [
    ("lock-check",),
    ("lock", "--bundle", BUNDLE),
    ("doctor", "--bundle", BUNDLE),
    ("wheels", "--bundle", BUNDLE),
]


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("command", LOCK_READERS, ids=lambda c: c[0])
def test_a_damaged_wheels_lock_is_bad_input_for_every_reader(
    tmp_path: Path, damage: str, command: tuple[str, ...]
) -> None:
    root = project_copy(tmp_path)
    change, words = DAMAGES[damage]
    change(root / "wheels.lock")
    result = cli(root, *command)
    assert_bad_input(result, "wheels.lock", words)
    assert not (root / "out").exists(), "bad input must leave no trace"


def test_a_wheels_lock_of_another_version_is_bad_input(tmp_path: Path) -> None:
    root = project_copy(tmp_path)
    lock = root / "wheels.lock"
    lock.write_text(lock.read_text().replace('lock-version = "', 'lock-version = "9', 1))
    assert_bad_input(cli(root, "lock-check"), "wheels.lock", "lock-version")


def test_a_stale_wheels_lock_is_a_failed_check_not_bad_input(tmp_path: Path) -> None:
    # Well formed, but a manifest changed since: `make lock` is the fix, exit 1.
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(manifest.read_text() + "\n# changed\n")
    result = cli(root, "lock-check")
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == "error: wheels.lock does not match the bundles:", result.stderr
    assert lines[1].startswith(f"  {BUNDLE}: manifest {BUNDLE}.toml changed (sha256 "), lines
    # The fix is the command to run, for that bundle, not a placeholder.
    assert lines[2] == f"  fix: review the change, then `make lock BUNDLE={BUNDLE}`", lines
    assert len(lines) == 3 and "Traceback" not in result.output


LANE_FILES = {
    "lanes.toml": ("build/lanes.toml", ("lanes",)),
    "lanes.lock": ("lanes.lock", ("lanes",)),
}


@pytest.mark.parametrize("damage", ["truncated", "not UTF-8", "a directory"])
@pytest.mark.parametrize("name", LANE_FILES)
def test_a_damaged_lanes_file_is_bad_input(tmp_path: Path, damage: str, name: str) -> None:
    root = project_copy(tmp_path)
    relpath, command = LANE_FILES[name]
    path = root / relpath
    if not path.exists():
        path.write_text('lanes-lock-version = "1"\n[lanes.validation]\nbundle = "v6e-2.9"\n')
    change, words = DAMAGES[damage]
    change(path)
    assert_bad_input(cli(root, *command), path.name, words)


@pytest.mark.parametrize("damage", ["not UTF-8", "a directory"])
def test_a_damaged_builders_file_is_bad_input(tmp_path: Path, damage: str) -> None:
    root = project_copy(tmp_path)
    path = root / "build" / "builders.toml"
    if not path.exists():
        path.write_text('[builder]\nrole = "reader"\n')
    change, words = DAMAGES[damage]
    change(path)
    result = cli(root, "wheels", "--bundle", BUNDLE, "--dry-run")
    assert_bad_input(result, "builders.toml", words)


def test_a_directory_named_like_a_manifest_is_named_as_a_directory(tmp_path: Path) -> None:
    root = project_copy(tmp_path)
    (root / "build" / "bundles" / "stray.toml").mkdir()
    assert_bad_input(cli(root, "bundles"), "stray.toml", "is a directory")


def test_an_undecodable_manifest_says_save_it_as_utf8(tmp_path: Path) -> None:
    root = project_copy(tmp_path)
    _not_utf8(root / "build" / "bundles" / f"{BUNDLE}.toml")
    result = cli(root, "lock", "--bundle", BUNDLE)
    assert_bad_input(result, f"{BUNDLE}.toml", "not UTF-8")
    assert "save the file as UTF-8" in result.stderr


# --- XLA_WHEELS_* names: one list, a typo is refused ---------------------------------


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("XLA_WHEELS_DRYRUN", "XLA_WHEELS_DRY_RUN"),
        ("XLA_WHEELS_dry_run", "XLA_WHEELS_DRY_RUN"),
        ("XLA_WHEELS_MIROR", "XLA_WHEELS_MIRROR"),
        ("XLA_WHEELS_KEEPRECORDED", "XLA_WHEELS_KEEP_RECORDED"),
        ("XLA_WHEELS_BUNDEL", None),
    ],
)
def test_an_unknown_xla_wheels_name_is_refused_before_anything_runs(
    tmp_path: Path, name: str, meant: str | None
) -> None:
    # A typo of XLA_WHEELS_DRY_RUN, ignored, would run for real.
    root = project_copy(tmp_path)
    result = cli(root, "lock", "--bundle", BUNDLE, env={name: "1"})
    assert_bad_input(result, name, "not a setting")
    if meant is not None:
        assert f"did you mean {meant}?" in result.stderr
        assert f"fix: rename it to {meant}" in result.stderr
    assert not (root / "out").exists()


def test_every_xla_wheels_name_the_code_reads_is_known() -> None:
    # The one list (ENV_SETTINGS and ENV_OTHER_NAMES) holds every name the code reads: a
    # name read but missing from it would be refused as a typo. (Tests spell typos.)
    import re

    from xla_wheels.options import known_environment

    used: set[str] = set()
    for folder in ("src", "scripts"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"XLA_WHEELS_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    families = {"XLA_WHEELS_BAZEL_REMOTE", "XLA_WHEELS_CCACHE_REMOTE", "XLA_WHEELS_NET"}  # "..._*"
    assert sorted(used - known_environment() - families) == []
