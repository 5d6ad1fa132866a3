"""The CycloneDX SBOM in each wheel (PEP 770): made from the provenance, valid against the
CycloneDX schema (the library's own validator), byte-reproducible, listed in RECORD, and
read by doctor, where a changed byte is a named failure."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    XLA_VERSION,
    build_fake_wheels,
    host_venv,
    make_publish_project,
    provenance,
)
from tests.synthetic_upstream import Synthetic, cli_args, make_synthetic
from tests.test_run_isolation import PACKAGE, minimal_wheel
from xla_host.provenance import PatchDigest
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels import sbom, wheel_stamp

HOST = ("--mode", "host", "--host-python", sys.executable)
EPOCH = 1700000000


@pytest.mark.slow
def test_the_document_is_valid_cyclonedx_and_reproducible_with_a_content_serial() -> None:
    first = sbom.sbom_bytes("torch_xla", "2.9.0+gitc04e61c", provenance(), EPOCH)
    assert first == sbom.sbom_bytes("torch_xla", "2.9.0+gitc04e61c", provenance(), EPOCH)
    sbom.validate(first)
    data = json.loads(first)
    assert data["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"
    # Another input (a patch digest) gives another serial number: derived from content.
    patched = provenance()
    torch_xla = replace(
        patched.components["torch_xla"], patches=(PatchDigest("patches/x.patch", "ab" * 32),)
    )
    patched = replace(patched, components={**patched.components, "torch_xla": torch_xla})
    other = json.loads(sbom.sbom_bytes("torch_xla", "2.9.0+gitc04e61c", patched, EPOCH))
    assert re.fullmatch(r"urn:uuid:[0-9a-f-]{36}", data["serialNumber"])
    assert other["serialNumber"] != data["serialNumber"]
    facts = sbom.read_facts(json.dumps(other).encode())
    assert facts.components["torch_xla"].patches == (PatchDigest("patches/x.patch", "ab" * 32),)


@pytest.mark.slow
def test_a_document_that_breaks_the_schema_is_named() -> None:
    data = json.loads(sbom.sbom_bytes("torch", "2.9.0a0", provenance(), EPOCH))
    data["components"][0]["type"] = "not-a-type"
    problems = sbom.check(json.dumps(data).encode(), "torch", "2.9.0a0", None)
    assert len(problems) == 1 and "not a valid CycloneDX 1.6 document" in problems[0]


@pytest.fixture(scope="module")
def syn_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Synthetic, list[Path]]:
    syn = make_synthetic(tmp_path_factory.mktemp("sbom-build"))
    result = run_cli(
        *cli_args(syn, *HOST), env={"HOME": str(syn.root.parent), "SOURCE_DATE_EPOCH": str(EPOCH)},
        timeout=600,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return syn, sorted((syn.root / "dist" / "syn").glob("*.whl"))


@pytest.mark.slow
def test_each_built_wheel_carries_its_sbom_from_the_provenance(
    syn_build: tuple[Synthetic, list[Path]],
) -> None:
    syn, (torch, torch_xla) = syn_build
    provenance_file = wheel_stamp.read_provenance(torch_xla)
    for wheel, package in ((torch, "torch"), (torch_xla, "torch_xla")):
        name = sbom.arcname(wheel)
        assert re.fullmatch(rf"{package}-[^/]+\.dist-info/sboms/xla-wheels\.cdx\.json", name)
        raw = sbom.read_sbom(wheel)
        with zipfile.ZipFile(wheel) as archive:
            record = archive.read(name.split("/sboms/")[0] + "/RECORD").decode()
        assert sbom.record_problem(record, name, raw) is None
        version = parse_wheel_name(wheel.name).version
        assert sbom.check(raw, package, version, provenance_file) == []
        assert json.loads(raw)["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"
    torch_facts = sbom.read_facts(sbom.read_sbom(torch))
    assert set(torch_facts.components) == {"torch"}
    xla_facts = sbom.read_facts(sbom.read_sbom(torch_xla))
    for component in ("torch", "torch_xla", "openxla"):
        assert xla_facts.components[component].commit == syn.commits[component]
    assert [p.path for p in xla_facts.components["torch_xla"].patches] == [
        "patches/torch_xla/0001-load-cache.patch",
        "patches/torch_xla/0002-comment.patch",
    ]
    # torch_xla's own openxla_patches are listed with OpenXLA, with their sha256.
    assert "openxla_patches/no_fortify.diff" in [
        p.path for p in xla_facts.components["openxla"].patches
    ]
    # The very document the provenance gives: one source, same bytes.
    version = parse_wheel_name(torch_xla.name).version
    assert sbom.read_sbom(torch_xla) == sbom.sbom_bytes(
        "torch_xla", version, provenance_file, EPOCH
    )


@pytest.mark.slow
def test_doctor_reads_the_sboms_and_names_a_changed_byte(tmp_path: Path) -> None:
    fake = build_fake_wheels(tmp_path / "wheels")
    wheels = [fake.torch, fake.torch_xla]
    for wheel in wheels:
        sbom.add_sbom(wheel, provenance(), EPOCH)
    project = make_publish_project(tmp_path, wheels)
    python = host_venv(tmp_path, wheels)
    cache = tmp_path / f"xla_cache_{BUNDLE}_txla{XLA_VERSION}"  # the contract's name
    cache.mkdir()
    env = {
        "PJRT_DEVICE": "TPU",
        "XLA_NO_SPECIAL_SCALARS": "1",
        "XLA_PERSISTENT_CACHE_PATH": str(cache),
    }
    args = ("doctor", "--bundle", BUNDLE, "--python", str(python))
    healthy = run_cli(*args, env=env, root=project, inherit_env=True)
    assert healthy.exit_code == 0, healthy.output
    sbom_line = r"ok +sbom torch_xla +torch_xla-[^ ]+/sboms/xla-wheels.cdx.json"
    assert re.search(sbom_line, healthy.stdout), healthy.stdout
    assert re.search(r"ok +sbom torch +", healthy.stdout), healthy.stdout

    site = Path(
        subprocess.run(
            [str(python), "-c", "import torch_xla, os; print(os.path.dirname(torch_xla.__file__))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    ).parent  # fmt: skip
    (installed,) = site.glob("torch_xla-*.dist-info/sboms/xla-wheels.cdx.json")
    text = installed.read_text()
    installed.write_text(text.replace(provenance().components["openxla"].commit[:8], "00000000"))
    tampered = run_cli(*args, env=env, root=project, inherit_env=True)
    assert tampered.exit_code == 1, tampered.output
    assert re.search(
        r"FAIL +sbom torch_xla +torch_xla-[^ ]+/sboms/xla-wheels.cdx.json does not match its "
        r"RECORD hash",
        tampered.stdout,
    ), tampered.stdout
    assert "the torch_xla SBOM's openxla (commit, patches) differs" in tampered.stdout

    # Without the file, when wheels.lock says the wheel carries one: a failure (a wheel
    # from a build stopped before its SBOM step, or a changed install).
    shutil.rmtree(installed.parent)
    missing = run_cli(*args, env=env, root=project, inherit_env=True)
    assert missing.exit_code == 1, missing.output
    assert re.search(
        r"FAIL +sbom torch_xla +no .dist-info/sboms/xla-wheels.cdx.json, but wheels.lock "
        r"records its wheel with torch_xla-[^ ]+/sboms/xla-wheels.cdx.json",
        missing.stdout,
    ), missing.stdout

    # A lock that names no SBOM (written before SBOMs; a stock wheel): a warning, not a pass.
    lock = project / "wheels.lock"
    lock.write_text(re.sub(r'^sbom = ".*"\n', "", lock.read_text(), flags=re.MULTILINE))
    unnamed = run_cli(*args, env=env, root=project, inherit_env=True)
    assert re.search(r"WARN +sbom torch_xla +no .dist-info/sboms/", unnamed.stdout), unnamed.stdout


@pytest.mark.slow
def test_require_provenance_fails_a_wheel_without_its_sbom_even_when_the_lock_names_none(
    tmp_path: Path,
) -> None:
    # verify-install --require-provenance once passed when the SBOM and the lock's `sbom`
    # key were removed together: without the key, a missing SBOM was only a warning.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-index", "--no-deps", str(minimal_wheel(tmp_path / "wheels"))],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    projects = (PACKAGE,)
    (warned,) = sbom.check_installed(str(python), None, projects)
    assert warned.status == "WARN"  # a stock wheel: nothing was promised
    (failed,) = sbom.check_installed(str(python), None, projects, required=[PACKAGE])
    assert failed.status == "FAIL" and "provenance is required" in failed.detail
