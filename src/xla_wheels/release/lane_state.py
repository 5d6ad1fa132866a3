"""What a lane serves is one state: its lanes.lock record, its bundle document, its
install lists and its pack index's retention, written as one update.

Every command that moves what a lane serves (publish, promote, rollback) and the one
that rewrites its install lists (``make requirements``) ends in :func:`update`, under the
lane's lock (``lanes.lane_lock``): first the steps that reach past this machine (the host
wheel put, an index's document wheel uploaded; both named by content, so a run that fails
after them changes nothing a host reads), then every file of the lane on this machine is
staged and all are renamed into place together, lanes.lock last
(``wheels_lock.write_with_held_back``): a failure anywhere leaves each file as it was, and
a file of one bundle stands beside a file naming the lane's previous one only for the
renames of one update.

What each backend stores (``LaneBackend.install_dir``, ``documents_dir``,
``pack_index_file``): a static lane serves ``requirements.txt`` (and ``pylock.toml``
once ``make requirements`` made one) at its top, ``bundles/`` and ``packs/index.json``
beside them; a package index (pypiserver, devpi) serves packages only: the document goes
up as a document wheel, and the install lists and the document are the checkout's
copies in ``dist/lanes/<lane>/``; it keeps no packs.

:func:`check` is the other half: a lane whose install list, document or pack index
belongs to another bundle than lanes.lock says it serves, each named with the fix.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path

from xla_host import bundle_document as doc
from xla_host import filemode, log
from xla_host import lane_packs as host_packs
from xla_host.net import NetworkPolicy
from xla_host.wheel_filename import normalize, parse_wheel_name
from xla_wheels.bundle import Bundle, load_bundle
from xla_wheels.publish import requirements
from xla_wheels.publish.index import credentials_for
from xla_wheels.publish.wheels import locked_records
from xla_wheels.release import host_document, lane_packs, lanes, pylock
from xla_wheels.release.lanes import Lane, LanesRecord, LaneState
from xla_wheels.wheels_lock import Lock, RuntimeWheelRecord, WheelRecord, write_with_held_back

#: Where a lane's pylock.toml finds the public runtime wheels when it names none yet
#: (the ``--public-index`` setting's default).
PUBLIC_INDEX = "https://pypi.org/simple/"

_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
_BUNDLE = re.compile(r"^# Hash-pinned requirements of bundle (\S+) ", re.MULTILINE)


def recorded_runtime(lock: Lock, bundle: Bundle) -> tuple[list[RuntimeWheelRecord], str | None]:
    """The runtime wheels wheels.lock records for ``bundle`` when they were resolved for
    its current wheels and pins, and why not otherwise (None: they were, or it has none)."""
    entry = lock.entry(bundle.name)
    runtime = list(entry.runtime_wheels or ())
    recorded_for = entry.runtime_wheels_for
    if runtime and recorded_for is not None:
        ours = locked_records(lock, bundle.name)
        wanted = requirements.resolution_inputs(bundle, ours, list(recorded_for.platforms))
        if wanted.inputs_sha256 == recorded_for.inputs_sha256:
            return runtime, None
        return [], "were resolved for other inputs (its wheels or runtime pins changed since)"
    if bundle.runtime:
        return [], "are not resolved yet"
    return [], None


def lane_files(
    ours: Sequence[WheelRecord], lane: Lane, runtime: Sequence[RuntimeWheelRecord],
    public_index: str,
) -> list[pylock.LockedFile]:  # fmt: skip
    """pylock.toml's files: ours from the lane's index, the runtime wheels from the public one."""
    names = [parse_wheel_name(record.name) for record in ours]
    return [
        pylock.LockedFile(name.normalized, name.version, r.name, r.sha256, lane.simple_url)
        for name, r in zip(names, ours, strict=True)
    ] + [
        pylock.LockedFile(normalize(r.project), r.version, r.name, r.sha256, public_index)
        for r in runtime
    ]


def _public_index(path: Path, lane: Lane) -> str:
    """The public index the lane's pylock.toml names (its runtime wheels'), else the default."""
    try:
        packages = tomllib.loads(path.read_text()).get("packages", [])
    except (OSError, tomllib.TOMLDecodeError):
        return PUBLIC_INDEX
    named = {str(p.get("index")) for p in packages if isinstance(p, dict) and p.get("index")}
    named.discard(lane.simple_url)
    return sorted(named)[0] if named else PUBLIC_INDEX


def install_lists(
    root: Path, lock: Lock, lane: Lane, bundle: Bundle, runtime: Sequence[RuntimeWheelRecord],
    *, network: NetworkPolicy, with_pylock: bool = False, public_index: str | None = None,
) -> list[tuple[Path, str]]:  # fmt: skip
    """The lane's install lists of ``bundle``, not written: ``requirements.txt`` (the
    bundle's wheels and the host wheel by hash, and ``runtime``), ``host-requirements.txt``
    (the host wheel alone, when there is one), and ``pylock.toml`` when
    ``with_pylock`` or the lane has one (its URLs read from the indexes)."""
    directory = lane.backend.install_dir(root)
    ours = [*locked_records(lock, bundle.name), *host_document.host_records(root)]
    files = [
        (directory / requirements.REQUIREMENTS_NAME,
         requirements.requirements_text(bundle, ours, runtime)),
    ]  # fmt: skip
    if host := host_document.host_records(root):
        # The host package alone (installed --no-deps beside a torch environment of its own).
        files.append((directory / requirements.HOST_REQUIREMENTS_NAME,
                      requirements.requirements_text(bundle, host, ())))  # fmt: skip
    path = directory / pylock.PYLOCK_NAME
    if with_pylock or path.exists():
        locked = lane_files(ours, lane, runtime, public_index or _public_index(path, lane))
        urls = pylock.locate(locked, credentials_for(lane.backend.credentials_url), network=network)
        comment = (
            f"# PEP 751 lock of lane {lane.name}: bundle {bundle.name} (Python {bundle.python}),\n"
            "# generated by `make requirements` from wheels.lock and lanes.lock: do not edit.\n"
            "# Install: pip install -r pylock.toml (pip >= 26.1) or "
            "uv pip install -r pylock.toml\n"
        )
        files.append((path, pylock.render_pylock(locked, urls, bundle.python, comment)))
    return files


def _host_wheel(root: Path, lane: Lane, network: NetworkPolicy) -> list[str]:
    """The host wheel into the lane as the bundle's wheels go (a static lane refuses other
    bytes under the same name); lines for the user."""
    wheels = host_document.host_wheels(root)
    if not wheels:
        return [
            f"note: no host wheel in {host_document.HOST_WHEEL_DIR}/ (`make host-wheel`): "
            f"hosts of lane {lane.name} install the host package some other way"
        ]
    outcomes = lane.backend.put(wheels, (), network=network)
    return [f"{o.action:<10} {o.filename}  sha256:{o.sha256}" for o in outcomes]


def update(
    root: Path, lock: Lock, lane: Lane, state: LaneState, *, network: NetworkPolicy,
    action: str | None = "publish", reason: str = "", expected_head: str | None = None,
    runtime: Sequence[RuntimeWheelRecord] | None = None, with_pylock: bool = False,
    public_index: str | None = None,
) -> list[str]:  # fmt: skip
    """``lane`` serves ``state`` (module doc): the host wheel, the document, the install
    lists, the pack index's retention and (``action``; None: the record stays as it is,
    ``make requirements``) lanes.lock's entry, as one update. Run it under
    :func:`~xla_wheels.release.lanes.lane_lock`, whose head is ``expected_head``.
    ``runtime``: the runtime wheels to list (default: wheels.lock's, when still fresh).
    Says (``log.result``) and returns what it wrote."""
    bundle = load_bundle(root, state.bundle)
    if runtime is None:
        runtime, why = recorded_runtime(lock, bundle)
        if why:
            log.warning(
                f"lane {lane.name}: the runtime wheels of {bundle.name} {why}: its install "
                f"lists name only the bundle's own wheels and the host wheel (fix: `make "
                f"requirements BUNDLE={bundle.name}`, then `make requirements LANE={lane.name}`)"
            )
    lines = _host_wheel(root, lane, network)
    raw = doc.dumps(host_document.compose(root, lock, bundle.name, lane))
    document = lane.backend.put_document(root, bundle.name, raw, network=network)
    lines += document.lines
    files: list[tuple[Path, bytes | str]] = [*lane.backend.document_files(root, bundle.name, raw)]
    lists = install_lists(root, lock, lane, bundle, runtime, network=network,
                          with_pylock=with_pylock, public_index=public_index)  # fmt: skip
    files += lists
    if action is None:
        record, record_file = lanes.read_record(root), None
    else:
        path, text, record = lanes.recorded(
            root, lane.name, state, action=action, reason=reason, expected_head=expected_head
        )
        record_file = (path, text)
    retained = lane_packs.retained_bundles(record, lane.name)
    packs = lane.backend.pack_index_file({b or "none": why for b, why in retained.items()})
    files += [packs] if packs else []
    files += [record_file] if record_file else []  # last: it records the others
    for path, _ in files:
        path.parent.mkdir(parents=True, exist_ok=True)
    write_with_held_back(files)  # and wheels.lock's runtime rows a --resolve recorded
    # A store whose index is no file here (a bucket) records the retention after the files.
    lane.backend.retain_packs({b or "none": why for b, why in retained.items()})
    lines.append(f"bundle document {document.path}  sha256:{document.sha256}")
    lines += [f"install list {path}" for path, _ in lists]
    for line in lines:
        log.result(line)
    return lines


def _pinned(path: Path) -> tuple[str | None, set[str]] | None:
    """The bundle an install list names and the sha256s it pins; None: no such file."""
    if not path.is_file():
        return None
    text = filemode.read_shared(path, what="install list").decode(errors="replace")
    if path.name == pylock.PYLOCK_NAME:
        try:
            packages = tomllib.loads(text).get("packages", [])
        except tomllib.TOMLDecodeError:
            return None, set()
        hashes = {str(w.get("hashes", {}).get("sha256")) for p in packages
                  for w in p.get("wheels", [])}  # fmt: skip
        named = re.search(r"^# PEP 751 lock of lane \S+: bundle (\S+) ", text, re.MULTILINE)
        return (named.group(1) if named else None), hashes
    named = _BUNDLE.search(text)
    return (named.group(1) if named else None), set(_HASH.findall(text))


def check(root: Path, lane: Lane, record: LanesRecord) -> list[str]:
    """What of ``lane``'s files belongs to another bundle than lanes.lock says it serves
    (or is missing): one line per file, naming it and the fix."""
    state = record.states.get(lane.name)
    if state is None:
        return []
    fix = (
        f"fix: make requirements LANE={lane.name} (writes the lane's document, install lists "
        f"and pack index for {state.bundle}, the bundle lanes.lock says it serves)"
    )
    current = {sha for _, sha in state.wheels}
    problems = []
    directory = lane.backend.install_dir(root)
    for name in (requirements.REQUIREMENTS_NAME, pylock.PYLOCK_NAME):
        path = directory / name
        found = _pinned(path)
        if found is None:
            if name == requirements.REQUIREMENTS_NAME:
                problems.append(f"{path} is missing: hosts have no install list; {fix}")
            continue
        named, hashes = found
        if named != state.bundle or not current <= hashes:
            problems.append(
                f"{path} installs bundle {named or '(unnamed)'}, not {state.bundle} (pins "
                f"{len(current & hashes)} of its {len(current)} wheels); {fix}"
            )
    path = lane.backend.documents_dir(root) / f"{state.bundle}.json"
    if not path.is_file():
        problems.append(f"{path} is missing: hosts get no document of {state.bundle}; {fix}")
    else:
        try:
            data = json.loads(filemode.read_shared(path, what="bundle document"))
            named, listed = data.get("bundle"), {str(w.get("sha256")) for w in data["wheels"]}
        except (ValueError, AttributeError, TypeError, KeyError):
            named, listed = None, set()
        if named != state.bundle or listed != current:
            problems.append(f"{path} is not the document of {state.bundle}'s locked wheels; {fix}")
    _, retained = lane.backend.pack_index()
    serving = sorted(b for b, why in retained.items() if why == "serves")
    if retained and serving != [state.bundle]:
        index = lane.backend.pack_index_file(retained)
        where = index[0] if index else host_packs.INDEX
        problems.append(
            f"{where} keeps packs as serving {', '.join(serving) or 'no bundle'}, not "
            f"{state.bundle}; {fix}"
        )
    return problems
