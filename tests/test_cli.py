"""The command line and the Makefile over it, run as a user runs them."""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess

import pytest

from tests.gitrepos import REPO_ROOT, make_project
from xla_wheels.bundle import load_bundle
from xla_wheels.cli import COMMANDS, build_parser

SUBCOMMANDS = list(COMMANDS)


def test_python_dash_m_shows_help(run_cli) -> None:
    result = run_cli("--help")
    assert result.exit_code == 0
    # The table, not an empty list, drives these tests: the parser's commands are its
    # rows, and --help shows each with its line.
    assert SUBCOMMANDS and _parser_commands() == SUBCOMMANDS
    for name, (_, line) in COMMANDS.items():
        shown = rf"^ +{re.escape(name)}\s+{re.escape(line.split()[0])} "
        assert re.search(shown, result.stdout, re.MULTILINE), (name, line)


def _parser_commands() -> list[str]:
    """The commands the parser takes, in its order (argparse's choices of COMMAND)."""
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(subparsers.choices)


def test_dry_run_plan_shows_full_shas_commands_and_patch_digests(run_cli) -> None:
    result = run_cli("wheels", "--bundle", "v6e-2.9", env={"XLA_WHEELS_DRY_RUN": "1"})
    assert result.exit_code == 0, result.stderr
    plan = result.stdout
    assert "21fec65781bebe867faf209f89bb687ffd236ca4" in plan
    assert "c04e61c3424142c0eebcc9e59984b9d8fced18c0" in plan
    assert "git apply" in plan
    # Each patch's own digest stands next to its path (the manifest's digest, elsewhere in
    # the plan, must not be mistaken for it).
    patches = load_bundle(REPO_ROOT, "v6e-2.9").component("torch_xla").patches
    assert patches
    for patch in patches:
        digest = hashlib.sha256(patch.path.read_bytes()).hexdigest()  # not the code's digest
        lines = [
            line
            for line in plan.splitlines()
            if "git apply" in line and f"patches/{patch.relpath}" in line
        ]
        assert lines and all(f"sha256:{digest}" in line for line in lines), (patch, lines)
    for stage in ("resolve", "sources", "patches", "build"):
        assert f"] {stage}" in plan


def test_unknown_bundle_is_exit_2_with_the_valid_names(run_cli) -> None:
    result = run_cli("wheels", "--bundle", "nope")
    assert result.exit_code == 2
    assert "unknown bundle 'nope'" in result.stderr and "v6e-2.9" in result.stderr
    assert "Traceback" not in result.stderr


def test_bundles_lists_each_bundle_with_its_pins(run_cli) -> None:
    result = run_cli("bundles")
    assert result.exit_code == 0, result.stderr
    assert "v6e-2.9:" in result.stdout and "v6e-2.11:" in result.stdout
    assert "openxla   9a9aa0e11e4fcda8d6a9c3267dca6776ddbdb0ca" in result.stdout


def test_a_bundle_with_an_unpinned_component_is_refused(tmp_path, upstreams, run_cli) -> None:
    project = make_project(tmp_path, upstreams)
    manifest = project / "build/bundles/test-1.toml"
    openxla = upstreams["openxla"].commits[-1]
    text = manifest.read_text().replace(f'commit = "{openxla}"', 'unpinned = "not known yet"')
    manifest.write_text(text)
    result = run_cli("sources", "--bundle", "test-1", root=project)
    assert result.exit_code == 1, result.stderr  # a blocked stage: FAILED
    assert "openxla: no commit pinned (not known yet)" in result.stderr


def test_make_patch_runs_sources_and_patches_on_a_local_upstream(
    tmp_path, upstreams, run_cli
) -> None:
    project = make_project(tmp_path, upstreams)
    result = run_cli("patch", "--bundle", "test-1", root=project)
    assert result.exit_code == 0, result.stderr
    assert "<== patches: torch_xla (0 file(s)): done in" in result.stderr
    assert (project / "out/test-1/src/torch_xla/src/runtime.cc").is_file()
    assert (project / "wheels.lock").is_file()  # written once the series applied


def test_make_help_lists_the_targets() -> None:
    result = subprocess.run(
        ["make", "-s", "help"], cwd=REPO_ROOT, text=True, capture_output=True, check=False
    )
    assert result.returncode == 0
    for target in ("wheels", "test", "bundles", "sources", "patch", "lock", "lock-check"):
        assert f"make {target} " in result.stdout


def test_a_malformed_compiler_environment_is_a_usage_error(run_cli) -> None:
    result = run_cli("wheels", "--bundle", "v6e-2.9", "--compiler-env", "CC=clang CXX")
    assert result.exit_code == 2
    assert "--compiler-env / XLA_WHEELS_COMPILER_ENV: 'CC=clang CXX'" in result.stderr
    assert "has 'CXX', which is not NAME=VALUE" in result.stderr


@pytest.mark.parametrize("engine", ["podman", "buildah"])
def test_builder_image_keeps_the_dockerfile_shell_on_oci_engines(run_cli, engine: str) -> None:
    # Without --format docker, podman/buildah drop SHELL (bash -o pipefail) from the build.
    result = run_cli("builder-image", env={"XLA_WHEELS_DRY_RUN": "1", "XLA_WHEELS_ENGINE": engine})
    assert result.exit_code == 0, result.stderr
    assert "--format docker --target builder" in result.stdout
