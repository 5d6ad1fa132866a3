"""Build stage end to end on the synthetic upstream, BUILD_MODE=host.

Real git repositories, real setuptools wheels, the real CLI. The synthetic upstream is
test data (tests/synthetic_upstream.py); the real compile runs only on a builder.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.gitrepos import git
from tests.synthetic_upstream import (
    Synthetic,
    bazelrc_words,
    cli_args,
    copy_synthetic,
    make_patch,
)
from xla_host.filemode import file_sha256
from xla_host.provenance import PROVENANCE_PATH
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels import wheel_stamp
from xla_wheels.bundle import load_bundle
from xla_wheels.patches import describe_series, series_digest

REPO = Path(__file__).resolve().parents[1]
HOST = ("--mode", "host", "--host-python", sys.executable)


def run_wheels(syn: Synthetic, *extra: str, bundle: str = "syn") -> CliResult:
    return run_cli(
        *cli_args(syn, *HOST, *extra, bundle=bundle), env={"HOME": str(syn.root.parent)},
        timeout=600,
    )  # fmt: skip


def dist_wheels(syn: Synthetic, bundle: str = "syn") -> list[Path]:
    return sorted((syn.root / "dist" / bundle).glob("*.whl"))


@pytest.mark.slow
def test_patched_build_is_stamped_and_carries_provenance(syn: Synthetic) -> None:
    result = run_wheels(syn)
    assert result.exit_code == 0, result.stderr
    wheels = dist_wheels(syn)
    assert [parse_wheel_name(w.name).project for w in wheels] == ["torch", "torch_xla"]
    bundle = load_bundle(syn.root, "syn")
    xla_series = series_digest(describe_series(bundle.component("torch_xla")))
    openxla_series = series_digest(describe_series(bundle.component("openxla")))
    digest = wheel_stamp.patch_digest(
        [xla_series, f"openxla:{syn.commits['openxla']}", openxla_series]
    )
    expected = f"2.9.0+git{syn.commits['torch_xla'][:7]}.p{digest}"
    assert wheels[1].name == f"torch_xla-{expected}-py3-none-any.whl"
    # torch is unpatched: upstream's own label, no ".p".
    assert wheels[0].name == f"torch-2.9.0a0+git{syn.commits['torch'][:7]}-py3-none-any.whl"

    provenance = wheel_stamp.read_provenance(wheels[1])
    # The wheel's identity is its inputs: no bundle name, no manifest digest, no remote.
    stored = json.loads(zipfile.ZipFile(wheels[1]).read(PROVENANCE_PATH))
    assert "bundle" not in stored and "manifest_sha256" not in stored
    assert all("remote" not in c for c in stored["components"].values())
    assert provenance.torch_xla_version == expected
    for name in ("torch", "torch_xla", "openxla"):
        assert provenance.components[name].commit == syn.commits[name]
    patches = provenance.components["torch_xla"].patches
    assert [p.path for p in patches] == [
        "patches/torch_xla/0001-load-cache.patch",
        "patches/torch_xla/0002-comment.patch",
    ]
    assert patches[0].sha256 == file_sha256(syn.root / patches[0].path)
    assert provenance.torch_xla_openxla_patches[0].path == "openxla_patches/no_fortify.diff"
    assert provenance.toolchain["bazel"] == "7.4.1"
    with zipfile.ZipFile(wheels[1]) as archive:
        record = archive.read(f"torch_xla-{expected}.dist-info/RECORD").decode()
        assert "torch_xla/_xla_wheels_provenance.json,sha256=" in record
        # What setup.py saw: OpenXLA with torch_xla's openxla_patches/ applied.
        version_py = archive.read("torch_xla/version.py").decode()
        assert "TORCH_XLA_OPENXLA_PATCH" in version_py
        # ... and, through `git rev-parse HEAD` in the copied tree, the revision: the last
        # commit of the patch series, not the pin (it is XLA_GITREV in the real build).
        patched = git(syn.root / "out" / "syn" / "src" / "torch_xla", "rev-parse", "HEAD")
        assert patched != syn.commits["torch_xla"]
        assert f"__xla_gitrev__ = {patched!r}" in version_py
        # torch's revision as upstream's setup.py reads it (only from a ../.git
        # directory): TORCH_GITREV, part of torch_xla's compilation-cache key. Our torch
        # tree is a git worktree (.git is a file): without the recipe's help it is ''.
        assert f"__torch_gitrev__ = {syn.commits['torch']!r}" in version_py
    # ... and the worktree's .git is the gitdir file again after the build.
    assert (syn.root / "out" / "syn" / "src" / "torch" / ".git").is_file()
    # The recipe's own output reached the terminal, inside the build's section.
    section = result.stderr.split("==> build: torch_xla", 1)[1].split("<== build: torch_xla")[0]
    assert f"synthetic torch_xla: PyTorch Commit ID: {syn.commits['torch']}" in section

    # The synthetic torch_xla has no _XLAC: the ABI check says so instead of passing.
    assert f"abi check: not applicable: no _XLAC extension in {wheels[1].name}" in result.stderr
    # The ship check read the provenance at runtime from the installed package.
    ship_log = (syn.root / "out" / "syn" / "logs" / "ship.log").read_text()
    assert "provenance torch_xla" in ship_log
    # Logs per stage, every command printed before it ran.
    torch_log = (syn.root / "out" / "syn" / "logs" / "torch.log").read_text()
    assert "+ cd " in torch_log and "PYTORCH_BUILD_VERSION=2.9.0a0+git" in torch_log
    # sources, patches and collect keep their commands and git's output in a log each.
    logs = syn.root / "out" / "syn" / "logs"
    assert (
        f"worktree add --detach --force -- {logs.parent / 'src' / 'torch'}"
        in (logs / "sources.log").read_text()
    )
    assert "git apply --index" in (logs / "patches.log").read_text()
    assert "--recipe ship" in (logs / "collect.log").read_text()
    # Every stage is in the timings table, in run order.
    assert timings_table(result.stderr) == [
        ("preflight", "ran"),
        ("sources", "ran"),
        ("patches", "ran"),
        ("build: torch", "ran"),
        ("build: torch_xla", "ran"),
        ("collect: ship check", "ran"),
        ("collect: wheels.lock", "ran"),
    ]
    lock = tomllib.loads((syn.root / "wheels.lock").read_text())
    recorded = {w["name"]: w["sha256"] for w in lock["bundles"]["syn"]["wheels"]}
    assert recorded == {w.name: file_sha256(w) for w in wheels}


def timings_table(stderr: str) -> list[tuple[str, str]]:
    """(stage, status) rows of the table printed at the end of a run."""
    table = stderr.rsplit("stage timings:\n", 1)[1].splitlines()
    rows = [re.fullmatch(r"  (.+?) +\S+  (ran|cached|failed|up to date)", line) for line in table]
    return [(row.group(1), row.group(2)) for row in rows if row]


@pytest.mark.slow
def test_noop_rerun_skips_and_a_patch_change_rebuilds_only_torch_xla(syn: Synthetic) -> None:
    assert run_wheels(syn).exit_code == 0
    first = dist_wheels(syn)
    written = [wheel.stat().st_mtime_ns for wheel in first]

    again = run_wheels(syn)
    assert again.exit_code == 0, again.stderr
    # Nothing ran again but the preflight: every stage says so, and no wheel was written.
    assert "sources, patches: skipped" in again.stderr
    assert "build: torch stage cached" in again.stderr
    assert "build: torch_xla stage cached" in again.stderr
    assert timings_table(again.stderr) == [
        ("preflight", "ran"),
        ("sources", "cached"),
        ("patches", "cached"),
        ("build: torch", "cached"),
        ("build: torch_xla", "cached"),
        ("collect", "up to date"),
    ]
    assert dist_wheels(syn) == first
    assert [wheel.stat().st_mtime_ns for wheel in first] == written

    # Change the second torch_xla patch (same file, different bytes).
    patch = syn.root / "patches" / "torch_xla" / "0002-comment.patch"
    patch.write_text(patch.read_text().replace("+# patched", "+# patched again"))
    changed = run_wheels(syn)
    assert changed.exit_code == 0, changed.stderr
    assert "build: torch stage cached" in changed.stderr
    assert "==> build: torch_xla" in changed.stderr
    now = dist_wheels(syn)
    assert now[0].name == first[0].name and file_sha256(now[0]) == file_sha256(first[0])
    assert now[1].name != first[1].name  # new patch digest, new label


@pytest.mark.slow
def test_failing_ship_check_keeps_wheels_out_of_dist(syn: Synthetic) -> None:
    # Without the cache-load fix the synthetic warm-restart check fails.
    syn.write_bundle("unfixed", xla_patches=("torch_xla/0002-comment.patch",))
    result = run_wheels(syn, bundle="unfixed")
    assert result.exit_code == 1, result.stderr
    assert "ship check failed" in result.stderr
    assert "kept out of dist/unfixed" in result.stderr
    assert not (syn.root / "dist").exists()
    # The wheels were built (and cached); only the ship gate stopped them.
    assert list((syn.cache / "stages").glob("torch_xla-*/torch_xla-*.whl"))


@pytest.mark.slow
def test_failed_build_leaves_previous_dist_untouched(syn: Synthetic) -> None:
    assert run_wheels(syn).exit_code == 0
    before = {w.name: file_sha256(w) for w in dist_wheels(syn)}
    # A third torch_xla patch whose setup.py fails: torch is cached, torch_xla breaks.
    bad_setup = "raise SystemExit('synthetic build failure')\n"
    failing = syn.root / "patches" / "torch_xla" / "0003-break.patch"
    make_patch(
        syn.upstream / "xla",
        syn.commits["torch_xla"],
        "torch_xla",
        "break the build",
        {"setup.py": bad_setup},
        failing,
    )
    syn.write_bundle(
        "syn",
        xla_patches=(
            "torch_xla/0001-load-cache.patch",
            "torch_xla/0002-comment.patch",
            "torch_xla/0003-break.patch",
        ),
    )
    result = run_wheels(syn)
    assert result.exit_code == 1
    assert "the torch_xla build failed" in result.stderr
    log_path = syn.root / "out/syn/logs/torch_xla.log"
    assert "synthetic build failure" in log_path.read_text()
    # The terminal shows the log's tail and where the log is, and the failed stage's time.
    tail = result.stderr.split(f" lines of {log_path} ---", 1)[1]
    assert "synthetic build failure" in tail
    assert timings_table(result.stderr)[-2:] == [
        ("build: torch", "cached"),
        ("build: torch_xla", "failed"),
    ]
    after = {w.name: file_sha256(w) for w in dist_wheels(syn)}
    assert after == before
    assert [p.name for p in (syn.root / "dist").iterdir()] == ["syn"]


@pytest.mark.slow
def test_short_openxla_sha_resolves_through_sources(syn: Synthetic) -> None:
    syn.write_bundle("short", openxla_commit=syn.commits["openxla"][:9])
    result = run_wheels(syn, bundle="short")
    assert result.exit_code == 0, result.stderr
    provenance = wheel_stamp.read_provenance(dist_wheels(syn, "short")[1])
    assert provenance.components["openxla"].commit == syn.commits["openxla"]


def test_preflight_reports_every_blocker_at_once(syn: Synthetic, tmp_path: Path) -> None:
    text = syn.bundle_path().read_text()
    text = text.replace(f'commit = "{syn.commits["openxla"]}"', 'unpinned = "not known yet"')
    text = text.replace(str(syn.upstream / "torch"), str(tmp_path / "gone" / "torch.git"))
    (syn.root / "build" / "bundles" / "blocked.toml").write_text(
        text.replace('name = "syn"', 'name = "blocked"')
    )
    result = run_cli(
        *cli_args(syn, bundle="blocked"),
        "--mode", "host", "--host-python", "python-that-does-not-exist",
        "--min-disk-gib", "100000", "--mem-per-job-gib", "100000", "--jobs", "3",
        inherit_env=True, timeout=120,
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr  # preflight blockers: FAILED
    err = result.stderr
    assert "5 blocker(s)" in err, err
    assert "pin: openxla: no commit pinned (not known yet)" in err
    assert "torch: commit" in err and "unreachable" in err and "MIRROR" in err
    assert "`python-that-does-not-exist` is not on PATH" in err
    assert "disk:" in err and "memory:" in err and "JOBS=3" in err
    # A fix make can pass (no --out-dir), and every command a fix names is whole: the
    # bundle and the settings of this run, with the one change (JOBS that fit).
    assert "XLA_WHEELS_OUT=<dir on a bigger disk> make wheels BUNDLE=blocked" in err
    commands = re.findall(r"`([^`]*make wheels[^`]*)`", err)
    assert len(commands) >= 3, err
    for command in commands:
        assert "make wheels BUNDLE=blocked " in command, command
        assert "BUILD_MODE=host HOST_PYTHON=python-that-does-not-exist" in command, command
    assert "fix: fix each blocker above, then run `make wheels BUNDLE=blocked" in err
    # Blockers are reported before anything is written: no work directory, no run lock.
    assert not (syn.root / "dist").exists()
    assert not (syn.root / "out").exists(), sorted((syn.root / "out").rglob("*"))


def test_dry_run_shows_the_builder_commands_for_v6e_2_9() -> None:
    result = run_cli(
        "wheels", "--bundle", "v6e-2.9", "--dry-run", "--engine", "docker", root=REPO,
        inherit_env=True, timeout=120,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    plan = result.stdout
    for expected in (
        "21fec65781bebe867faf209f89bb687ffd236ca4",
        "c04e61c3424142c0eebcc9e59984b9d8fced18c0",
        "docker build --target builder",
        "docker run --detach",
        "docker exec",
        "python3 -m xla_wheels.builder.run_recipe",
        "USE_CUDA=0",
        "PYTORCH_BUILD_VERSION=2.9.0a0+git21fec65",
        "setup.py bdist_wheel",
        "TORCH_XLA_VERSION=2.9.0+gitc04e61c.p",
        "GIT_VERSIONED_XLA_BUILD=0",
        # The OpenXLA that --override_repository builds, named in torch_xla's cache key.
        "TORCH_XLA_OPENXLA_REVISION=9a9aa0e11e4fcda8d6a9c3267dca6776ddbdb0ca",
        "--override_repository=xla=",
        "BAZEL_DISK_CACHE_PATH=",
        "-m xla_host gate --python",
        # The ship check: every CPU cache check, and upstream's test from the tree it built.
        "--checks restart,spmd-restart,cache-key,same-numbers --upstream-tests ",
        "/src/torch/xla --out ",
        "sha256:",
    ):
        assert expected in plan, expected
    assert "NOT AVAILABLE" not in plan


@pytest.mark.slow
def test_torch_xla_records_the_patched_torch_commit(syn: Synthetic) -> None:
    # Two bundles with the same torch_xla but a different torch must not share torch_xla's
    # compilation-cache keys: the key hashes TORCH_GITREV, which must be torch's commit as
    # built, here the last commit of torch's patch series.
    make_patch(
        syn.upstream / "torch",
        syn.commits["torch"],
        "torch",
        "a local torch fix",
        {"torch/__init__.py": (syn.upstream / "torch/torch/__init__.py").read_text() + "# fix\n"},
        syn.root / "patches" / "torch" / "0001-fix.patch",
    )
    syn.write_bundle("patched-torch", torch_patches=("torch/0001-fix.patch",))
    result = run_wheels(syn, bundle="patched-torch")
    assert result.exit_code == 0, result.stderr
    torch_head = git(syn.root / "out" / "patched-torch" / "src" / "torch", "rev-parse", "HEAD")
    assert torch_head != syn.commits["torch"]
    torch_xla = dist_wheels(syn, "patched-torch")[1]
    with zipfile.ZipFile(torch_xla) as archive:
        version_py = archive.read("torch_xla/version.py").decode()
    assert f"__torch_gitrev__ = {torch_head!r}" in version_py


@pytest.mark.slow
def test_a_project_under_a_path_with_a_space_and_an_accent_builds(
    synthetic_template: Synthetic, tmp_path: Path
) -> None:
    # Every path of the run (upstream remotes, project, cache, out/) is under "some dir é":
    # each reaches git as an operand, and .bazelrc.user as a quoted rc word, which the
    # synthetic torch_xla reads back word by word as Bazel does (bazelrc_words).
    syn = copy_synthetic(synthetic_template, tmp_path / "some dir é")
    result = run_wheels(syn)
    assert result.exit_code == 0, result.stderr
    assert [parse_wheel_name(w.name).project for w in dist_wheels(syn)] == ["torch", "torch_xla"]
    rc = (syn.root / "out" / "syn" / "src" / "torch" / "xla" / ".bazelrc.user").read_text()
    openxla = str(syn.root / "out" / "syn" / "src" / "openxla")
    words = [bazelrc_words(line) for line in rc.splitlines()]
    assert ["build", f"--override_repository=xla={openxla}"] in words
    assert f'--override_repository=xla="{openxla}"' in rc  # quoted, as the path needs
