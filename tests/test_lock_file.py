"""wheels.lock: stable, reviewable, and lock-check names every way it drifts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.gitrepos import RUNTIME_CC, Upstream, diff_for, make_project, patch_text
from xla_wheels.bundle import load_bundle
from xla_wheels.wheels_lock import (
    WheelRecord,
    check_lock,
    read_lock,
    record_wheels,
    update_bundle_entry,
)


@pytest.fixture
def project(tmp_path: Path, upstreams: dict[str, Upstream]) -> Path:
    base = upstreams["torch_xla"].commits[-1]
    patch = patch_text(
        "torch_xla",
        base,
        diff_for(upstreams["torch_xla"], base, {"src/runtime.cc": RUNTIME_CC + "// patched\n"}),
    )
    commits = {"openxla": upstreams["openxla"].commits[-1][:9]}
    return make_project(
        tmp_path, upstreams, patches={"torch_xla": {"0001-a.patch": patch}}, commits=commits
    )


def lock(project: Path) -> Path:
    bundle = load_bundle(project, "test-1")
    resolved = {name: c.commit if c.is_full_sha else None for name, c in bundle.components.items()}
    update_bundle_entry(project / "wheels.lock", bundle, resolved, project)
    return project / "wheels.lock"


def test_the_lock_records_digests_commits_and_patches(project: Path) -> None:
    data = tomllib.loads(lock(project).read_text())
    entry = data["bundles"]["test-1"]
    bundle = load_bundle(project, "test-1")
    assert entry["manifest-sha256"] == bundle.manifest_sha256
    assert entry["components"]["torch"]["commit"] == bundle.component("torch").commit
    patch = entry["components"]["torch_xla"]["patches"][0]
    assert patch["path"] == "patches/torch_xla/0001-a.patch" and len(patch["sha256"]) == 64
    # A short pin nobody resolved is recorded as unresolved, never guessed.
    assert entry["components"]["openxla"]["commit-resolved"] is False
    assert entry["runtime"]["libtpu"] == {"specifier": ">=0.0.24", "version": "0.0.36"}


def test_regenerating_an_unchanged_lock_is_byte_for_byte_identical(project: Path) -> None:
    first = lock(project).read_bytes()
    assert lock(project).read_bytes() == first
    assert not re.search(rb"\d{4}-\d{2}-\d{2}", first)  # no timestamps in a reviewed file


def test_lock_check_passes_when_in_sync(project: Path) -> None:
    lock(project)
    assert check_lock(project, project / "wheels.lock") == []


def test_lock_check_names_a_changed_patch(project: Path) -> None:
    lock(project)
    patch = project / "patches/torch_xla/0001-a.patch"
    patch.write_text(patch.read_text().replace("Longer reasoning.", "Edited reasoning."))
    problems = check_lock(project, project / "wheels.lock")
    assert any("patches/torch_xla/0001-a.patch changed" in p for p in problems)


def test_lock_check_names_a_changed_manifest_and_commit(project: Path) -> None:
    lock(project)
    manifest = project / "build/bundles/test-1.toml"
    bundle = load_bundle(project, "test-1")
    old = bundle.component("torch").commit or ""
    manifest.write_text(manifest.read_text().replace(old, "0" * 40))
    problems = check_lock(project, project / "wheels.lock")
    assert any("manifest test-1.toml changed" in p for p in problems)
    assert any(
        f"torch commit is {'0' * 40} in the manifest, {old} in the lock" in p for p in problems
    )


def test_lock_check_names_missing_and_stale_entries(project: Path) -> None:
    lock(project)
    manifest = project / "build/bundles/test-1.toml"
    manifest.rename(project / "build/bundles/test-2.toml")
    (project / "build/bundles/test-2.toml").write_text(
        (project / "build/bundles/test-2.toml").read_text().replace('"test-1"', '"test-2"')
    )
    problems = check_lock(project, project / "wheels.lock")
    assert "test-2: no entry in wheels.lock (run `make lock BUNDLE=test-2`)" in problems
    assert any(
        "test-1: wheels.lock has an entry but build/bundles/test-1.toml is gone" in p
        for p in problems
    )


def test_recorded_wheels_survive_relocking_only_while_inputs_are_unchanged(project: Path) -> None:
    lock_path = lock(project)
    record_wheels(
        lock_path, "test-1", [WheelRecord("b.whl", 2, "b" * 64), WheelRecord("a.whl", 1, "a" * 64)]
    )
    assert [w.name for w in read_lock(lock_path).entry("test-1").wheels or ()] == [
        "a.whl",
        "b.whl",
    ]
    lock(project)
    assert read_lock(lock_path).entry("test-1").wheels is not None
    patch = project / "patches/torch_xla/0001-a.patch"
    patch.write_text(patch.read_text().replace("Longer reasoning.", "New reasoning."))
    lock(project)
    assert read_lock(lock_path).entry("test-1").wheels is None  # built from other inputs


PROFILE = """
[profiles.train.compiler]
LIBTPU_INIT_ARGS = "--xla_tpu_enable_flash_attention=false"
"""


def test_a_launch_profile_changes_without_dropping_the_recorded_wheels(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock_path = lock(project)
    wheels = [WheelRecord("torch_xla-2.9.0-cp311-cp311-linux_x86_64.whl", 1, "a" * 64)]
    record_wheels(lock_path, "test-1", wheels)
    manifest = project / "build/bundles/test-1.toml"
    manifest.write_text(manifest.read_text() + PROFILE)  # a new profile: launch policy
    lock(project)
    entry = read_lock(lock_path).entry("test-1")
    assert entry.wheels == tuple(wheels)
    assert set(entry.profiles) == {"train"}  # the gate compares receipts with this digest
    text = manifest.read_text()
    manifest.write_text(text.replace("flash_attention=false", "flash_attention=true"))
    lock(project)
    entry = read_lock(lock_path).entry("test-1")
    assert entry.wheels == tuple(wheels)
    assert check_lock(project, lock_path) == []
    assert "warning" not in capsys.readouterr().err


def test_a_changed_build_pin_drops_the_recorded_wheels_and_says_why(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock_path = lock(project)
    record_wheels(lock_path, "test-1", [WheelRecord("a.whl", 1, "a" * 64)])
    manifest = project / "build/bundles/test-1.toml"
    manifest.write_text(manifest.read_text() + "\n[build]\ncxx_abi = 0\n")
    lock(project)
    assert read_lock(lock_path).entry("test-1").wheels is None
    err = capsys.readouterr().err
    assert "test-1: the build changed (a build setting" in err
    assert "no longer records its 1 wheel(s)" in err and "make wheels BUNDLE=test-1" in err


def test_the_lock_in_the_repository_matches_the_bundles() -> None:
    from tests.gitrepos import REPO_ROOT

    assert check_lock(REPO_ROOT, REPO_ROOT / "wheels.lock") == []


def test_bundles_are_written_in_name_order_whatever_order_they_were_locked(
    tmp_path: Path, upstreams: dict[str, Upstream]
) -> None:
    project = make_project(tmp_path, upstreams, bundle="zeta")
    make_project(tmp_path, upstreams, bundle="alpha")

    def lock_in(order: list[str], lock_path: Path) -> bytes:
        for name in order:
            bundle = load_bundle(project, name)
            resolved = {n: c.commit for n, c in bundle.components.items()}
            update_bundle_entry(lock_path, bundle, resolved, project)
        return lock_path.read_bytes()

    zeta_first = lock_in(["zeta", "alpha"], tmp_path / "one.lock")
    alpha_first = lock_in(["alpha", "zeta"], tmp_path / "two.lock")
    assert zeta_first.index(b"[bundles.alpha]") < zeta_first.index(b"[bundles.zeta]")
    assert zeta_first == alpha_first
