"""Cached stock environments: built once, marked only when torch_xla imports.

The install and import-verification steps are replaced here by small stand-ins (the real
ones take minutes and 7 GB and are exercised by the stock_xla_python_* fixtures); the
venv creation is the real code. The lock, the temporary directory, the marker and the
rename are ``waitlock.make_once``'s, specified in tests/test_make_once.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from xla_host.gate.errors import GateEnvironmentError
from xla_wheels import stock_envs as envs


@pytest.fixture
def no_pypi(monkeypatch):
    """No PyPI probe and no pip in the venv; the caller stands in for ``_install``."""
    monkeypatch.setattr(envs, "check_wheels_exist", lambda *a: None)
    monkeypatch.setattr(envs, "VENV_OPTIONS", ("--without-pip",))
    return monkeypatch


@pytest.fixture
def fake_install(no_pypi):
    """Count builds; skip the PyPI steps but keep venv creation, lock and rename real."""
    calls: list[str] = []

    def install(python: str, spec: envs.StockEnvSpec, build_log: Path) -> None:
        calls.append(python)

    no_pypi.setattr(envs, "_install", install)
    no_pypi.setattr(envs, "_verify", lambda python, build_log: None)
    return calls


def test_an_environment_is_built_once_and_then_reused(tmp_path, fake_install):
    first = envs.ensure_stock_env("2.9.0", root=tmp_path)
    second = envs.ensure_stock_env("2.9.0", root=tmp_path)
    assert first == second
    assert len(fake_install) == 1
    marker = json.loads((first.parent.parent / envs.MARKER).read_text())
    assert marker["spec"] == {"torch": "2.9.0", "torch_xla": "2.9.0"}
    assert first.parent.parent.name.startswith("stock-torch2.9.0-xla2.9.0-cp3")


def test_the_built_venv_runs_from_its_final_location(tmp_path, fake_install):
    python = envs.ensure_stock_env("2.7.0", root=tmp_path)
    import subprocess

    prefix = subprocess.run(
        [str(python), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(prefix) == python.parent.parent


def _install_stand_in(modules: dict[str, str]):
    """An ``_install`` that writes ``modules`` (name -> source) into the venv's site-packages."""

    def install(python: str, spec: envs.StockEnvSpec, build_log: Path) -> None:
        site = next(Path(python).parent.parent.glob("lib/python3*/site-packages"))
        for name, source in modules.items():
            (site / f"{name}.py").write_text(source)

    return install


def test_an_environment_whose_torch_xla_does_not_import_is_never_marked(tmp_path, no_pypi):
    # The real import check runs: torch imports, torch_xla raises as a broken wheel would.
    no_pypi.setattr(
        envs,
        "_install",
        _install_stand_in(
            {"torch": "__version__ = '2.9.0'\n", "torch_xla": "raise ImportError('libtpu')\n"}
        ),
    )
    with pytest.raises(GateEnvironmentError, match="import torch, torch_xla"):
        envs.ensure_stock_env("2.9.0", root=tmp_path)
    assert not list((tmp_path / "envs").glob(f"*/{envs.MARKER}"))


def test_an_environment_whose_torch_xla_imports_is_marked(tmp_path, no_pypi):
    no_pypi.setattr(
        envs,
        "_install",
        _install_stand_in(
            {"torch": "__version__ = '2.9.0'\n", "torch_xla": "__version__ = '2.9.0'\n"}
        ),
    )
    python = envs.ensure_stock_env("2.9.0", root=tmp_path)
    assert (python.parent.parent / envs.MARKER).is_file()
    assert "2.9.0 2.9.0" in (python.parent.parent / "build.log").read_text()


def test_an_unknown_stock_version_is_refused(tmp_path):
    with pytest.raises(GateEnvironmentError, match="no stock environment is defined"):
        envs.ensure_stock_env("1.0.0", root=tmp_path)


def test_the_gate_and_the_pipeline_derive_one_cache_root(tmp_path):
    """``make gate`` builds its envs where ``make wheels`` keeps its sources."""
    from xla_wheels.options import machine_cache

    home = tmp_path / "home"
    assert machine_cache({"XLA_WHEELS_CACHE": str(tmp_path / "c"), "HOME": str(home)}) == (
        tmp_path / "c"
    )
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(home)}
    assert machine_cache(xdg) == tmp_path / "xdg" / "xla-wheels"
    assert machine_cache({"HOME": str(home)}) == home / ".cache" / "xla-wheels"


@pytest.mark.slow
def test_pypi_is_asked_whether_wheels_exist_for_the_python(tmp_path):
    """Real query: torch_xla 2.7.0 has cp311 wheels, and none for a future Python."""
    envs.check_wheels_exist(envs.STOCK_SPECS["2.7.0"], "3.11", sys.executable)
    with pytest.raises(GateEnvironmentError, match="no torch_xla 2.7.0 wheel for Python 3.14"):
        envs.check_wheels_exist(envs.STOCK_SPECS["2.7.0"], "3.14", sys.executable)
