"""The lane backend: what every kind of lane does, behind one interface.

A lane of ``build/lanes.toml`` is one of the kinds of :mod:`xla_wheels.release.lane_kinds`
(its ``backend = …``): a static directory, a PEP 503 index that takes uploads (pypiserver,
Artifactory, ...), an index of a devpi server. Everything that depends on the kind goes
through a :class:`LaneBackend`: putting wheels in, fetching them back by hash, reading what
the lane serves, promoting by the server's own means, and serving the bundle document to
hosts. The rest of the release code never asks which kind a lane is.

Cache packs (``release.lane_packs``: the retention rule) are kept through it as well, in
its pack store (``release.pack_store``: the directory of a static lane, or the directory
or bucket lanes.toml names for any lane, ``packs = …``): the backend says whether it keeps
them (:meth:`LaneBackend.refuses_packs`), lists them (:meth:`~LaneBackend.pack_index`),
stores one by hash with the new index (:meth:`~LaneBackend.store_packs`) and hands one out
(:meth:`~LaneBackend.pack_file`).

Adding a kind is one module (a subclass and its :class:`LaneKind`: the lanes.toml keys it
reads and how) and one line in ``lane_kinds``; docs/lanes.md "Lane backends" describes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from xla_host import bundle_document as doc
from xla_host import filemode, lane_packs
from xla_host.errors import PipelineError
from xla_host.filemode import file_sha256
from xla_host.tables import Field, Table
from xla_wheels.options import NetworkPolicy
from xla_wheels.publish.upload import Outcome
from xla_wheels.publish.wheels import LocalWheel
from xla_wheels.release.pack_store import PackStore
from xla_wheels.wheels_lock import WheelRecord


class LaneError(PipelineError):
    """A lane refuses a bundle (its policy, a missing receipt) or a step it cannot take
    (a kind that keeps no cache packs): exit 1."""


@dataclass(frozen=True)
class PublishedDocument:
    """Where a lane's bundle document was written (the checkout's copy for a lane that is
    not a directory), its sha256, and lines for the user (uploads, notes)."""

    path: Path
    sha256: str
    lines: tuple[str, ...] = ()


class LaneBackend:
    """One lane's storage. Subclasses are frozen dataclasses whose first field is ``lane``
    (the lane's name, for messages); the methods below are the whole interface."""

    kind: ClassVar[str]
    lane: str

    @property
    def where(self) -> str:
        """The lane as every display shows it: credentials masked (``redact.shown``)."""
        raise NotImplementedError

    @property
    def simple_url(self) -> str:
        """The PEP 503 index hosts install from (``pip --index-url``)."""
        raise NotImplementedError

    @property
    def credentials_url(self) -> str:
        """The URL whose credentials (``TWINE_*``, keyring) read and write the lane."""
        return self.simple_url

    @property
    def directory(self) -> Path | None:
        """A directory on this machine holding the lane's files, or None: signature
        envelopes and wheels are looked up there, a runtime image copies them from there
        (else its build installs from :attr:`simple_url`), and the lane is locked there."""
        return None

    def put(
        self, wheels: Sequence[LocalWheel], envelopes: Sequence[Path], *, network: NetworkPolicy
    ) -> list[Outcome]:
        """Put ``wheels`` (and their signature envelopes, where the kind keeps them) into
        the lane; the same bytes already there are skipped, other bytes refused."""
        raise NotImplementedError

    def fetch(
        self, records: Sequence[WheelRecord], workdir: Path, *, network: NetworkPolicy
    ) -> list[str]:
        """Each of ``records`` as the lane serves it, into ``workdir`` (hashes are checked
        by the caller); returns the names the lane does not hold."""
        raise NotImplementedError

    def served(self, projects: Sequence[str], *, network: NetworkPolicy) -> dict[str, str]:
        """name -> sha256 of every wheel the lane serves (a remote index: of ``projects``,
        as PEP 503 has no cheap listing of everything)."""
        raise NotImplementedError

    def can_push_from(self, source: LaneBackend) -> bool:
        """Whether a promotion from ``source`` is the server's own copy (:meth:`push_from`)
        instead of a download and an upload."""
        return False

    def push_from(
        self, source: LaneBackend, records: Sequence[WheelRecord], *, network: NetworkPolicy
    ) -> list[Outcome]:
        raise NotImplementedError(f"a {self.kind} lane cannot push")

    def put_document(
        self, root: Path, bundle: str, raw: bytes, *, network: NetworkPolicy
    ) -> PublishedDocument:
        """Serve the canonical bundle document ``raw`` of ``bundle`` to hosts by the kind's
        own means beyond :meth:`document_files` (an index: a document wheel uploaded), which
        the lane's update writes together with its install lists and lanes.lock
        (``release.lane_state``). The default: the files are all there is."""
        return PublishedDocument(self.documents_dir(root) / f"{bundle}.json", doc.sha256_of(raw))

    def document_files(self, root: Path, bundle: str, raw: bytes) -> list[tuple[Path, bytes]]:
        """The files on this machine that hold ``bundle``'s document ``raw``: the document
        and the index page over every document there (``bundles/index.html``, each with
        its ``#sha256=``), in :meth:`documents_dir`."""
        return document_files(self.documents_dir(root), bundle, raw)

    def install_dir(self, root: Path) -> Path:
        """Where the lane's install lists (``requirements.txt``, ``pylock.toml``) are
        written: the checkout's ``dist/lanes/<lane>/`` (an index serves packages only:
        hosts of such a lane get the list from the checkout) unless the lane is a
        directory, which serves them beside its wheels."""
        return root / "dist" / "lanes" / self.lane

    def install_list_url(self, root: Path) -> str | None:
        """The URL of the lane's ``requirements.txt`` as this machine reaches it (``pip
        -r``); None: the lane serves none (the checkout's copy, :meth:`install_dir`)."""
        return None

    def documents_dir(self, root: Path) -> Path:
        """Where the lane's documents are written on this machine: the checkout's
        ``dist/lanes/<lane>/bundles/`` unless the lane is a directory."""
        return root / "dist" / "lanes" / self.lane / doc.DIRNAME

    def published_document(self, root: Path, bundle: str) -> tuple[Path, str] | None:
        """The document the lane was given for ``bundle`` (where, its sha256); None: none."""
        path = self.documents_dir(root) / f"{bundle}.json"
        return (path, file_sha256(path)) if path.is_file() else None

    # Cache packs (``release.lane_packs`` decides which a lane keeps; its store keeps them:
    # ``release.pack_store``, a directory or a bucket, whatever the lane's kind).

    pack_store: PackStore | None = None
    """The store lanes.toml names (``packs = …``); each kind's dataclass has it as its
    last field."""

    def packs(self) -> PackStore | None:
        """Where the lane keeps packs: the store it names, else the kind's own (a static
        lane: its directory), else None (it keeps none)."""
        return self.pack_store

    def refuses_packs(self) -> LaneError | None:
        """Why the lane keeps no cache packs (an error naming its kind, with a fix), or
        None when it keeps them."""
        if self.packs() is not None:
            return None
        return LaneError(
            f"lane {self.lane} (backend {self.kind!r}, {self.where}) keeps no cache packs: "
            "a package index serves distributions only, and a pack is none",
            fix='name a pack store for the lane in build/lanes.toml (packs = "gs://bucket/'
            'prefix" or a directory; docs/cache-packs.md "Any lane")',
        )

    def pack_index(self) -> tuple[list[lane_packs.PackRow], dict[str, str]]:
        """The packs the lane's index lists and the bundles it keeps them for (why); a
        lane that keeps none lists none."""
        store = self.packs()
        return store.index() if store is not None else ([], {})

    def pack_file(self, row: lane_packs.PackRow) -> Path:
        """The file of one of the lane's :meth:`pack_index` rows, on this machine."""
        return self._store().file(row)

    def store_packs(
        self,
        pack: Path,
        row: lane_packs.PackRow,
        keep: Sequence[lane_packs.PackRow],
        retained: Mapping[str, str],
        removed: Sequence[lane_packs.PackRow],
        *,
        dry_run: bool,
    ) -> str:
        """Put ``pack`` (whose bytes hash to ``row.sha256``) into the lane by its hash
        unless it is there, then the index listing ``keep`` and ``retained``, then remove
        ``removed``'s files, in that order: a host never finds a row whose file is gone.
        Returns where the index is, for the user (a dry run: writes nothing)."""
        return self._store().store(pack, row, keep, retained, removed, dry_run=dry_run)

    def pack_index_file(self, retained: Mapping[str, str]) -> tuple[Path, str] | None:
        """The lane's pack index with ``retained`` (bundle -> why) as the bundles it keeps
        packs for, its rows as they are: (where, new text) for the lane's update to write
        when the bundle it serves moves; None: the index is no file of this machine (or
        there is none)."""
        store = self.packs()
        return store.index_file(retained) if store is not None else None

    def retain_packs(self, retained: Mapping[str, str]) -> None:
        """After the lane's update: ``retained`` recorded in a store whose index is not a
        file of this machine (a bucket's, over the generation it was read at)."""
        store = self.packs()
        if store is not None:
            store.retain(retained)

    def named_pack_store(self) -> str | None:
        """The store the lane's documents name for hosts: one lanes.toml gives (a host
        needs only the lane's address to find it); None: the lane's own place."""
        return self.pack_store.location if self.pack_store is not None else None

    def _store(self) -> PackStore:
        store = self.packs()
        if store is None:
            refusal = self.refuses_packs()
            assert refusal is not None
            raise refusal
        return store


def document_files(directory: Path, bundle: str, raw: bytes) -> list[tuple[Path, bytes]]:
    """The document ``raw`` in ``directory`` and the index page over every document
    there with it (``bundles/index.html``, each with its ``#sha256=``), not written."""
    listed = {p.stem: file_sha256(p) for p in sorted(directory.glob("*.json"))}
    listed[bundle] = doc.sha256_of(raw)
    page = doc.index_page(dict(sorted(listed.items()))).encode()
    return [(directory / f"{bundle}.json", raw), (directory / doc.INDEX_PAGE, page)]


def write_document(directory: Path, bundle: str, raw: bytes) -> tuple[Path, str]:
    """:func:`document_files`, each by rename: (where, its sha256)."""
    directory.mkdir(parents=True, exist_ok=True)
    for path, content in document_files(directory, bundle, raw):
        filemode.write_by_rename(path, content)
    return directory / f"{bundle}.json", doc.sha256_of(raw)


@dataclass(frozen=True)
class LaneKind:
    """One ``backend = "<name>"`` of build/lanes.toml: the keys its lanes have (beside the
    keys every lane has) and how a lane's backend is made from them."""

    name: str
    keys: tuple[Field, ...]
    make: Callable[[str, Table, Mapping[str, Any], Path], LaneBackend]
    """(lane name, the lane's table for errors, its keys' values, the checkout) -> backend."""
    signatures: bool = True
    """Whether its lanes may require signed wheels (the envelopes travel with the wheels)."""
