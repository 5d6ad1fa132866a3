"""`record`: wheels built elsewhere become a bundle's, held to the build stage's checks.

Real wheels throughout: small torch / torch_xla wheels built by setuptools (with the
provenance the build stage stamps) and retagged for CPython 3.11 by `wheel tags`, and the
stock torch_xla 2.7.0 wheel from PyPI, cached per machine.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import bundles
from tests.bundles import Pin
from tests.clirunner import CliResult
from tests.publish_support import (
    BUNDLE,
    OPENXLA_SHA,
    TORCH_SHA,
    XLA_SHA,
    build_fake_wheels,
    cached_stock_wheel,
)
from xla_wheels.publish.wheels import locked_wheels
from xla_wheels.wheels_lock import read_lock

Run = Callable[..., CliResult]


def retag(wheel: Path, python: str = "cp311") -> Path:
    """The wheel with CPython tags, made by `wheel tags` (WHEEL and RECORD rewritten)."""
    subprocess.run(
        [sys.executable, "-m", "wheel", "tags", "--remove", "--python-tag", python,
         "--abi-tag", python, "--platform-tag", "linux_x86_64", str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (tagged,) = wheel.parent.glob(f"{wheel.name.split('-')[0]}-*-{python}-*.whl")
    return tagged


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a torch and a torch_xla wheel for CPython 3.11."""
    wheels = build_fake_wheels(tmp_path_factory.mktemp("built"))
    out = tmp_path_factory.mktemp("fleet-output")
    for wheel in (wheels.torch, wheels.torch_xla):
        shutil.copy2(retag(wheel), out)
    return out


def project(root: Path, *, python: str = "3.11", xla: str = "2.9.0", patch: bool = False,
            xla_sha: str = XLA_SHA) -> Path:  # fmt: skip
    (root / "build" / "bundles").mkdir(parents=True)
    (root / "patches" / "torch_xla").mkdir(parents=True)
    patches: tuple[str, ...] = ()
    if patch:
        (root / "patches/torch_xla/0001-fix.patch").write_text("diff --git a/x b/x\n")
        patches = ("torch_xla/0001-fix.patch",)
    pins = {
        "torch": Pin("https://example.invalid/torch.git", TORCH_SHA, "2.9.0a0", submodules=None),
        "torch_xla": Pin("https://example.invalid/xla.git", xla_sha, xla, patches, None),
        "openxla": Pin("https://example.invalid/openxla.git", OPENXLA_SHA, None, submodules=None),
    }
    bundles.write_bundle(root, BUNDLE, pins, python=python)
    return root


def copy_of(directory: Path, into: Path) -> Path:
    shutil.copytree(directory, into)
    return into


@pytest.mark.slow
def test_wheels_built_elsewhere_are_recorded_and_then_publishable(
    tmp_path: Path, built: Path, run_cli: Run
) -> None:
    root = project(tmp_path / "p")
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(built), root=root)
    assert result.exit_code == 0, result.output
    assert "provenance compared: openxla commit, openxla patch series" in result.output
    entry = read_lock(root / "wheels.lock").entry(BUNDLE)
    offered = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in built.glob("*.whl")}
    assert {w.name: w.sha256 for w in entry.wheels or ()} == offered
    # What publish takes: the files in dist/<bundle>, by the hashes the lock records.
    published = locked_wheels(read_lock(root / "wheels.lock"), BUNDLE, root / "dist" / BUNDLE)
    assert sorted(w.path.name for w in published) == sorted(offered)
    before = (root / "wheels.lock").read_bytes()
    again = run_cli("record", "--bundle", BUNDLE, "--wheels", str(built), root=root)
    assert again.exit_code == 0, again.output
    assert (root / "wheels.lock").read_bytes() == before  # the same files: nothing changes


def refused(result: CliResult, root: Path, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "refusing to record wheels for bundle pub-1 (nothing was recorded)" in result.output
    assert "fix: " in result.output and "Traceback" not in result.output
    for word in words:
        assert word in result.output
    entry = read_lock(root / "wheels.lock").bundles.get(BUNDLE)
    assert entry is None or entry.wheels is None
    assert not (root / "dist").exists()


def test_wheels_for_another_python_are_refused(tmp_path: Path, built: Path, run_cli: Run) -> None:
    root = project(tmp_path / "p", python="3.13")
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(built), root=root)
    refused(result, root, "tags cp311-cp311, the bundle's Python 3.13 needs cp313-cp313")


def test_a_wheel_of_another_version_or_commit_is_refused(
    tmp_path: Path, built: Path, run_cli: Run
) -> None:
    root = project(tmp_path / "p", xla="2.8.0", xla_sha="d" * 40)
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(built), root=root)
    refused(
        result, root,
        "version 2.9.0, the bundle pins torch_xla 2.8.0",
        f"built from commit c04e61c, the bundle pins {'d' * 40}",
    )  # fmt: skip


def test_a_hash_that_differs_from_sha256sums_is_refused(
    tmp_path: Path, built: Path, run_cli: Run
) -> None:
    root = project(tmp_path / "p")
    wheels = copy_of(built, tmp_path / "wheels")
    (xla,) = wheels.glob("torch_xla-*.whl")
    (torch,) = wheels.glob("torch-*.whl")
    torch_sha = hashlib.sha256(torch.read_bytes()).hexdigest()
    (wheels / "SHA256SUMS").write_text(f"{torch_sha}  {torch.name}\n{'0' * 64}  {xla.name}\n")
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(wheels), root=root)
    refused(result, root, f"{xla.name}: sha256 ", f"SHA256SUMS says {'0' * 64}")


def test_a_wheel_changed_after_it_was_built_is_refused(
    tmp_path: Path, built: Path, run_cli: Run
) -> None:
    root = project(tmp_path / "p")
    wheels = copy_of(built, tmp_path / "wheels")
    (xla,) = wheels.glob("torch_xla-*.whl")
    changed = tmp_path / xla.name
    with zipfile.ZipFile(xla) as source, zipfile.ZipFile(changed, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "torch_xla/__init__.py":
                data += b"# changed\n"
            target.writestr(info, data)
    shutil.move(changed, xla)
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(wheels), root=root)
    refused(result, root, "torch_xla/__init__.py does not match its RECORD hash")


def test_a_torch_xla_whose_provenance_lacks_the_bundles_patches_is_refused(
    tmp_path: Path, built: Path, run_cli: Run
) -> None:
    root = project(tmp_path / "p", patch=True)
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(built), root=root)
    refused(result, root, "torch_xla patch series sha256 is", "wheels.lock (pub-1) has")


@pytest.mark.slow
def test_a_recorded_wheel_is_never_replaced_silently(
    tmp_path: Path, built: Path, run_cli: Run
) -> None:
    root = project(tmp_path / "p")
    assert run_cli("record", "--bundle", BUNDLE, "--wheels", str(built), root=root).exit_code == 0
    lock_before = (root / "wheels.lock").read_bytes()
    # Another build of the same torch: same name, other bytes (as another builder makes).
    rebuilt = build_fake_wheels(tmp_path / "rebuilt", with_provenance=False)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shutil.copy2(retag(rebuilt.torch), wheels)
    (other,) = wheels.glob("torch-*.whl")
    assert (built / other.name).read_bytes() != other.read_bytes()
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(wheels), root=root)
    assert result.exit_code == 2, result.output
    assert f"but wheels.lock (pub-1) records {other.name} with sha256" in result.output
    assert "never replaced silently" in result.output
    assert (root / "wheels.lock").read_bytes() == lock_before
    assert (root / "dist" / BUNDLE / other.name).read_bytes() == (built / other.name).read_bytes()


@pytest.mark.slow
def test_the_stock_torch_xla_wheel_is_recorded_as_a_stock_control(
    tmp_path: Path, run_cli: Run
) -> None:
    stock = cached_stock_wheel("2.7.0", "3.11")
    wheels = tmp_path / "stock"
    wheels.mkdir()
    (wheels / stock.name).symlink_to(stock)
    root = project(tmp_path / "p", xla="2.7.0")
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(wheels), root=root)
    assert result.exit_code == 0, result.output
    assert "no provenance (a stock wheel)" in result.output
    (record,) = read_lock(root / "wheels.lock").entry(BUNDLE).wheels or ()
    assert record.name == stock.name
    assert (root / "dist" / BUNDLE / stock.name).is_file()
    # The same stock wheel cannot stand for a patched bundle: it cannot show the patches.
    patched = project(tmp_path / "q", xla="2.7.0", patch=True)
    result = run_cli("record", "--bundle", BUNDLE, "--wheels", str(wheels), root=patched)
    assert result.exit_code == 2, result.output
    assert "carries no torch_xla/_xla_wheels_provenance.json" in result.output
