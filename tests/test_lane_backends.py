"""Lane backends: each kind of lanes.toml is one ``LaneBackend`` of the registry, and the
release steps reach a lane only through it.

Real parts: lanes.toml files read by ``load_config``, static lanes in temporary
directories, the real publish/status steps, and a kind defined here the way a new backend
module would define one (a subclass and its ``LaneKind``), registered with one line.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    make_publish_project,
    start_pypiserver,
)
from tests.servers import stop
from tests.test_cache_pack import keypair
from tests.test_cache_pack import manifest as pack_manifest
from xla_host import bundle_document, cache_pack, filemode
from xla_host.errors import PipelineError
from xla_host.filemode import file_sha256
from xla_host.tables import Field, Table
from xla_wheels.options import DEFAULT_NETWORK, NetworkPolicy
from xla_wheels.publish.static_index import write_static_index
from xla_wheels.publish.upload import Outcome
from xla_wheels.publish.wheels import LocalWheel
from xla_wheels.release import devpi, lane_kinds, lane_packs, lanes, promote, status
from xla_wheels.release.lane_backend import LaneBackend, LaneKind, PublishedDocument, write_document
from xla_wheels.release.lane_index import IndexLane
from xla_wheels.release.lane_static import StaticLane
from xla_wheels.wheels_lock import WheelRecord, read_lock


def _config(root: Path, text: str) -> lanes.LanesConfig:
    (root / "build").mkdir(exist_ok=True)
    (root / "build" / "lanes.toml").write_text(text)
    return lanes.load_config(root)


def test_each_kind_of_lane_is_read_into_its_backend(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        'publish-lane = "here"\n'
        '[lanes.here]\npath = "dist/lanes/here"\n'
        '[lanes.named]\nbackend = "static"\npath = "elsewhere"\n'
        '[lanes.remote]\nindex-url = "https://user:secret@pypi.example/simple"\n'
        '[lanes.pushed]\nbackend = "devpi"\nserver = "https://devpi.example"\nindex = "t/v"\n',
    )
    here, named, remote, pushed = (config.lane(n) for n in ("here", "named", "remote", "pushed"))
    assert here.backend == StaticLane("here", tmp_path / "dist" / "lanes" / "here")
    assert named.kind == "static" and named.backend.directory == tmp_path / "elsewhere"
    assert remote.backend == IndexLane("remote", "https://user:secret@pypi.example/simple/")
    assert "secret" not in remote.where and remote.backend.directory is None
    assert remote.backend.credentials_url == "https://user:secret@pypi.example/"
    assert isinstance(pushed.backend, devpi.DevpiLane) and pushed.kind == "devpi"
    assert pushed.simple_url == "https://devpi.example/t/v/+simple/"
    assert pushed.backend.can_push_from(pushed.backend)
    assert not pushed.backend.can_push_from(remote.backend)


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('backend = "s3"\npath = "x"', "'s3' is not one of ('static', 'index', 'devpi')"),
        ('path = "x"\nindex-url = "https://i/simple/"', "give exactly one of path or index-url"),
        ('description = "nowhere"', "give exactly one of path or index-url"),
        ('backend = "static"\nindex-url = "https://i/simple/"', "unknown key"),
        ('backend = "devpi"\nserver = "https://d/"\nindex = "t/v"\nrequire-signature = true',
         "unknown key"),
    ],
)  # fmt: skip
def test_a_lane_of_no_kind_or_with_another_kinds_keys_is_refused_naming_the_key(
    tmp_path: Path, table: str, problem: str
) -> None:
    with pytest.raises(PipelineError) as refused:
        _config(tmp_path, f"[lanes.x]\n{table}\n")
    assert problem in refused.value.message
    assert refused.value.exit_code == 2 and "lanes.toml" in (refused.value.fix or "")


# --- a new kind: one module's worth of code and one line in the registry ---------------


@dataclass(frozen=True)
class SuffixedLane(StaticLane):
    """A kind a team might add: a static lane whose directory is named by a key of its
    own (``share``) under a root every lane of the kind shares."""

    kind = "share"


def _make_share(name: str, table: Table, fields: Mapping[str, Any], root: Path) -> SuffixedLane:
    return SuffixedLane(name, (root / "shares" / fields["share"]).resolve())


SHARE = LaneKind("share", (Field("share", str, required=True),), _make_share)


@pytest.mark.slow
def test_a_kind_registered_with_one_line_publishes_and_is_read_back_by_status(
    tmp_path: Path,
    fake_wheels: FakeWheels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(lane_kinds.KINDS, SHARE.name, SHARE)  # the registry's one line
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    config = _config(project, '[lanes.validation]\nbackend = "share"\nshare = "team-a"\n')
    lane = config.lane("validation")
    assert lane.kind == "share" and lane.backend.directory == project / "shares" / "team-a"
    lock = read_lock(project / "wheels.lock")
    outcomes = promote.publish_to_lane(
        project, lock, BUNDLE, project / "dist" / BUNDLE, lane, network=DEFAULT_NETWORK
    )
    assert [o.action for o in outcomes] == ["copied", "copied"]
    found = status.lane_status(lane, lanes.read_record(project), DEFAULT_NETWORK)
    assert found.reachable and not (found.extra or found.missing or found.changed)
    # What status calls drift comes from the backend too: a file changed in the share.
    served: Sequence[Path] = sorted((project / "shares" / "team-a").glob("*.whl"))
    shutil.copyfile(served[0], served[1])
    drifted = status.lane_status(lane, lanes.read_record(project), DEFAULT_NETWORK)
    assert [line.split(":")[0] for line in drifted.changed] == [served[1].name]


@dataclass(frozen=True)
class FlatLane(LaneBackend):
    """A kind written against the protocol alone (no shipped kind's code): the wheels in
    one directory with a ``simple/`` index over them. It says nothing about cache packs,
    so it keeps none: the protocol's refusal is its own."""

    lane: str
    root: Path
    kind = "flat"

    @property
    def where(self) -> str:
        return str(self.root)

    @property
    def simple_url(self) -> str:
        return (self.root / "simple").as_uri() + "/"

    @property
    def directory(self) -> Path:
        return self.root

    def put(
        self, wheels: Sequence[LocalWheel], envelopes: Sequence[Path], *, network: NetworkPolicy
    ) -> list[Outcome]:
        self.root.mkdir(parents=True, exist_ok=True)
        for wheel in wheels:
            filemode.copy_by_rename(wheel.path, self.root / wheel.record.name)
        write_static_index(self.root, [w.record for w in wheels])
        return [Outcome(w.record.name, "copied", w.sha256) for w in wheels]

    def fetch(
        self, records: Sequence[WheelRecord], workdir: Path, *, network: NetworkPolicy
    ) -> list[str]:
        for record in records:
            shutil.copyfile(self.root / record.name, workdir / record.name)
        return []

    def served(self, projects: Sequence[str], *, network: NetworkPolicy) -> dict[str, str]:
        return {p.name: file_sha256(p) for p in self.root.glob("*.whl")}

    def put_document(
        self, root: Path, bundle: str, raw: bytes, *, network: NetworkPolicy
    ) -> PublishedDocument:
        return PublishedDocument(*write_document(self.documents_dir(root), bundle, raw))


FLAT = LaneKind(
    "flat",
    (Field("dir", str, required=True),),
    lambda name, table, fields, root: FlatLane(name, (root / fields["dir"]).resolve()),
)


def test_a_kind_written_against_the_protocol_alone_is_promoted_into_and_refuses_packs(
    tmp_path: Path,
    fake_wheels: FakeWheels,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(lane_kinds.KINDS, FLAT.name, FLAT)  # the registry's one line
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    config = _config(
        project,
        '[lanes.validation]\npath = "dist/lanes/validation"\n'
        '[lanes.preferred]\nbackend = "flat"\ndir = "flat/preferred"\n'
        'promote-from = "validation"\n',
    )
    source, lane = config.lane("validation"), config.lane("preferred")
    lock = read_lock(project / "wheels.lock")
    promote.publish_to_lane(
        project, lock, BUNDLE, project / "dist" / BUNDLE, source, network=DEFAULT_NETWORK
    )
    # A cache pack of the bundle in the source lane (a static lane keeps packs).
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "1234567890123").write_bytes(b"an executable")
    private, _ = keypair(tmp_path, "pack")
    pack, full = cache_pack.write_pack(tmp_path / "packs", cache, private,
                                       pack_manifest(bundle=BUNDLE))  # fmt: skip
    lane_packs.publish_pack(source, pack, full, {BUNDLE: "serves"})
    # The new kind refuses a pack through the protocol, naming itself, with the fix.
    with pytest.raises(lanes.LaneError) as refused:
        lane_packs.publish_pack(lane, pack, full, {BUNDLE: "serves"})
    assert refused.value.message.startswith("lane preferred (backend 'flat', ")
    assert "name a pack store for the lane" in (refused.value.fix or "")
    # A promotion into it: the wheels by the kind's own put, the packs stay in the source.
    capsys.readouterr()
    _, outcomes = promote.promote(project, lock, BUNDLE, lane, source, network=DEFAULT_NETWORK,
                                  dist=project / "dist" / BUNDLE)  # fmt: skip
    assert [o.action for o in outcomes] == ["copied", "copied"]
    assert f"1 cache pack(s) of {BUNDLE} stay in lane validation" in capsys.readouterr().err
    found = status.lane_status(lane, lanes.read_record(project), DEFAULT_NETWORK)
    assert found.reachable and found.bundle == BUNDLE and found.packs == []
    assert found.retained == {}  # not "keeps the cache packs of: <bundle>" for a lane of none
    assert not (found.extra or found.missing or found.changed)


@pytest.mark.slow
def test_a_changed_document_is_a_new_file_on_the_index_and_hosts_take_the_one_they_name(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    process, index = start_pypiserver(tmp_path / "index", "update")
    try:
        project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
        lanes_toml = f'[lanes.validation]\nindex-url = "{index.url}"\n'
        copy = project / "dist" / "lanes" / "validation" / "bundles" / f"{BUNDLE}.json"
        digests = []
        for policy in ("", '[lanes.validation.policy]\ndevice = "CPU"\n'):
            (project / "build").mkdir(exist_ok=True)
            (project / "build" / "lanes.toml").write_text(lanes_toml + policy)
            published = run_cli(
                "publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True,
                env=index.credentials,
            )  # fmt: skip
            assert published.exit_code == 0, published.output
            digests.append(file_sha256(copy))
        # The lane's policy changed the document: a second file, the first one kept.
        labels = sorted(p.name.split("-")[1] for p in index.packages.glob("xla_wheels_document_*"))
        assert labels == [f"1+sha256.{digests[0][:16]}", f"2+sha256.{digests[1][:16]}"]
        # A host that names no digest gets the last one published; one that names the
        # first gets the first.
        assert bundle_document.fetch(index.url, BUNDLE)[1] == digests[1]
        assert bundle_document.fetch(index.url, BUNDLE, sha256=digests[0])[1] == digests[0]
        # Publishing the same document again uploads nothing.
        again = run_cli(
            "publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True,
            env=index.credentials,
        )  # fmt: skip
        assert again.exit_code == 0 and "skipped    xla_wheels_document_" in again.stdout
        assert len(list(index.packages.glob("xla_wheels_document_*"))) == 2
    finally:
        stop(process)
