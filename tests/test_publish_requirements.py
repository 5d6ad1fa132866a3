"""requirements: our hashes from the lock, public runtime hashes resolved by pip and locked."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    make_publish_project,
    provenance,
)

RUNTIME = '[runtime.jax]\nversion = "0.9.0"\n\n[runtime.jaxlib]\nversion = "0.9.0"\n'


def _lock(project: Path) -> dict:
    return tomllib.loads((project / "wheels.lock").read_text())["bundles"][BUNDLE]


@pytest.mark.slow
def test_runtime_closure_is_resolved_locked_and_kept(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    project = make_publish_project(
        tmp_path, [fake_wheels.torch, fake_wheels.torch_xla], runtime=RUNTIME, python="3.13"
    )
    result = run_cli(
        "requirements",
        "--bundle",
        BUNDLE,
        timeout=900,
        root=project,
        inherit_env=True,
    )
    assert result.exit_code == 0, result.output

    entry = _lock(project)
    runtime = {row["project"]: row for row in entry["runtime-wheels"]}
    # jax pulls jaxlib, numpy, scipy, ml-dtypes, opt-einsum: all pinned, none of ours.
    assert {"jax", "jaxlib", "numpy", "scipy"} <= set(runtime)
    assert "torch" not in runtime and "torch-xla" not in runtime
    assert runtime["jax"]["version"] == "0.9.0"
    assert runtime["jaxlib"]["name"].startswith("jaxlib-0.9.0-cp313-cp313-manylinux")
    assert entry["runtime-wheels-for"]["python"] == "3.13"

    text = (project / "dist" / BUNDLE / "requirements.txt").read_text()
    torch_xla_sha = hashlib.sha256(fake_wheels.torch_xla.read_bytes()).hexdigest()
    assert f"torch-xla==2.9.0+gitc04e61c \\\n    --hash=sha256:{torch_xla_sha}" in text
    assert f"jax==0.9.0 \\\n    --hash=sha256:{runtime['jax']['sha256']}" in text
    requirement_lines = [line for line in text.splitlines() if "==" in line and "#" not in line]
    assert len(requirement_lines) == len(runtime) + 2

    # The second run reuses the record (no network) and writes the same file.
    again = run_cli("requirements", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert again.exit_code == 0, again.output
    assert "reusing the resolution recorded in wheels.lock" in again.stderr
    assert (project / "dist" / BUNDLE / "requirements.txt").read_text() == text

    # `make lock` with unchanged inputs keeps the record byte for byte; lock-check passes.
    before = (project / "wheels.lock").read_bytes()
    assert run_cli("lock", "--bundle", BUNDLE, root=project, inherit_env=True).exit_code == 0
    assert (project / "wheels.lock").read_bytes() == before
    checked = run_cli("lock-check", root=project, inherit_env=True)
    assert checked.exit_code == 0, checked.output


@pytest.mark.slow
def test_requirements_refuse_a_wheel_that_changed_after_locking(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    wheel = next((project / "dist" / BUNDLE).glob("torch-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    result = run_cli("requirements", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert result.exit_code == 1, result.output
    assert "do not match wheels.lock" in result.stderr
    assert not (project / "dist" / BUNDLE / "requirements.txt").exists()


@pytest.mark.parametrize("missing", ["lock", "wheels"])
def test_requirements_name_the_missing_step(tmp_path: Path, missing: str) -> None:
    project = make_publish_project(tmp_path, [])
    if missing == "lock":
        (project / "wheels.lock").unlink()
    result = run_cli("requirements", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert result.exit_code == 1, result.output
    assert f"make wheels BUNDLE={BUNDLE}" in result.stderr


def test_the_provenance_is_compared_fact_by_fact_with_the_lock(tmp_path: Path) -> None:
    from dataclasses import replace

    from xla_host.provenance import Provenance
    from xla_wheels.publish.provenance_check import compare
    from xla_wheels.wheels_lock import read_lock

    project = make_publish_project(tmp_path, [])
    entry = read_lock(project / "wheels.lock").entry(BUNDLE)
    good = provenance()
    check = compare(good, BUNDLE, entry)
    assert check.problems == []
    assert {"torch_xla commit", "torch_xla patch series"} <= set(check.compared)
    # A wheel's identity is its inputs: a bundle name, manifest digest or remote in the file
    # (older wheels carried them) is read, ignored and never judged, so bundles sharing the
    # inputs share the wheel.
    older = good.to_json()
    older.update(bundle="another-bundle", manifest_sha256="0" * 64)
    for component in older["components"].values():
        component["remote"] = "https://example.invalid/elsewhere.git"
    from_older = Provenance.from_json(older)
    assert from_older == good
    assert "bundle" not in from_older.to_json()
    check = compare(from_older, BUNDLE, entry)
    assert check.problems == []
    assert not {"bundle", "manifest sha256"} & set(check.compared)
    xla = replace(good.components["torch_xla"], series_sha256="0" * 64, commit="deadbeef" * 5)
    bad = replace(good, components={**good.components, "torch_xla": xla})
    problems = compare(bad, BUNDLE, entry).problems
    assert any("torch_xla commit is deadbeef" in p for p in problems)
    assert any("torch_xla patch series sha256 is 000" in p for p in problems)
