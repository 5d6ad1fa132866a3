"""Every ``fix:`` line is a command that works: the test reads the fix, runs it, and shows
that it does what it says. (A corrupt wheels.lock and its fix: test_validation_before_fetch.py.)"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, run_cli
from tests.missing_tools import skipif_missing
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    IndexServer,
    make_publish_project,
    start_pypiserver,
)
from tests.servers import free_port, stop


@pytest.fixture
def project(tmp_path: Path, fake_wheels: FakeWheels) -> Path:
    return make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])


@pytest.mark.slow
def test_publish_without_credentials_names_where_they_come_from(
    project: Path, tmp_path: Path
) -> None:
    # An index that lets anyone read and only an account upload: twine is the one refused.
    # clirunner never passes the developer's TWINE_* on; keyring has no backend here.
    process, index_server = start_pypiserver(tmp_path / "index", "update")
    try:
        _publish_without_then_with_credentials(project, index_server)
    finally:
        stop(process)


def _publish_without_then_with_credentials(project: Path, index_server: IndexServer) -> None:
    bare = run_cli(
        "publish", "--bundle", BUNDLE, "--index-url", index_server.url, root=project,
        inherit_env=True, env={"PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"},
    )  # fmt: skip
    assert bare.exit_code == 1, bare.output
    assert "neither TWINE_USERNAME/TWINE_PASSWORD are set nor does keyring" in bare.stderr
    assert "fix: export TWINE_USERNAME=<user> TWINE_PASSWORD=<password>" in bare.stderr
    assert "keyring set" in bare.stderr
    assert list(index_server.packages.iterdir()) == []
    # The fix: the two variables.
    fixed = run_cli(
        "publish", "--bundle", BUNDLE, "--index-url", index_server.url, root=project,
        inherit_env=True, env=index_server.credentials,
    )  # fmt: skip
    assert fixed.exit_code == 0, fixed.output
    assert len(list(index_server.packages.iterdir())) == 2


def test_diff_without_bundles_speaks_make(tmp_path: Path) -> None:
    bare = run_cli("diff", root=REPO_ROOT)
    assert bare.exit_code == 2, bare.output
    assert "left" not in bare.stderr and "Traceback" not in bare.output
    assert "fix: name one or two of v6e-2.11, v6e-2.9: make diff A=<bundle> [B=<bundle>]" in (
        bare.stderr
    )
    fixed = run_cli("diff", "v6e-2.9", "v6e-2.11", root=REPO_ROOT)
    assert fixed.exit_code == 0 and "v6e-2.9  ->  v6e-2.11" in fixed.stdout


@pytest.mark.slow
def test_a_failed_fetch_says_what_it_left_in_the_source_cache(
    project: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "machine-cache"
    # One retry, not the default three: what is left over is the claim, not the backoff
    # (2 + 4 + 8 s of sleep; test_network_faults.py bounds the retries).
    env = {"XLA_WHEELS_CACHE": str(cache), "XLA_WHEELS_NET_RETRIES": "1"}
    result = run_cli(
        "sources", "--bundle", BUNDLE, "--mirror", f"http://127.0.0.1:{free_port()}/",
        root=project, env=env, timeout=120,
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "the source cache is unchanged" not in result.stderr
    created = sorted((cache / "sources").iterdir())
    assert len(created) == 1  # the bare repository made before the fetch: named in the fix
    assert f"added nothing to the source cache but the bare repository {created[0]}" in (
        result.stderr
    )
    assert "make: MIRROR=" in result.stderr


def test_preflight_disk_fix_is_a_setting_make_passes(tmp_path: Path) -> None:
    # The disk blocker's fix: XLA_WHEELS_OUT=<dir> in front of make (make has no OUT_DIR);
    # the environment variable moves the work directory for make and the CLI alike.
    elsewhere = tmp_path / "bigger-disk"
    plan = run_cli(
        "wheels", "--bundle", "v6e-2.9", "--dry-run", root=REPO_ROOT,
        env={"XLA_WHEELS_OUT": str(elsewhere), "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert plan.exit_code == 0, plan.output
    assert f"{elsewhere}/v6e-2.9/src/torch_xla" in plan.stdout
    # (test_build_host's preflight test shows the disk blocker printing this fix)


@skipif_missing("podman is not installed" if shutil.which("podman") is None else None)
@pytest.mark.slow
def test_builder_image_failure_is_an_error_and_base_image_is_a_build_arg(
    tmp_path: Path,
) -> None:
    # A real podman build whose base image points at a closed port: the build argument
    # reaches the engine (it tries that registry), and the failure is exit 1, not "done".
    port = free_port()
    result = run_cli(
        "builder-image", "--engine", "podman", "--image", "localhost/xw-test:never",
        "--build-arg", f"BASE_IMAGE=127.0.0.1:{port}/no-such/python:none",
        root=REPO_ROOT, inherit_env=True, timeout=180,
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert f"127.0.0.1:{port}/no-such/python:none" in result.output
    assert "error: podman could not build the builder image localhost/xw-test:never" in (
        result.stderr
    )
    assert re.search(r"builder image .*: failed in", result.stderr)
    assert "built" not in result.stdout
    bad = run_cli("builder-image", "--build-arg", "no-equals", "--dry-run", root=REPO_ROOT)
    assert bad.exit_code == 2 and "is not NAME=VALUE" in bad.stderr
