"""Names that become paths are checked at load against one pattern, and everything a
manifest references resolves inside the project (a symlink judged by its target): exit 2
with the key and the fix, through the CLI and make, before anything runs."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult, run_cli
from xla_host.values import NAME_PATTERN

MANIFEST = """\
[bundle]
name = "{name}"
python = "3.11"
{extends}
[components.torch]
remote = "https://github.com/pytorch/pytorch.git"
commit = "21fec65781bebe867faf209f89bb687ffd236ca4"
version = "2.9.0a0"

[components.torch_xla]
remote = "https://github.com/pytorch/xla.git"
commit = "c04e61c3424142c0eebcc9e59984b9d8fced18c0"
version = "2.9.0"
patches = ["torch_xla/0001-fix.patch"]

[components.openxla]
remote = "https://github.com/openxla/xla.git"
unpinned = "not needed here"
"""

GOOD_PATCH = """\
Subject: A fix
Component: torch_xla
Base: c04e61c3424142c0eebcc9e59984b9d8fced18c0
Fixes: nothing real
Why: a test
Upstream: none
Files: x

diff --git a/x b/x
--- a/x
+++ b/x
@@ -1 +1 @@
-a
+b
"""

BAD_NAMES = ["my bundle", "-rf", ".hidden", "a;b", "ünï", "x" * 65, "a$(id)"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "build" / "bundles").mkdir(parents=True)
    (root / "patches" / "torch_xla").mkdir(parents=True)
    (root / "patches" / "torch_xla" / "0001-fix.patch").write_text(GOOD_PATCH)
    write(root, "good")
    return root


def write(root: Path, name: str, *, extends: str = "", file: str | None = None) -> Path:
    path = root / "build" / "bundles" / f"{file or name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f'extends = "{extends}"\n' if extends else ""
    path.write_text(MANIFEST.format(name=name, extends=line))
    return path


def sources_dry_run(root: Path, bundle: str, tmp_path: Path) -> CliResult:
    return run_cli(
        "sources", f"--bundle={bundle}", "--dry-run", root=root,
        env={"XLA_WHEELS_OUT": str(tmp_path / "out"), "XLA_WHEELS_CACHE": str(tmp_path / "c")},
    )  # fmt: skip


def assert_refused(result: CliResult, tmp_path: Path, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "usage:" not in result.output
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()


def assert_planned(result: CliResult, tmp_path: Path, bundle: str) -> None:
    """The dry run went through: the plan of ``bundle`` with both pinned components, and
    nothing written."""
    assert result.exit_code == 0, result.output
    assert f"bundle {bundle}: build/bundles/{bundle}.toml sha256:" in result.stdout
    pins = ("21fec65781bebe867faf209f89bb687ffd236ca4", "c04e61c3424142c0eebcc9e59984b9d8fced18c0")
    for pin in pins:
        assert f"{pin} (full SHA)" in result.stdout, result.stdout
    assert "openxla: UNPINNED (not needed here)" in result.stdout
    assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()


def test_the_good_project_loads(project: Path, tmp_path: Path) -> None:
    # The refusals below can only come from what each test breaks.
    assert_planned(sources_dry_run(project, "good", tmp_path), tmp_path, "good")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_the_name_pattern_refuses(name: str) -> None:
    assert NAME_PATTERN.fullmatch(name) is None


@pytest.mark.parametrize("name", [n for n in BAD_NAMES if "/" not in n])
def test_a_manifest_named_outside_the_pattern_is_refused_at_load(
    name: str, project: Path, tmp_path: Path
) -> None:
    write(project, name)
    result = sources_dry_run(project, name, tmp_path)
    assert_refused(result, tmp_path, "is not a valid bundle name", "fix:")


@pytest.mark.parametrize("name", ["my bundle", "a/../good", "../good", "-rf"])
def test_make_refuses_a_bundle_name_outside_the_pattern(
    name: str, project: Path, tmp_path: Path
) -> None:
    process = subprocess.run(
        ["make", "--no-print-directory", "sources", f"BUNDLE={name}", "DRY_RUN=1"],
        cwd=REPO_ROOT, text=True, capture_output=True, timeout=300, check=False,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)),
             "XLA_WHEELS_ROOT": str(project), "XLA_WHEELS_OUT": str(tmp_path / "out"),
             "XLA_WHEELS_CACHE": str(tmp_path / "c")},
    )  # fmt: skip
    result = CliResult(process.returncode, process.stdout, process.stderr)
    assert_refused(result, tmp_path, "is not a valid bundle name", "fix: use one of: good")


@pytest.mark.parametrize("parent", ["../../../etc/passwd", "good/..", "x y"])
def test_extends_names_a_bundle_by_the_pattern(parent: str, project: Path, tmp_path: Path) -> None:
    write(project, "child", extends=parent)
    result = sources_dry_run(project, "child", tmp_path)
    assert_refused(result, tmp_path, "key 'bundle.extends'", "is not a valid bundle name")


def test_a_parent_linked_from_outside_the_bundles_is_refused(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write(elsewhere, "outside")
    (project / "build" / "bundles" / "outside.toml").symlink_to(elsewhere / "outside.toml")
    write(project, "child", extends="outside")
    result = sources_dry_run(project, "child", tmp_path)
    assert_refused(result, tmp_path, "key 'bundle.extends'", "outside")


def test_a_patch_linked_from_outside_the_project_is_refused(project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "evil.patch"
    outside.write_text(GOOD_PATCH)
    patch = project / "patches" / "torch_xla" / "0001-fix.patch"
    patch.unlink()
    patch.symlink_to(outside)
    result = sources_dry_run(project, "good", tmp_path)
    assert_refused(result, tmp_path, "is a link to", "outside patches/", "fix: copy the patch")


def test_a_patch_linked_inside_the_project_is_fine(project: Path, tmp_path: Path) -> None:
    patch = project / "patches" / "torch_xla" / "0001-fix.patch"
    real = project / "patches" / "torch_xla" / "real.patch"
    patch.rename(real)
    patch.symlink_to(real)
    result = run_cli(
        "patch", "--bundle=good", "--dry-run", root=project,
        env={"XLA_WHEELS_OUT": str(tmp_path / "out"), "XLA_WHEELS_CACHE": str(tmp_path / "c")},
    )  # fmt: skip
    assert_planned(result, tmp_path, "good")
    # The series applies the patch through its link: the link's name, the target's bytes.
    digest = hashlib.sha256(GOOD_PATCH.encode()).hexdigest()
    applied = [line for line in result.stdout.splitlines() if "git apply" in line]
    assert len(applied) == 1, result.stdout
    assert "patches/torch_xla/0001-fix.patch)" in applied[0]
    assert applied[0].endswith(f"# sha256:{digest}"), applied[0]


def test_a_directory_given_as_a_patch_says_so(project: Path, tmp_path: Path) -> None:
    patch = project / "patches" / "torch_xla" / "0001-fix.patch"
    patch.unlink()
    patch.mkdir()
    result = sources_dry_run(project, "good", tmp_path)
    assert_refused(result, tmp_path, "is a directory, not a patch file")


@pytest.mark.parametrize("raw", [b"\xff\xfe[bundle]\n", "name = 'caf\xe9'\n".encode("latin-1")])
def test_an_undecodable_manifest_says_save_it_as_utf8(
    raw: bytes, project: Path, tmp_path: Path
) -> None:
    (project / "build" / "bundles" / "good.toml").write_bytes(raw)
    result = sources_dry_run(project, "good", tmp_path)
    assert_refused(result, tmp_path, "not UTF-8 text", "fix: save the file as UTF-8")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "no 'diff --git' section"),
        (b"just some notes\n", "no 'diff --git' section"),
        (GOOD_PATCH.replace("Subject: A fix", "Subject A fix").encode(), "is not 'Key: value'"),
        (GOOD_PATCH.replace("Component: torch_xla", "Component: torch").encode(),
         "header says Component: torch"),
        (GOOD_PATCH.replace("Why: a test\n", "").encode(), "header is missing Why"),
        (GOOD_PATCH.encode().replace(b"a test", b"\xff\xfe"), "not UTF-8 text"),
    ],
)  # fmt: skip
def test_a_bad_patch_file_is_bad_input_exit_2(
    content: bytes, needle: str, project: Path, tmp_path: Path
) -> None:
    (project / "patches" / "torch_xla" / "0001-fix.patch").write_bytes(content)
    result = sources_dry_run(project, "good", tmp_path)
    assert_refused(result, tmp_path, needle, "fix:")
