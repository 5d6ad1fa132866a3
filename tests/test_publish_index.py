"""publish / verify-install against a real pypiserver on 127.0.0.1 with htpasswd auth."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.publish_support import (
    BUNDLE,
    PASSWORD,
    USER,
    FakeWheels,
    IndexServer,
    make_publish_project,
    start_pypiserver,
)
from tests.servers import free_port, stop
from xla_host.filemode import file_sha256


@pytest.fixture
def project(tmp_path: Path, fake_wheels: FakeWheels) -> Path:
    return make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _publish(project: Path, index_url: str, env: dict[str, str]) -> CliResult:
    return run_cli(
        "publish", "--bundle", BUNDLE, "--index-url", index_url, env=env, root=project,
        inherit_env=True,
    )  # fmt: skip


@pytest.mark.slow
def test_upload_then_rerun_skips(project: Path, index_server: IndexServer) -> None:
    env = index_server.credentials
    first = _publish(project, index_server.url, env)
    assert first.exit_code == 0, first.output
    lines = [line for line in first.stdout.splitlines() if line.startswith(("uploaded", "skip"))]
    assert len(lines) == 2 and all(line.startswith("uploaded") for line in lines), first.stdout
    on_server = sorted(p.name for p in index_server.packages.iterdir())
    assert on_server == sorted(p.name for p in (project / "dist" / BUNDLE).glob("*.whl"))
    for name in on_server:
        served, built = index_server.packages / name, project / "dist" / BUNDLE / name
        assert file_sha256(served) == file_sha256(built)
    # publish keeps its commands and twine's output in the bundle's logs, no password.
    publish_log = (project / "out" / BUNDLE / "logs" / "publish.log").read_text()
    assert "twine upload" in publish_log and PASSWORD not in publish_log
    assert re.search(r"^  publish +\S+  ran$", first.stderr, re.MULTILINE)

    again = _publish(project, index_server.url, env)
    assert again.exit_code == 0, again.output
    assert again.stdout.count("skipped") == 2 and "uploaded" not in again.stdout
    assert "twine upload" not in again.stderr  # nothing was sent the second time


def test_same_name_different_hash_is_refused(
    project: Path,
    index_server: IndexServer,
    fake_wheels: FakeWheels,
) -> None:
    # Someone else put a different file under our torch_xla file name on the index.
    impostor = index_server.packages / fake_wheels.torch_xla.name
    shutil.copyfile(fake_wheels.torch_xla, impostor)
    _flip_byte(impostor)
    result = _publish(project, index_server.url, index_server.credentials)
    assert result.exit_code == 1, result.output
    assert file_sha256(impostor) in result.stderr
    assert file_sha256(fake_wheels.torch_xla) in result.stderr
    assert "nothing was uploaded" in result.stderr
    # Plan before act: the unrelated torch wheel was not uploaded either.
    assert sorted(p.name for p in index_server.packages.iterdir()) == [impostor.name]


@pytest.mark.parametrize("authenticate", ["update", "update,download,list"])
@pytest.mark.slow
def test_wrong_password_is_refused_without_leaking_it(
    project: Path, tmp_path: Path, authenticate: str
) -> None:
    process, server = start_pypiserver(tmp_path / f"index-{authenticate}", authenticate)
    wrong = "Wr0ng-and-Secret-9931"
    try:
        result = run_cli(
            "publish", "--bundle", BUNDLE, "--index-url", server.url,
            env={"TWINE_USERNAME": USER, "TWINE_PASSWORD": wrong}, root=project,
            inherit_env=True,
        )  # fmt: skip
    finally:
        stop(process)
    assert result.exit_code == 1, result.output
    assert "reject" in result.stderr or "refused" in result.stderr
    assert "TWINE_PASSWORD" in result.stderr  # the fix names where credentials come from
    assert wrong not in result.output
    assert PASSWORD not in result.output
    assert wrong not in (project / "out" / BUNDLE / "logs" / "publish.log").read_text()
    assert re.search(r"^  publish +\S+  failed$", result.stderr, re.MULTILINE)
    assert list(server.packages.iterdir()) == []


def test_credentials_in_the_url_are_refused_and_not_echoed(project: Path) -> None:
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:9/simple/"
    result = run_cli(
        "publish",
        "--bundle",
        BUNDLE,
        "--index-url",
        url,
        root=project,
        inherit_env=True,
    )
    assert result.exit_code == 2, result.output
    assert PASSWORD not in result.output
    assert "TWINE_USERNAME" in result.stderr


@pytest.mark.slow
def test_index_down_gives_a_clear_error(project: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/simple/"
    # One retry, not the default three (2 + 4 + 8 s of sleep): the claim is the message;
    # test_network_faults.py bounds the retries.
    result = run_cli(
        "publish", "--bundle", BUNDLE, "--index-url", url,
        env={"TWINE_USERNAME": USER, "TWINE_PASSWORD": PASSWORD, "XLA_WHEELS_NET_RETRIES": "1"},
        timeout=120, root=project, inherit_env=True,
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "not reachable" in result.stderr and url in result.stderr
    assert "fix: check that the index server is running" in result.stderr
    assert "Traceback" not in result.output


def test_wheel_changed_after_locking_is_not_published(
    project: Path,
    index_server: IndexServer,
) -> None:
    wheel = next((project / "dist" / BUNDLE).glob("torch_xla-*.whl"))
    locked = file_sha256(wheel)
    _flip_byte(wheel)
    result = _publish(project, index_server.url, index_server.credentials)
    assert result.exit_code == 1, result.output
    assert locked in result.stderr and file_sha256(wheel) in result.stderr
    assert list(index_server.packages.iterdir()) == []


@pytest.mark.slow
def test_verified_install_then_tampered_index_file_is_refused(
    project: Path,
    index_server: IndexServer,
) -> None:
    env = index_server.credentials
    published = _publish(project, index_server.url, env)
    assert published.exit_code == 0, published.output

    verified = run_cli(
        "verify-install",
        "--bundle",
        BUNDLE,
        "--index-url",
        index_server.url,
        env=env,
        root=project,
        inherit_env=True,
    )
    assert verified.exit_code == 0, verified.output
    assert "verify-install pub-1: PASSED" in verified.stdout
    assert "imported from the fresh venv" in verified.stdout
    assert "provenance" in verified.stdout and "matches wheels.lock" in verified.stdout
    report = json.loads((project / "out" / BUNDLE / "verify-install" / "report.json").read_text())
    assert report["passed"] is True
    assert PASSWORD not in verified.output

    # One byte of the torch_xla file on the index changes after it was locked and published.
    on_index = next(index_server.packages.glob("torch_xla-*.whl"))
    _flip_byte(on_index)
    refused = run_cli(
        "verify-install",
        "--bundle",
        BUNDLE,
        "--index-url",
        index_server.url,
        env=env,
        root=project,
        inherit_env=True,
    )
    assert refused.exit_code == 1, refused.output
    assert "DO NOT MATCH THE HASHES" in refused.stdout
    assert file_sha256(on_index) in refused.stdout
    assert "verify-install pub-1: FAILED" in refused.stdout
    assert PASSWORD not in refused.output
    # The fix says what publish allows (it never overwrites), and following it works: the
    # index's admin deletes the file, publish uploads the locked one, verify-install passes.
    assert "publish never overwrites a file on an index" in refused.stderr
    assert "have the index's admin delete that file, then `make publish" in refused.stderr
    on_index.unlink()
    again = _publish(project, index_server.url, env)
    assert again.exit_code == 0, again.output
    assert re.search(r"^uploaded +torch_xla-", again.stdout, re.MULTILINE), again.stdout
    fixed = run_cli(
        "verify-install",
        "--bundle",
        BUNDLE,
        "--index-url",
        index_server.url,
        env=env,
        root=project,
        inherit_env=True,
    )
    assert fixed.exit_code == 0, fixed.output


@pytest.mark.slow
def test_static_index_installs_with_hashes(project: Path, tmp_path: Path) -> None:
    published = run_cli("publish", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert published.exit_code == 0, published.output
    simple = project / "dist" / BUNDLE / "simple"
    page = (simple / "torch-xla" / "index.html").read_text()
    wheel = next((project / "dist" / BUNDLE).glob("torch_xla-*.whl"))
    assert f"#sha256={file_sha256(wheel)}" in page
    assert (simple / "index.html").read_text().count("<a ") == 2

    verified = run_cli("verify-install", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert verified.exit_code == 0, verified.output
    assert simple.as_uri() in verified.stdout
    assert "imported from the fresh venv" in verified.stdout
    # The venv's pip is the one `python -m venv` would install (the interpreter's bundled
    # wheel), unpacked once per machine rather than installed by ensurepip at every run.
    import ensurepip

    venv = project / "out" / BUNDLE / "verify-install" / "venv"
    assert f"pip on {venv}'s path from pip-{ensurepip.version()}-py3-none-any.whl" in (
        verified.output
    )
    assert (venv / "bin" / "python").exists()
    assert not list(venv.glob("lib/*/site-packages/pip"))
