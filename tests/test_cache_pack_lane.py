"""Cache packs in a lane and on a host's disk: published by hash beside the bundle, kept
while the lane serves the bundle or can roll back to it, fetched by hash over HTTP; a
promotion that requires a pack; a cache directory's size report and its prune, which
removes only entries no installed pack or recent run names.

Real parts: openssl keys, tar files, a static lane directory served by ``python -m
http.server`` on loopback, ``python -m xla_host cache ...`` in fresh processes. The
warm start from the gate's own pack is in tests/test_cache_pack.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import servers
from tests.clirunner import CliResult
from tests.test_cache_pack import cache_entry, host_cli, host_python, keypair, listing, manifest
from xla_host import cache_pack, lane_packs
from xla_wheels.release import lane_packs as lane_store
from xla_wheels.release.devpi import DevpiLane
from xla_wheels.release.lane_index import IndexLane
from xla_wheels.release.lane_static import StaticLane
from xla_wheels.release.lanes import Lane, LaneError, Policy
from xla_wheels.release.policy import judge_promotion
from xla_wheels.release.status import LaneStatus, Status, render

__all__ = ["host_python"]  # the fixture, shared with test_cache_pack.py


def as_cpu_lane(root: Path) -> None:
    """The checkout's validation lane takes packs proven on other wheels than the locked
    ones (``pack-receipts = "any-wheels"``): a CPU lane, whose gate runs stock torch_xla."""
    config = root / "build" / "lanes.toml"
    text = config.read_text()
    marked = text.replace(
        'path = "dist/lanes/validation"\n',
        'path = "dist/lanes/validation"\npack-receipts = "any-wheels"\n',
        1,
    )
    assert marked != text, "the validation lane's path line moved"
    config.write_text(marked)


def static_lane(path: Path, name: str = "validation") -> Lane:
    return Lane(name, StaticLane(name, path), policy=Policy())


@pytest.fixture
def lane(tmp_path: Path) -> Iterator[dict[str, object]]:
    """A cache of three entries, a key pair, the pack of bundle v6e-2.11, published into a
    static lane directory that an HTTP server on loopback serves."""
    cache = tmp_path / "cold-cache"
    cache.mkdir()
    for i, size in enumerate((70_000, 1_500, 9)):
        (cache / f"{1234567890123 + i}").write_bytes(cache_entry(os.urandom(size)))
    private, public = keypair(tmp_path, "lane")
    pack, full = cache_pack.write_pack(
        tmp_path / "packs", cache, private, manifest(bundle="v6e-2.11")
    )
    directory = tmp_path / "lane"
    directory.mkdir()
    published = lane_store.publish_pack(static_lane(directory), pack, full, {"v6e-2.11": "serves"})
    server, root = servers.start_directory_server(directory, tmp_path / "http.log")
    try:
        yield {"cache": cache, "key": private, "pub": public, "pack": pack, "tmp": tmp_path,
               "dir": directory, "url": root, "row": published.row,
               "manifest": full}  # fmt: skip
    finally:
        servers.stop(server)


def lane_fetch(lane: dict[str, object], python: Path, into: Path, *extra: str) -> CliResult:
    return host_cli(
        "cache", "fetch", "--lane", str(lane["url"]), "--bundle", "v6e-2.11",
        "--workload", "small", "--into", str(into), "--key", str(lane["pub"]),
        "--python", str(python), "--device", "CPU", "--topology", "cpu-1x1", *extra,
    )  # fmt: skip


def test_a_pack_is_published_by_hash_and_fetched_by_hash_over_http(
    lane: dict[str, object], host_python: Path
) -> None:
    row = lane["row"]
    assert isinstance(row, lane_packs.PackRow)
    stored = Path(str(lane["dir"])) / row.path
    assert stored.read_bytes() == Path(str(lane["pack"])).read_bytes()
    assert row.path == f"packs/sha256/{row.sha256}.xlapack.tar"
    index = json.loads((Path(str(lane["dir"])) / lane_packs.INDEX).read_text())
    assert index["retained"] == {"v6e-2.11": "serves"}
    into = Path(str(lane["tmp"])) / "host" / "cache"
    done = lane_fetch(lane, host_python, into)
    assert done.exit_code == 0, done.output
    assert listing(into) == listing(Path(str(lane["cache"])))


def test_a_lane_pack_with_a_flipped_byte_is_refused_and_installs_nothing(
    lane: dict[str, object], host_python: Path
) -> None:
    row = lane["row"]
    assert isinstance(row, lane_packs.PackRow)
    stored = Path(str(lane["dir"])) / row.path
    raw = bytearray(stored.read_bytes())
    raw[-1] ^= 0x01  # in the tar's end blocks: no entry changes, only the file's hash
    stored.write_bytes(bytes(raw))
    into = Path(str(lane["tmp"])) / "host" / "cache"
    done = lane_fetch(lane, host_python, into)
    assert done.exit_code == 1, done.output
    assert "is not the pack the lane's index names" in done.stderr
    assert not (Path(str(lane["tmp"])) / "host").exists()


def test_a_host_of_another_topology_finds_no_pack_and_installs_nothing(
    lane: dict[str, object], host_python: Path
) -> None:
    into = Path(str(lane["tmp"])) / "host" / "cache"
    done = lane_fetch(lane, host_python, into, "--topology", "cpu-1x4")
    assert done.exit_code == 1, done.output
    assert "no cache pack for bundle v6e-2.11, workload small, topology cpu-1x4" in done.stderr
    assert "it has: v6e-2.11 / small / cpu-1x1" in done.stderr
    assert not (Path(str(lane["tmp"])) / "host").exists()


def test_the_lane_keeps_the_packs_of_bundles_it_serves_or_can_roll_back_to(
    lane: dict[str, object],
) -> None:
    directory, tmp = Path(str(lane["dir"])), Path(str(lane["tmp"]))
    first = lane["row"]
    assert isinstance(first, lane_packs.PackRow)
    # A bundle the lane neither serves nor served: refused, the lane unchanged.
    other, other_manifest = cache_pack.write_pack(
        tmp / "other", Path(str(lane["cache"])), Path(str(lane["key"])),
        manifest(bundle="v6e-2.12"),
    )  # fmt: skip
    index_before = (directory / lane_packs.INDEX).read_bytes()
    with pytest.raises(Exception, match="keeps no packs for bundle v6e-2.12"):
        lane_store.publish_pack(static_lane(directory), other, other_manifest,
                                {"v6e-2.11": "serves"})  # fmt: skip
    assert (directory / lane_packs.INDEX).read_bytes() == index_before
    # v6e-2.12 now served, v6e-2.11 a rollback target: both kept.
    retained: dict[str | None, str] = {"v6e-2.12": "serves", "v6e-2.11": "rollback"}
    kept = lane_store.publish_pack(static_lane(directory), other, other_manifest, retained)
    assert kept.removed == []
    assert (directory / first.path).exists()
    # A newer pack of v6e-2.12 replaces its older one; v6e-2.11 leaves the history: its
    # pack goes, each removal says why.
    time.sleep(1.1)  # `created` is to the second
    newer, newer_manifest = cache_pack.write_pack(
        tmp / "newer", Path(str(lane["cache"])), Path(str(lane["key"])),
        manifest(bundle="v6e-2.12"),
    )  # fmt: skip
    done = lane_store.publish_pack(static_lane(directory), newer, newer_manifest,
                                   {"v6e-2.12": "serves"})  # fmt: skip
    why = {row.bundle: reason for row, reason in done.removed}
    assert why == {"v6e-2.11": "bundle v6e-2.11 is neither served nor a rollback target"} or (
        set(why) == {"v6e-2.11", "v6e-2.12"} and "a newer pack" in why["v6e-2.12"]
    )
    rows, retained_now = lane_packs.parse_index((directory / lane_packs.INDEX).read_text(), "index")
    assert [r.sha256 for r in rows] == [done.row.sha256]
    assert retained_now == {"v6e-2.12": "serves"}
    assert sorted(p.name for p in (directory / "packs" / "sha256").iterdir()) == [
        f"{done.row.sha256}.xlapack.tar"
    ]


def test_promotion_can_require_a_pack_for_a_workload_and_topology(
    lane: dict[str, object],
) -> None:
    row = lane["row"]
    assert isinstance(row, lane_packs.PackRow)
    policy = Policy(device="CPU", packs=(("small", "cpu-1x1"), ("small", "v6e-8")))
    verdict = judge_promotion("v6e-2.11", set(), [], policy, None, packs=[row])
    rules = [f"{f.rule}: {f.detail}" for f in verdict.failures]
    assert not verdict.passed
    assert any(r.startswith("pack: no cache pack of bundle v6e-2.11 for workload small on "
                            "topology v6e-8") for r in rules), rules  # fmt: skip
    assert not any("topology cpu-1x1" in r for r in rules), rules
    # Another bundle's pack does not count.
    other = judge_promotion("v6e-2.12", set(), [], policy, None, packs=[row])
    assert sum(f.rule == "pack" for f in other.failures) == 2


def test_status_shows_the_packs_a_lane_serves_and_why_it_keeps_them(
    lane: dict[str, object],
) -> None:
    row = lane["row"]
    assert isinstance(row, lane_packs.PackRow)
    status = LaneStatus("validation", "dist/lanes/validation", "v6e-2.11", True, None, [], [],
                        [], packs=[f"{row.label}, {row.size:,} bytes"],
                        retained={"v6e-2.11": "serves", "v6e-2.10": "rollback"})  # fmt: skip
    text = render(Status([], [status]))
    assert f"cache pack: v6e-2.11 / small / cpu-1x1, {row.size:,} bytes" in text
    assert "keeps the cache packs of: v6e-2.10 (rollback), v6e-2.11 (serves)" in text


# --- a host's cache directory: size and prune ----------------------------------------


@pytest.mark.slow
def test_prune_removes_only_entries_no_installed_pack_or_recent_run_names(
    lane: dict[str, object], host_python: Path
) -> None:
    tmp = Path(str(lane["tmp"]))
    into = tmp / "host-cache"
    installed = lane_fetch(lane, host_python, into)
    assert installed.exit_code == 0, installed.output
    month_ago = time.time() - 30 * 86400
    for name in ("9999999999999001", "9999999999999002"):  # old entries of earlier runs
        (into / name).write_bytes(cache_entry(b"x" * 976))  # 1,000 bytes with the footer
        os.utime(into / name, (month_ago, month_ago))
    (into / "9999999999999003").write_bytes(cache_entry(b"y" * 10))  # by today's run
    (into / "notes.txt").write_text("the user's")  # not an entry: never touched
    os.utime(into / "notes.txt", (month_ago, month_ago))
    run = tmp / "run-keys.json"
    run.write_text(json.dumps({"key-record": 1, "graphs": [{"entries": ["9999999999999002"]}]}))
    before = listing(into)

    size = host_cli("cache", "size", "--cache", str(into), "--keep-run", str(run))
    assert size.exit_code == 0, size.output
    assert "6 entr(ies)" in size.stdout and "unreferenced: 1 (1,000 bytes)" in size.stdout
    assert "3 named by installed pack small/cpu-1x1" in size.stdout
    assert f"1 named by run {run}" in size.stdout
    assert "not cache entries (never removed): 1: notes.txt" in size.stdout

    for dry in ((), ("--dry-run",)):
        done = host_cli("cache", "prune", "--cache", str(into), "--keep-run", str(run), *dry)
        assert done.exit_code == 0, done.output
        assert "1 unreferenced entr(ies) would be removed; nothing changed" in done.stdout
        assert listing(into) == before

    done = host_cli("cache", "prune", "--cache", str(into), "--keep-run", str(run), "--apply")
    assert done.exit_code == 0, done.output
    assert "removed 1 entr(ies) (1,000 bytes)" in done.stdout
    after = listing(into)
    assert set(before) - set(after) == {"9999999999999001"}
    assert after["notes.txt"] == b"the user's"

    reader = host_cli("cache", "prune", "--cache", str(into), "--apply", "--recent-days", "0",
                      "--role", "reader")  # fmt: skip
    assert reader.exit_code == 2 and "removes nothing" in reader.stderr, reader.output
    assert listing(into) == after


# --- explaining a miss: the comparison itself, on records as the runs write them ----------


def _record(module: str, *, misses: int = 1, **changes: object) -> dict[str, object]:
    components: dict[str, object] = {
        "compile_options": {"xla_flags": {"xla_cpu_enable_fast_math": "false"}, "switches": {}},
        "module_switches": {"XLA_NO_SPECIAL_SCALARS": "1"},
        "platform": {"device": "CPU", "devices": 1, "libtpu": None},
        "revisions": {"torch": "2.7.0", "torch_xla": "2.7.0"},
    }
    for dotted, value in changes.items():
        outer, _, inner = dotted.partition("__")
        table = dict(components[outer])  # type: ignore[call-overload]
        table[inner] = value
        components[outer] = table
    return {"key-record": 1, "workload": "small", "topology": "cpu-1x1",
            "components": components,
            "graphs": [{"step": 1, "module": module, "hits": 1 - misses, "misses": misses,
                        "entries": ["123456789012"]}]}  # fmt: skip


def test_explain_names_the_component_that_differs() -> None:
    from xla_host import cache_explain, cache_keys

    pack = cache_explain.Reference(
        "pack", cache_keys.manifest_keys(_record("sha256:" + "a" * 64), ["123456789012"])
    )
    same = cache_explain.explain(_record("sha256:" + "a" * 64, misses=0), [pack])
    assert same == []
    flags = _record("sha256:" + "a" * 64, compile_options__xla_flags={
        "xla_cpu_enable_fast_math": "true"})  # fmt: skip
    [item] = cache_explain.explain(flags, [pack])
    assert item.components == ["compile options"]
    assert ("compile_options.xla_flags.xla_cpu_enable_fast_math: the reference's false, the "
            "run's true") in item.details  # fmt: skip
    bf16 = _record("sha256:" + "b" * 64, module_switches__XLA_USE_BF16="1")
    [item] = cache_explain.explain(bf16, [pack])
    assert item.components == ["module"]
    assert "module_switches.XLA_USE_BF16: the reference's unset, the run's 1" in item.details
    newer = _record("sha256:" + "a" * 64, revisions__torch_xla="2.8.0",
                    platform__libtpu="0.0.21")  # fmt: skip
    [item] = cache_explain.explain(newer, [pack])
    assert item.components == ["platform version", "revisions"]
    moved = {**_record("sha256:" + "a" * 64), "topology": "cpu-1x4"}
    [item] = cache_explain.explain(moved, [pack])
    assert item.components == ["topology"]


# --- make cache-pack: the builder publishes the gate's pack with its receipt -------------


@pytest.mark.slow
def test_cache_pack_publishes_the_gates_pack_only_with_its_receipt(tmp_path: Path) -> None:
    from tests.test_error_contract import cli, project_copy
    from xla_host import receipts
    from xla_wheels.release import lanes

    root = project_copy(tmp_path)
    lanes.write_state(root, "validation", lanes.LaneState("v6e-2.9", (), None, None))
    made = receipts.Receipt(
        kind="gate", bundle="v6e-2.9", created="2026-01-01T00:00:00Z", host="h", device="CPU",
        chip=None, workload="small", versions={}, wheels_match_lock=False, wheels=(),
        problems=(), checks=(receipts.CheckEvidence("restart", True, (), {}),),
    )  # fmt: skip
    written = receipts.write_receipt(receipts.receipt_path(root, made), made)
    digest = receipts.read_receipt(written).digest
    cache = tmp_path / "cold"
    cache.mkdir()
    (cache / "123456789012").write_bytes(os.urandom(5000))
    private, public = keypair(tmp_path, "gate")
    packs = root / "out" / "gate" / "packs"
    args = ("cache-pack", "--bundle", "v6e-2.9", "--lane", "validation", "--public-key",
            str(public))  # fmt: skip

    # A pack whose receipt is not the bundle's: refused, the lane untouched.
    cache_pack.write_pack(packs, cache, private, manifest(bundle="v6e-2.9",
                          receipt_digest="sha256:" + "9" * 64))  # fmt: skip
    refused = cli(root, *args)
    assert refused.exit_code == 2, refused.output
    assert "which is no sealed receipt of v6e-2.9 (receipts/v6e-2.9/" in refused.stderr
    assert not (root / "dist" / "lanes" / "validation" / "packs").exists()

    time.sleep(1.1)  # the newest pack is taken: `created` is to the second
    pack, _ = cache_pack.write_pack(packs, cache, private,
                                    manifest(bundle="v6e-2.9", receipt_digest=digest))  # fmt: skip
    # Its receipt passed on other wheels than the bundle's locked ones (stock torch_xla on a
    # CPU): by default no proof for the bundle, and the refusal says why and what a CPU lane
    # sets (the receipt verdict the gate printed and status shows).
    unlocked = cli(root, *args)
    assert unlocked.exit_code == 2, unlocked.output
    assert "which does not prove it for lane validation: it judged an environment that was " \
        "not the lock's wheels" in unlocked.stderr  # fmt: skip
    assert 'pack-receipts = "any-wheels" in [lanes.validation]' in unlocked.stderr
    assert not (root / "dist" / "lanes" / "validation" / "packs").exists()
    as_cpu_lane(root)
    dry = cli(root, *args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would publish" in dry.stdout and "DRY_RUN: nothing written" in dry.stdout
    assert not (root / "dist" / "lanes" / "validation" / "packs").exists()
    done = cli(root, *args)
    assert done.exit_code == 0, done.output
    assert "lane validation keeps the packs of: v6e-2.9 (serves)" in done.stdout
    rows, _ = lane_packs.parse_index(
        (root / "dist" / "lanes" / "validation" / lane_packs.INDEX).read_text(), "index"
    )
    assert [(r.bundle, r.workload, r.receipt_digest) for r in rows] == [
        ("v6e-2.9", "small", digest)
    ]
    assert (root / "dist" / "lanes" / "validation" / rows[0].path).read_bytes() == (
        pack.read_bytes()
    )


def test_cache_pack_refuses_a_pack_with_a_corrupted_entry_and_the_lane_keeps_its_good_one(
    tmp_path: Path,
) -> None:
    from tests.test_error_contract import cli, project_copy
    from xla_host import receipts
    from xla_wheels.release import lanes

    root = project_copy(tmp_path)
    lanes.write_state(root, "validation", lanes.LaneState("v6e-2.9", (), None, None))
    made = receipts.Receipt(
        kind="gate", bundle="v6e-2.9", created="2026-01-01T00:00:00Z", host="h", device="CPU",
        chip=None, workload="small", versions={}, wheels_match_lock=False, wheels=(),
        problems=(), checks=(receipts.CheckEvidence("restart", True, (), {}),),
    )  # fmt: skip
    digest = receipts.read_receipt(
        receipts.write_receipt(receipts.receipt_path(root, made), made)
    ).digest
    cache = tmp_path / "cold"
    cache.mkdir()
    entry = os.urandom(5000)
    (cache / "123456789012").write_bytes(entry)
    private, public = keypair(tmp_path, "gate")
    packs = root / "out" / "gate" / "packs"
    args = ("cache-pack", "--bundle", "v6e-2.9", "--lane", "validation", "--public-key",
            str(public))  # fmt: skip
    # A CPU lane: the receipt was judged on other wheels than the locked ones.
    as_cpu_lane(root)
    good, _ = cache_pack.write_pack(packs, cache, private,
                                    manifest(bundle="v6e-2.9", receipt_digest=digest))  # fmt: skip
    first = cli(root, *args)
    assert first.exit_code == 0, first.output
    lane_dir = root / "dist" / "lanes" / "validation"
    index_before = (lane_dir / lane_packs.INDEX).read_bytes()

    time.sleep(1.1)  # the newest pack is taken: `created` is to the second
    bad, _ = cache_pack.write_pack(packs, cache, private,
                                   manifest(bundle="v6e-2.9", receipt_digest=digest))  # fmt: skip
    raw = bytearray(bad.read_bytes())
    raw[raw.index(entry[:64]) + 10] ^= 0x01  # inside the entry: its signed manifest row holds
    bad.write_bytes(bytes(raw))
    refused = cli(root, *args)
    assert refused.exit_code == 1, refused.output
    assert "entry 123456789012 does not match its signed manifest" in refused.stderr
    assert "not published, lane validation is unchanged" in refused.stderr
    assert "fix:" in refused.stderr and "published" not in refused.stdout
    assert (lane_dir / lane_packs.INDEX).read_bytes() == index_before
    [row] = lane_packs.parse_index((lane_dir / lane_packs.INDEX).read_text(), "index")[0]
    assert (lane_dir / row.path).read_bytes() == good.read_bytes()


def test_an_older_pack_than_the_lanes_is_refused_and_the_lane_keeps_the_newer(
    lane: dict[str, object],
) -> None:
    directory, tmp = Path(str(lane["dir"])), Path(str(lane["tmp"]))
    older, older_manifest = cache_pack.write_pack(
        tmp / "older", Path(str(lane["cache"])), Path(str(lane["key"])),
        manifest(bundle="v6e-2.11", created="2025-01-01T00:00:00Z"),
    )  # fmt: skip
    index_before = (directory / lane_packs.INDEX).read_bytes()
    with pytest.raises(lane_store.OlderPack) as raised:
        lane_store.publish_pack(static_lane(directory), older, older_manifest,
                                {"v6e-2.11": "serves"})  # fmt: skip
    newer = lane["row"]
    assert isinstance(newer, lane_packs.PackRow)
    assert f"is older than the pack lane validation has for it, {newer.path}" in (
        raised.value.message
    )
    assert "nothing was published and the lane is unchanged" in raised.value.message
    assert (directory / lane_packs.INDEX).read_bytes() == index_before
    assert sorted(p.name for p in (directory / "packs" / "sha256").iterdir()) == [
        Path(newer.path).name
    ]


# --- which kinds of lane keep packs: the backend says -------------------------------


def test_a_lane_whose_backend_keeps_no_packs_refuses_one_naming_its_backend_and_the_fix(
    lane: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    pack, tmp, full = Path(str(lane["pack"])), Path(str(lane["tmp"])), lane["manifest"]
    assert isinstance(full, cache_pack.Manifest)
    # Loopback ports nothing listens on: the refusal comes before any request.
    for backend in (
        IndexLane("remote", "http://user:secret@127.0.0.1:9/simple/"),
        DevpiLane("remote", "http://127.0.0.1:9/t/v/+simple/", None, "http://127.0.0.1:9/", "t/v"),
    ):
        target = Lane("remote", backend, policy=Policy())
        with pytest.raises(LaneError) as refused:
            lane_store.publish_pack(target, pack, full, {"v6e-2.11": "serves"})
        assert refused.value.message.startswith(
            f"lane remote (backend {backend.kind!r}, http://"
        ), refused.value.message
        assert "simple/) keeps no cache packs: a package index serves distributions only" in (
            refused.value.message
        )
        assert "secret" not in refused.value.message
        assert refused.value.exit_code == 1
        assert "name a pack store for the lane" in (refused.value.fix or "")
        assert lane_store.read_index(target) == ([], {})
    # A promotion into such a lane takes the wheels without the packs: they stay in the
    # source lane, and the log says so.
    source = static_lane(Path(str(lane["dir"])))
    into = Lane("remote", IndexLane("remote", "http://127.0.0.1:9/simple/"), policy=Policy())
    capsys.readouterr()
    assert lane_store.copy_packs(source, into, "v6e-2.11", {"v6e-2.11": "serves"}) == []
    said = capsys.readouterr().err
    assert "1 cache pack(s) of v6e-2.11 stay in lane validation: lane remote" in said, said
    # Into a static lane they go by hash, the same row.
    other = static_lane(tmp / "preferred", "preferred")
    (tmp / "preferred").mkdir()
    copied = lane_store.copy_packs(source, other, "v6e-2.11", {"v6e-2.11": "serves"})
    assert [c.row for c in copied] == [lane["row"]] and copied[0].added
    assert (tmp / "preferred" / copied[0].row.path).read_bytes() == pack.read_bytes()


def test_a_publish_removes_what_a_killed_one_left_and_only_that(
    lane: dict[str, object],
) -> None:
    directory = Path(str(lane["dir"]))
    stored = directory / "packs" / "sha256"
    row = lane["row"]
    assert isinstance(row, lane_packs.PackRow)
    # What a publish killed mid-way leaves: its copy's temporary file (mkstemp's name), and
    # the pack it linked by hash before it could write the index that lists it.
    (stored / ".pack.k1ll3d_x").write_bytes(b"half a pack")
    unlisted = stored / f"{'e' * 64}.xlapack.tar"
    unlisted.write_bytes(b"a pack no index lists")
    # Not a publish's: other names, and a directory of a hash-like name.
    for name in ("notes.txt", ".pack-notes", ".pack.toolong123"):
        (stored / name).write_text("someone's")
    (stored / f"{'d' * 64}.xlapack.tar").mkdir()
    again = lane_store.publish_pack(
        static_lane(directory), Path(str(lane["pack"])), lane["manifest"],  # type: ignore[arg-type]
        {"v6e-2.11": "serves"},
    )  # fmt: skip
    assert not again.added
    assert sorted(p.name for p in stored.iterdir()) == sorted(
        [".pack-notes", ".pack.toolong123", "notes.txt", f"{'d' * 64}.xlapack.tar",
         f"{row.sha256}.xlapack.tar"]
    )  # fmt: skip
