"""The one probe of installed metadata, run in a real interpreter (this test's own venv)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from xla_host.installed_metadata import ProbeFailed, read_installed


def test_versions_sites_and_files_of_what_is_installed() -> None:
    found = read_installed(
        sys.executable, ["pytest", "no-such-distribution"], with_files=["packaging"]
    )
    assert found.python and found.version == "{}.{}".format(*sys.version_info[:2])
    assert "no-such-distribution" not in found.dists
    assert found.version_of("no-such-distribution") is None
    pytest_dist = found.dists["pytest"]
    assert pytest_dist.version == pytest.__version__
    assert pytest_dist.files == ()  # file lists only where asked: torch's has ~15,000
    packaging_dist = found.dists["packaging"]
    assert "packaging/utils.py" in packaging_dist.files
    assert (Path(packaging_dist.site) / "packaging" / "utils.py").is_file()
    assert packaging_dist.package_dir == str(Path(packaging_dist.site) / "packaging")
    assert found.imported == ()


def test_isolated_ignores_the_shells_python_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PYTHONPATH entry holding a distribution is seen, unless the probe is isolated.
    info = tmp_path / "ghost-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ghost\nVersion: 1.0\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert read_installed(sys.executable, ["ghost"]).version_of("ghost") == "1.0"
    assert read_installed(sys.executable, ["ghost"], isolated=True).version_of("ghost") is None


def test_an_interpreter_that_cannot_run_or_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ProbeFailed, match="cannot run the interpreter"):
        read_installed(str(tmp_path / "no-python"), ["torch"])
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'no metadata here' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(ProbeFailed, match="could not read its installed packages: no metadata"):
        read_installed(str(broken), ["torch"])
