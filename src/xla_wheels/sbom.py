"""The CycloneDX SBOM inside each of our wheels (PEP 770: ``<name>.dist-info/sboms/``).

One source: the document is computed from the wheel's :class:`~xla_host.provenance.Provenance`
(the same structure the provenance file is written from), never from a second reading of
the manifests. It lists each source component with its full commit (CycloneDX pedigree),
each patch file with its sha256 (nested ``file`` components), torch_xla's own
``openxla_patches``, the build settings and the toolchain (build-time tools, scope
``excluded``: not shipped in the wheel).

What it does not list, on purpose: the bundle, its manifest digest, the component
remotes and the runtime pins (libtpu, jax). Bundles with the same inputs share one stage
and so the very same wheel bytes (``builder.stamp``); a bundle fact inside the wheel
would be wrong for all bundles but the first. Those facts are per bundle and go into the
signed attestation next to the wheel (``attestation``).

Where it is made: on the host, right after a recipe has put its wheel into the stage
(``builder.stage.build``), with cyclonedx-python-lib from the pipeline's environment. The
builder image runs only the standard library (``builder.run_recipe``), so the library is not
there; the stamped provenance it wrote is read back from the wheel, which keeps one source.

Byte-reproducible: fixed ``bom-ref`` values, a serial number derived from the content
(uuid5), the timestamp from SOURCE_DATE_EPOCH, and the wheel re-packed by
``wheel_stamp.repack_wheel`` (RECORD lists the document with its hash).

The torch wheel's document holds the torch component only, with the settings its stage
key covers (image or host Python, C++ ABI): a torch stage is shared by every torch_xla
built on it.
"""

from __future__ import annotations

import csv
import io
import json
import re
import uuid
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from xla_host.installed_metadata import ProbeFailed, read_installed
from xla_host.provenance import ComponentProvenance, PatchDigest, Provenance
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels import wheel_stamp

if TYPE_CHECKING:
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component

# cyclonedx-python-lib is imported in the functions that write or validate a document,
# not at the top: it took 25-70 ms of every command's start (python -X importtime), and
# this module is imported by every build command, most of which never write an SBOM.
# tests/test_cli_startup.py keeps it out of the start.

SBOM_NAME = wheel_stamp.SBOM_NAME
SCHEMA_VERSION = "1.6"
"""The CycloneDX version of the documents we write and accept."""
PROPERTY = "xla-wheels"
"""Prefix of our CycloneDX property names (``xla-wheels:series_sha256`` ...)."""

_DIST_INFO = re.compile(r"[^/]+\.dist-info/")


class SbomError(ValueError):
    """An SBOM is missing, malformed or does not match; the message names what."""


def facts_for(package: str, provenance: Provenance) -> Provenance:
    """The provenance facts that shape ``package``'s wheel.

    torch_xla: all of them. torch: its own component and the settings of its stage key,
    so that every torch_xla built on the same torch stage sees the same torch document.
    """
    if package == "torch_xla":
        return provenance
    if package != "torch":
        raise ValueError(f"no SBOM facts for {package}: only torch and torch_xla")
    build = provenance.build
    torch_build = replace(build, engine=build.mode, knobs={"cxx_abi": build.knobs.get("cxx_abi")})
    return Provenance(provenance.built_by, torch_build, {"torch": provenance.components["torch"]})


def _file(path: str, sha256: str) -> Component:
    from cyclonedx.model import HashAlgorithm, HashType
    from cyclonedx.model.component import Component, ComponentType

    return Component(
        type=ComponentType.FILE,
        name=path,
        bom_ref=f"patch:{path}",
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha256)],
    )


def _source(name: str, component: ComponentProvenance, extra: tuple[PatchDigest, ...]) -> Component:
    from cyclonedx.model import Property
    from cyclonedx.model.component import Commit, Component, ComponentType, Pedigree

    patches = [_file(p.path, p.sha256) for p in (*component.patches, *extra)]
    return Component(
        type=ComponentType.LIBRARY,
        name=name,
        version=component.version or component.commit,
        bom_ref=f"source:{name}",
        pedigree=Pedigree(commits=[Commit(uid=component.commit)]),
        components=patches,
        properties=[Property(name=f"{PROPERTY}:series_sha256", value=component.series_sha256)],
    )


def _bom(package: str, version: str, facts: Provenance, epoch: int) -> Bom:
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentScope, ComponentType
    from packageurl import PackageURL

    sources = []
    for name, component in sorted(facts.components.items()):
        # torch_xla's own openxla_patches are applied to OpenXLA in the build.
        extra = facts.torch_xla_openxla_patches if name == "openxla" else ()
        sources.append(_source(name, component, extra))
    tools = [
        Component(
            type=ComponentType.APPLICATION,
            name=key,
            version=value,
            bom_ref=f"toolchain:{key}",
            scope=ComponentScope.EXCLUDED,
        )
        for key, value in sorted(facts.toolchain.items())
    ]
    build = facts.build
    settings = {"mode": build.mode, "engine": build.engine, "image": build.image or ""}
    settings.update({f"knob.{k}": json.dumps(v) for k, v in sorted(build.knobs.items())})
    wheel = Component(
        type=ComponentType.LIBRARY,
        name=package,
        version=version,
        bom_ref=f"wheel:{package}",
        purl=PackageURL(type="pypi", name=package.replace("_", "-"), version=version),
    )
    bom = Bom(
        metadata=BomMetaData(
            component=wheel,
            timestamp=datetime.fromtimestamp(max(epoch, 0), UTC),
            properties=[
                Property(name=f"{PROPERTY}:built_by", value=facts.built_by),
                *(Property(name=f"{PROPERTY}:build.{k}", value=v) for k, v in settings.items()),
            ],
        ),
        components=[*sources, *tools],
    )
    bom.register_dependency(wheel, sources)
    return bom


def sbom_bytes(package: str, version: str, provenance: Provenance, epoch: int) -> bytes:
    """The document for ``package``'s wheel at ``version``: same inputs, same bytes."""
    facts = facts_for(package, provenance)
    seed = json.dumps(
        {"package": package, "version": version, "epoch": epoch, "facts": facts.to_json()},
        sort_keys=True,
    )
    from cyclonedx.output import make_outputter
    from cyclonedx.schema import OutputFormat, SchemaVersion

    bom = _bom(package, version, facts, epoch)
    bom.serial_number = uuid.uuid5(uuid.NAMESPACE_URL, "xla-wheels:sbom:" + seed)
    schema = SchemaVersion.from_version(SCHEMA_VERSION)
    text = make_outputter(bom, OutputFormat.JSON, schema).output_as_string(indent=2)
    # Sorted keys: the library's key order is its own and may change between releases.
    return (json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n").encode()


def validate(raw: bytes) -> None:
    """Raises :class:`SbomError` when ``raw`` is not a valid CycloneDX 1.6 JSON document."""
    # Imported here, not at the top: the validator pulls in jsonschema's format checkers,
    # whose rfc3987_syntax builds a grammar on import (0.75 s of the 1.4 s every command
    # of the CLI took to start, measured with python -X importtime), and only the commands
    # that read an SBOM validate one.
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    schema = SchemaVersion.from_version(SCHEMA_VERSION)
    error = JsonStrictValidator(schema).validate_str(raw.decode("utf-8", errors="replace"))
    if error is not None:
        raise SbomError(f"not a valid CycloneDX {SCHEMA_VERSION} document: {error}")


def arcname(wheel: Path) -> str:
    """``<name>-<version>.dist-info/sboms/xla-wheels.cdx.json`` inside ``wheel``."""
    package = parse_wheel_name(wheel.name).project
    with zipfile.ZipFile(wheel) as archive:
        found = sorted({n.split("/", 1)[0] for n in archive.namelist() if _DIST_INFO.match(n)})
    if len(found) != 1:
        raise SbomError(f"the {package} wheel has {len(found)} .dist-info directories")
    return f"{found[0]}/sboms/{SBOM_NAME}"


def add_sbom(wheel: Path, provenance: Provenance, epoch: int) -> str:
    """Write the document into ``wheel`` (re-packed, RECORD updated); returns its path.

    The torch_xla wheel's document is computed from the provenance stamped into that
    wheel (it has the toolchain and openxla_patches of the build); ``provenance`` is
    the one the build stage composed, used for torch.
    """
    parts = parse_wheel_name(wheel.name)
    package, version = parts.project, parts.version
    if package == "torch_xla":
        provenance = wheel_stamp.read_provenance(wheel)
    name = arcname(wheel)
    wheel_stamp.add_file_to_wheel(
        wheel, name, sbom_bytes(package, version, provenance, epoch), epoch
    )
    return name


def read_sbom(wheel: Path) -> bytes:
    """The document inside ``wheel``; :class:`SbomError` when it has none."""
    name = arcname(wheel)
    with zipfile.ZipFile(wheel) as archive:
        try:
            return archive.read(name)
        except KeyError:
            raise SbomError(f"{wheel.name} has no {name}") from None


@dataclass(frozen=True)
class SbomFacts:
    """What a document says about the inputs, read back for the checks."""

    package: str
    version: str
    components: Mapping[str, ComponentProvenance]


def read_facts(raw: bytes) -> SbomFacts:
    """Schema-validate ``raw`` and read its components back; :class:`SbomError` if wrong."""
    validate(raw)
    data = json.loads(raw)
    wheel = data.get("metadata", {}).get("component", {})
    components: dict[str, ComponentProvenance] = {}
    for node in data.get("components", []):
        if not str(node.get("bom-ref", "")).startswith("source:"):
            continue
        commits = node.get("pedigree", {}).get("commits", [])
        if len(commits) != 1:
            raise SbomError(f"component {node.get('name')} has {len(commits)} commits, not 1")
        patches = []
        for child in node.get("components", []):
            hashes = {h.get("alg"): h.get("content") for h in child.get("hashes", [])}
            patches.append(PatchDigest(str(child.get("name")), str(hashes.get("SHA-256"))))
        properties = {str(p.get("name")): str(p.get("value")) for p in node.get("properties", [])}
        components[str(node.get("name"))] = ComponentProvenance(
            commit=str(commits[0].get("uid")),
            version=None,
            patches=tuple(patches),
            series_sha256=properties.get(f"{PROPERTY}:series_sha256", ""),
        )
    return SbomFacts(str(wheel.get("name")), str(wheel.get("version")), components)


def record_problem(record_text: str, name: str, raw: bytes) -> str | None:
    """A problem when RECORD's line for ``name`` does not hash to ``raw`` (a changed byte)."""
    for row in csv.reader(io.StringIO(record_text)):
        if row and row[0] == name:
            if len(row) < 2 or row[1] != wheel_stamp.record_hash(raw):
                return f"{name} does not match its RECORD hash (changed after the build)"
            return None
    return f"{name} is not listed in RECORD"


def check(raw: bytes, package: str, version: str, provenance: Provenance | None) -> list[str]:
    """Problems of one wheel's document: schema, the wheel it names, and (torch_xla) the
    provenance it was computed from. Empty when it is sound."""
    try:
        facts = read_facts(raw)
    except ValueError as error:  # an SbomError, or not JSON
        return [f"the {package} SBOM: {error}"]
    problems = []
    if facts.package != package or facts.version != version:
        problems.append(
            f"the {package} SBOM names {facts.package} {facts.version}, installed is "
            f"{package} {version}"
        )
    if provenance is not None:
        expected = facts_for(package, provenance).components
        for name, built in sorted(expected.items()):
            listed = facts.components.get(name)
            extra = provenance.torch_xla_openxla_patches if name == "openxla" else ()
            # CycloneDX keeps nested components as a set (sorted): the order of a series
            # is in its series_sha256, compared here too.
            want = (built.commit, built.series_sha256, sorted((*built.patches, *extra), key=str))
            got = listed and (listed.commit, listed.series_sha256, sorted(listed.patches, key=str))
            if got != want:
                problems.append(
                    f"the {package} SBOM's {name} (commit, patches) differs from the "
                    "provenance file's"
                )
    return problems


@dataclass(frozen=True)
class InstalledCheck:
    status: str
    """``ok``, ``FAIL`` or ``WARN``."""
    project: str
    detail: str


def check_installed(
    python: str,
    provenance: Provenance | None,
    projects: tuple[str, ...] = ("torch", "torch_xla"),
    locked: Mapping[str, str] | None = None,
    *,
    required: Iterable[str] = (),
) -> list[InstalledCheck]:
    """Each installed project's SBOM: present, in RECORD with its hash, schema-valid, and
    saying what the provenance file says. A changed byte is a named failure.

    ``locked``: project -> the SBOM path wheels.lock says its wheel carries. Such a project
    installed without it fails (a wheel from an unfinished build stage, or a changed
    install); without a lock entry naming one (a stock wheel, a lock from before SBOMs)
    a missing SBOM is a warning, unless the project is ``required`` (``verify-install
    --require-provenance``, for the bundle's own wheels): then it fails too, so removing
    the SBOM and the lock's ``sbom`` key together no longer passes."""
    expected = {_normalized(project): path for project, path in (locked or {}).items()}
    must = {_normalized(project) for project in required}
    try:
        found = read_installed(python, projects, with_files=projects)
    except ProbeFailed as error:
        return [InstalledCheck("FAIL", "sbom", f"cannot read SBOMs: {error.message}")]
    results = []
    for project, dist in found.dists.items():
        site = Path(dist.site)
        sboms = (f for f in dist.files if ".dist-info/" in f and f.endswith(f"/sboms/{SBOM_NAME}"))
        name = next(sboms, None)
        if name is None or not (site / name).is_file():
            if promised := expected.get(_normalized(project)):
                results.append(
                    InstalledCheck(
                        "FAIL",
                        project,
                        f"no .dist-info/sboms/{SBOM_NAME}, but wheels.lock records its wheel "
                        f"with {promised}: not the wheel the lock names, or an unfinished build",
                    )
                )
                continue
            if _normalized(project) in must:
                results.append(
                    InstalledCheck(
                        "FAIL",
                        project,
                        f"no .dist-info/sboms/{SBOM_NAME}, and provenance is required: this "
                        "wheel cannot be tied to what it was built from",
                    )
                )
                continue
            why = "a stock wheel, or built before the build stage added SBOMs"
            results.append(
                InstalledCheck("WARN", project, f"no .dist-info/sboms/{SBOM_NAME} ({why})")
            )
            continue
        raw = (site / name).read_bytes()
        record = next((f for f in dist.files if f.endswith(".dist-info/RECORD")), None)
        record_text = (site / record).read_text(encoding="utf-8") if record else ""
        problems = [p for p in [record_problem(record_text, name, raw)] if p]
        problems += check(raw, project, dist.version, provenance)
        detail = "; ".join(problems) or f"{name}: CycloneDX valid, RECORD hash matches"
        results.append(InstalledCheck("FAIL" if problems else "ok", project, detail))
    return results


def _normalized(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()
