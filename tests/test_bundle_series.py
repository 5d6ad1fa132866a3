"""A bundle that extends another carries its parent's patch series and adds to it.

The team's path (docs/patches.md, "add one line"): a child of v6e-2.11 that lists one new
patch file has the parent's five patches and then its own, in that order, everywhere the
series is used (``make bundles``, ``make diff``, wheels.lock, ``patches-check``). A parent's
patch leaves the series only by name (``drop_patches``), and a series without the cache-key
patch is told so first, with the fix that puts it back, not sent to widen the key table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import real_source
from tests.gitrepos import REPO_ROOT
from xla_host.errors import ManifestError
from xla_wheels.bundle import load_bundle

SERIES = tuple(
    f"torch_xla/{path.name}" for path in sorted((REPO_ROOT / "patches/torch_xla").glob("*.patch"))
)
CACHE_KEY_PATCH = "torch_xla/0003-cache-key-covers-compile-options.patch"
TEAM_PATCH = "torch_xla/0006-team.patch"
TEAM = f"""\
[bundle]
name = "team"
extends = "v6e-2.11"
description = "v6e-2.11 and the team's fix"

[components.torch_xla]
patches = ["{TEAM_PATCH}"]
"""
ENV_VARS_H = "torch_xla/csrc/runtime/env_vars.h"


def team_patch(context: list[str], *, files: str = ENV_VARS_H) -> str:
    """A one-line patch of env_vars.h at c04e61c, with a valid header (``files`` its Files)."""
    header = (
        "Subject: Team: a note in env_vars.h\n"
        "Component: torch_xla\n"
        f"Base: {real_source.BASE}\n"
        "Fixes: nothing: a stand-in for a team's own fix\n"
        "Why: the path a team takes to add one patch to a shipped bundle\n"
        "Upstream: not upstreamed\n"
        f"Files: {files}\n\n"
    )
    first, *rest = context
    hunk = [
        f" {first}",
        "+// Team note: the series of a child bundle ends here.",
        *(f" {x}" for x in rest),
    ]
    return (
        header
        + f"diff --git a/{ENV_VARS_H} b/{ENV_VARS_H}\n--- a/{ENV_VARS_H}\n+++ b/{ENV_VARS_H}\n"
        + f"@@ -1,{len(context)} +1,{len(context) + 1} @@\n"
        + "\n".join(hunk)
        + "\n"
    )


def make_project(root: Path, patch_text: str = "diff --git a/x b/x\n") -> Path:
    """The project's torch_xla series and v6e-2.11, a team patch file and the team bundle."""
    shutil.copytree(REPO_ROOT / "patches" / "torch_xla", root / "patches" / "torch_xla")
    (root / "patches" / TEAM_PATCH).write_text(patch_text)
    bundles = root / "build" / "bundles"
    bundles.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "build" / "bundles" / "v6e-2.11.toml", bundles)
    (bundles / "team.toml").write_text(TEAM)
    return root


def write_team(project: Path, torch_xla_table: str) -> None:
    text = TEAM.split("[components.torch_xla]")[0] + "[components.torch_xla]\n" + torch_xla_table
    (project / "build" / "bundles" / "team.toml").write_text(text)


def test_a_child_listing_one_patch_carries_the_parents_five_then_its_own(
    tmp_path: Path, run_cli
) -> None:
    from xla_wheels.wheels_lock import inputs_entry

    project = make_project(tmp_path)
    series = load_bundle(project, "team").component("torch_xla").patches
    assert [patch.relpath for patch in series] == [*SERIES, TEAM_PATCH]
    assert [patch.bundle for patch in series] == ["v6e-2.11"] * len(SERIES) + ["team"]
    # What wheels.lock records is that series, in that order.
    locked = inputs_entry(load_bundle(project, "team"), {}, project).components["torch_xla"]
    assert [patch.path for patch in locked.patches] == [
        f"patches/{p}" for p in (*SERIES, TEAM_PATCH)
    ]

    shown = run_cli("bundles", root=project)
    assert shown.exit_code == 0, shown.stderr
    team_block = shown.stdout.split("team: ", 1)[1]
    assert f"+ patches/{SERIES[0]}  (from v6e-2.11)" in team_block
    assert f"+ patches/{TEAM_PATCH}  (from team)" in team_block

    diffed = run_cli("diff", "team", root=project)
    assert diffed.exit_code == 0, diffed.stderr
    lines = diffed.stdout.splitlines()
    assert (
        lines[1].split()
        == "torch_xla.patches 5 from v6e-2.11 -> 5 from v6e-2.11, 1 from team".split()
    )
    assert lines[2] == "torch_xla series of team (6 patch(es), in order):"
    assert lines[3:] == [
        *(f"  + patches/{patch}  (from v6e-2.11)" for patch in SERIES),
        f"  + patches/{TEAM_PATCH}  (from team)",
    ]


def test_a_parents_patch_leaves_the_series_only_by_name(tmp_path: Path, run_cli) -> None:
    project = make_project(tmp_path)
    write_team(project, f'drop_patches = ["{SERIES[4]}"]\npatches = ["{TEAM_PATCH}"]\n')
    component = load_bundle(project, "team").component("torch_xla")
    assert [patch.relpath for patch in component.patches] == [*SERIES[:4], TEAM_PATCH]
    assert component.dropped == ((SERIES[4], "team"),)
    shown = run_cli("bundles", root=project)
    assert f"- patches/{SERIES[4]}  (dropped by team)" in shown.stdout
    diffed = run_cli("diff", "team", root=project)
    assert f"  - patches/{SERIES[4]}  (dropped by team)" in diffed.stdout.splitlines()


def manifest_error(project: Path) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "team")
    assert caught.value.exit_code == 2 and caught.value.fix
    return caught.value


def test_dropping_a_patch_the_parent_does_not_carry_is_refused_naming_its_series(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path)
    write_team(project, 'drop_patches = ["torch_xla/0005-custom-call-hash.patch"]\n')
    error = manifest_error(project)
    assert "team.toml: key 'components.torch_xla.drop_patches'" in error.message
    assert (
        "patches/torch_xla/0005-custom-call-hash.patch is not in the torch_xla series of v6e-2.11"
        in error.message
    )
    assert f'"{SERIES[4]}"' in error.message  # what the parent does carry
    # The fix works: the name as the parent lists it.
    write_team(project, f'drop_patches = ["{SERIES[4]}"]\n')
    assert len(load_bundle(project, "team").component("torch_xla").patches) == 4


def test_listing_an_inherited_patch_again_is_refused_with_how_to_move_it(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    # What a user who read the old docs writes: the parent's list, copied, plus one line.
    write_team(project, "patches = [" + ", ".join(f'"{p}"' for p in (*SERIES, TEAM_PATCH)) + "]\n")
    error = manifest_error(project)
    assert (
        f"patches/{SERIES[0]} is already in the torch_xla series this bundle inherits from v6e-2.11"
        in error.message
    )
    assert "list only the patches this bundle adds" in (error.fix or "")
    # Moving one to the end names it in both lists.
    write_team(project, f'drop_patches = ["{SERIES[1]}"]\npatches = ["{SERIES[1]}"]\n')
    series = load_bundle(project, "team").component("torch_xla").patches
    assert [patch.relpath for patch in series] == [SERIES[0], *SERIES[2:], SERIES[1]]
    assert series[-1].bundle == "team"
    assert load_bundle(project, "team").component("torch_xla").dropped == ()  # moved, not gone


def test_drop_patches_in_a_bundle_that_extends_none_is_refused(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    parent = project / "build" / "bundles" / "v6e-2.11.toml"
    parent.write_text(
        parent.read_text().replace(
            "patches = [\n", f'drop_patches = ["{SERIES[0]}"]\npatches = [\n', 1
        )
    )
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "v6e-2.11")
    assert (
        "key 'components.torch_xla.drop_patches': this bundle extends no other"
        in caught.value.message
    )


# --- patches-check on the real pytorch/xla source ------------------------------------------


def patches_check(run_cli, project: Path, source: Path) -> tuple[int, str, str]:
    result = run_cli("patches-check", "--bundle", "team", "--source", str(source), root=project)
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def real_project(tmp_path: Path, base_tree: Path) -> Path:
    context = (base_tree / ENV_VARS_H).read_text(encoding="utf-8").split("\n")[:4]
    return make_project(tmp_path / "project", team_patch(context))


@pytest.mark.slow
def test_patches_check_applies_the_parents_five_then_the_childs_one_in_order(
    real_project: Path, run_cli, pytorch_xla_repo: Path
) -> None:
    code, out, err = patches_check(run_cli, real_project, pytorch_xla_repo)
    assert code == 0, out + err
    applied = [line.split()[1] for line in out.splitlines() if line.startswith("ok ")]
    assert applied == [f"patches/{patch}:" for patch in (*SERIES, TEAM_PATCH)]
    assert "the torch_xla series of team: 6 patch(es) apply to" in out
    assert "cache key audit: every one of" in out


@pytest.mark.slow
def test_a_series_without_the_cache_key_patch_is_told_so_first_with_a_fix_that_restores_it(
    real_project: Path, run_cli, pytorch_xla_repo: Path
) -> None:
    # The series: the team's patch alone (then: a replaced list; now: dropped by name).
    drops = "".join(f'    "{patch}",\n' for patch in SERIES)
    write_team(real_project, f'drop_patches = [\n{drops}]\npatches = ["{TEAM_PATCH}"]\n')
    code, out, err = patches_check(run_cli, real_project, pytorch_xla_repo)
    assert code == 1, out + err
    audit = [line for line in out.splitlines() if "cache key audit" in line]
    assert audit[0].startswith(f"cache key audit: the series lacks patches/{CACHE_KEY_PATCH}")
    assert f"the series lacks patches/{CACHE_KEY_PATCH}, which the cache key relies on" in err
    assert "list each read or setter" not in err  # not sent to widen the table
    fix = err.split("fix: ", 1)[1]
    assert (
        f'remove "{CACHE_KEY_PATCH}" from [components.torch_xla] drop_patches in '
        "build/bundles/team.toml" in fix
    )

    # The fix works: the cache-key patch back, the audit passes.
    kept_out = "".join(f'    "{patch}",\n' for patch in SERIES if patch != CACHE_KEY_PATCH)
    write_team(real_project, f'drop_patches = [\n{kept_out}]\npatches = ["{TEAM_PATCH}"]\n')
    code, out, err = patches_check(run_cli, real_project, pytorch_xla_repo)
    assert code == 0, out + err
    assert "cache key audit: every one of" in out


@pytest.mark.slow
def test_a_wrong_files_header_is_summarised_as_a_header_problem(
    tmp_path: Path, base_tree: Path, run_cli, pytorch_xla_repo: Path
) -> None:
    context = (base_tree / ENV_VARS_H).read_text(encoding="utf-8").split("\n")[:4]
    wrong = team_patch(context, files="torch_xla/csrc/runtime/env_vars.cpp")
    project = make_project(tmp_path / "project", wrong)
    code, out, err = patches_check(run_cli, project, pytorch_xla_repo)
    assert code == 2, out + err  # bad input, as a malformed patch is anywhere else
    assert f"FAIL patches/{TEAM_PATCH}:" in out and "Files lists" in out
    assert f"the header of patches/{TEAM_PATCH} is wrong" in err
    assert "does not apply" not in err
    assert "Files names exactly the files the diff touches" in err.split("fix: ", 1)[1]
