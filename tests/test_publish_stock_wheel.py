"""The real package once: stock torch_xla 2.9.0 from PyPI through a local index, by hash.

The wheel (~100-200 MB) is downloaded once per machine into the pipeline's cache
(``${XLA_WHEELS_CACHE:-~/.cache/xla-wheels}/wheels/``); torch (7 GB) is not: the install
uses ``--no-deps`` and, where the gate's cached stock environment exists, the import check
borrows torch from it while torch_xla itself comes from the fresh venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    cached_stock_wheel,
    make_publish_project,
    start_pypiserver,
)
from tests.servers import stop
from xla_wheels.options import machine_cache

STOCK = "2.9.0"
BUNDLE = "stock-2.9"


def _stock_env_python() -> Path | None:
    """The gate's cached stock 2.9.0 environment, if this machine already has it."""
    from xla_wheels import stock_envs as envs

    tag = "cp{}{}".format(*sys.version_info[:2])
    env_dir = machine_cache(os.environ) / "envs" / envs.env_name(envs.STOCK_SPECS[STOCK], tag)
    python = envs.env_python(env_dir)
    return python if (env_dir / envs.MARKER).is_file() and python.exists() else None


@pytest.mark.slow
def test_stock_torch_xla_publishes_and_installs_by_hash(tmp_path: Path) -> None:
    try:
        wheel = cached_stock_wheel(STOCK, f"{sys.version_info[0]}.{sys.version_info[1]}")
    except subprocess.CalledProcessError as error:
        pytest.fail(f"cannot download torch_xla {STOCK}: {error.stderr.decode()[-800:]}")
    assert wheel.stat().st_size > 50_000_000  # the real package, not a stand-in
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    project = make_publish_project(
        tmp_path, [wheel], bundle=BUNDLE, python=version, xla_version=STOCK
    )
    process, server = start_pypiserver(tmp_path / "index", "update,download,list")
    try:
        env = server.credentials
        published = run_cli(
            "publish",
            "--bundle",
            BUNDLE,
            "--index-url",
            server.url,
            env=env,
            root=project,
            inherit_env=True,
        )
        assert published.exit_code == 0, published.output
        assert f"uploaded  {wheel.name}" in published.stdout
        again = run_cli(
            "publish",
            "--bundle",
            BUNDLE,
            "--index-url",
            server.url,
            env=env,
            root=project,
            inherit_env=True,
        )
        assert f"skipped   {wheel.name}" in again.stdout, again.output

        args = ["verify-install", "--bundle", BUNDLE, "--index-url", server.url, "--no-deps"]
        stock_python = _stock_env_python()
        if stock_python is not None:
            args += ["--deps-from", str(stock_python)]
        verified = run_cli(*args, env=env, timeout=1800, root=project, inherit_env=True)
    finally:
        stop(process)
    assert verified.exit_code == 0, verified.output
    assert f"installed {STOCK}, locked {STOCK}" in verified.stdout
    # Stock wheels carry no provenance: reported, not silently passed.
    assert "WARN    provenance" in verified.stdout and "absent" in verified.stdout
    if stock_python is not None:
        assert f"torch_xla {STOCK} imported from the fresh venv" in verified.stdout
    else:
        assert "skipped import" in verified.stdout
