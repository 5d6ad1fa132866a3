"""``xla-host cache``: signed cache packs and a host's persistent cache directory.

``cache fetch`` installs a signed pack, so a new host starts warm: a file or URL
(``--pack``), or the lane's pack for this bundle, workload and topology, fetched by hash
(``--lane``, :mod:`xla_host.lane_packs`). ``cache record`` runs a workload once and
writes its key record; ``cache explain`` names the key component that differs for each
graph a run missed (:mod:`xla_host.cache_explain`). ``cache size`` reports a cache
directory, ``cache prune`` removes the entries no installed pack or recent run names
(:mod:`xla_host.cache_prune`; a dry run unless ``--apply``).

Both command lines take it (the host's ``xla_host.cli`` and the builder's
``xla_wheels.cli``) from :func:`add_arguments`. Exit 0 installed (or every entry already
there), recorded, explained, reported or pruned; 1 the pack was refused (its signature,
an entry's sha256, a file that is not the lane's index's, a host that differs, no pack
of the lane for this host, an existing entry that differs: nothing installed); 2 bad
input (not a pack, not a public key, not a key record, a reader's role, a key-record run
that failed); 8 the pack's or lane's URL did not answer in time; 10 a disk fault.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_host import (
    cache_explain,
    cache_keys,
    cache_pack,
    cache_prune,
    cache_role,
    lane_address,
    lane_packs,
    log,
    net,
)  # fmt: skip
from xla_host.arguments import add_setting
from xla_host.errors import UsageError
from xla_host.filemode import output_target, write_by_rename
from xla_host.host_probe import probe
from xla_host.lane_address import LaneAddress, recorded
from xla_host.redact import masked_url
from xla_host.settings import by_flag, env_of

HELP = (
    "install a signed cache pack into a cache directory (verified: signature, every "
    "entry's sha256, bundle/device/topology/torch_xla of this host; all or nothing)"
)
EXAMPLE = (
    "xla-host cache fetch --pack https://lanes.corp/packs/<pack>.xlapack.tar "
    "--into /mnt/xla-cache --key lane-key.pub.pem --bundle v6e-2.11"
)


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define ``cache``'s subcommands on ``parser`` and set their handler."""
    actions = parser.add_subparsers(
        dest="cache_action",
        metavar="ACTION",
        help="fetch, record, explain, size or prune (default: none, an action is required)",
    )
    # Not argparse's required=True: its error would come before the command's own edge,
    # and a parse of the bare command (the command table's tests) must succeed.
    parser.set_defaults(handler=_no_action)
    fetch = actions.add_parser(
        "fetch",
        help=HELP,
        description=HELP[:1].upper() + HELP[1:] + ".",
        epilog=f"example:\n  {EXAMPLE}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = fetch.add_mutually_exclusive_group(required=True)
    source.add_argument("--pack", metavar="FILE|URL", help="the pack: a file, or its URL")
    source.add_argument(
        "--lane",
        metavar="URL|DIR",
        help="the lane (its URL or directory): its packs/index.json names the pack for "
        "--bundle, --workload and this host's topology, fetched by hash",
    )
    fetch.add_argument(
        "--workload", default="small", help="with --lane: the workload's name (default: small)"
    )
    fetch.add_argument(
        "--into",
        required=True,
        type=Path,
        metavar="DIR",
        help="the persistent cache directory (XLA_PERSISTENT_CACHE_PATH) to install into",
    )
    fetch.add_argument(
        "--key",
        action="append",
        required=True,
        type=Path,
        metavar="PEM",
        help="an ed25519 public key the pack may be signed by (the lane's); repeat for several",
    )
    fetch.add_argument(
        "--bundle", help="the bundle this host runs (default: none, a stock environment)"
    )
    fetch.add_argument(
        "--python",
        type=Path,
        help="interpreter of the training environment, whose torch_xla and libtpu versions "
        "the pack must match (default: this one)",
    )
    fetch.add_argument(
        "--device", type=str.upper, choices=("CPU", "TPU"), help="default: TPU where present"
    )
    fetch.add_argument(
        "--topology",
        help="this host's topology as the gate records it (v6e-8, cpu-1x1) (default: "
        "TPU_ACCELERATOR_TYPE, else cpu-1x<CPU_NUM_DEVICES or 1> on CPU)",
    )
    fetch.add_argument(
        "--role",
        choices=("writer", "reader"),
        help="this host's role on the cache; a reader writes nothing (default: "
        f"${cache_role.ROLE_VARIABLE}, else {cache_role.DEFAULT_TEXT})",
    )
    net.add_network_arguments(fetch)  # the settings rows' flags, as every network step's
    fetch.set_defaults(handler=run_fetch)
    _add_record(actions)
    _add_explain(actions)
    _add_size_and_prune(actions)


def _add_record(actions: argparse._SubParsersAction) -> None:
    record = actions.add_parser(
        "record",
        help="run a workload once (in a scratch cache) and write its key record",
        description="Run a workload once with this environment's settings (XLA_FLAGS, "
        "XLA_USE_BF16, ...) in a scratch copy of --cache (the directory is never written) "
        "and write its key record: each graph's module fingerprint, hits and misses, and "
        "the run's compile options, platform and revisions.",
        epilog="example:\n  XLA_FLAGS=--xla_cpu_enable_fast_math=true xla-host cache record "
        "--python venv/bin/python --cache /mnt/xla-cache --out run-keys.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    record.add_argument("--out", required=True, type=Path, help="the key record to write")
    record.add_argument("--cache", type=Path, help="seed the scratch cache with this directory")
    record.add_argument("--workload", default="small", help="a preset or PATH:FACTORY")
    record.add_argument("--python", type=Path, help="the training environment's interpreter")
    record.add_argument("--device", type=str.upper, choices=("CPU", "TPU"))
    record.add_argument("--topology", help="as for fetch")
    record.add_argument("--child-timeout", type=float, default=600.0, metavar="SECONDS")
    record.set_defaults(handler=run_record)


def _add_explain(actions: argparse._SubParsersAction) -> None:
    explain = actions.add_parser(
        "explain",
        help="name the key component that differs for each graph a run missed",
        description="Compare a run's key record with a pack's (or the packs installed in "
        "a cache directory) and name, for each graph the run missed, the component that "
        "differs: module, compile options, platform version, topology, revisions.",
        epilog="example:\n  xla-host cache explain --run run-keys.json --pack "
        "<pack>.xlapack.tar --key lane-key.pub.pem",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument("--run", required=True, type=Path, help="the run's key record")
    against = explain.add_mutually_exclusive_group(required=True)
    against.add_argument("--pack", metavar="FILE|URL", help="a pack (its signed manifest)")
    against.add_argument("--cache", type=Path, help="a cache directory (its installed packs)")
    explain.add_argument(
        "--key",
        action="append",
        type=Path,
        default=[],
        metavar="PEM",
        help="with --pack: a public key it may be signed by",
    )
    explain.set_defaults(handler=run_explain)


def _add_size_and_prune(actions: argparse._SubParsersAction) -> None:
    for name, text in (
        ("size", "report what a cache directory holds, what is kept and why (reads only)"),
        (
            "prune",
            "remove the entries no installed pack or recent run names (a dry run "
            "unless --apply)",
        ),
    ):
        parser = actions.add_parser(name, help=text, description=text[:1].upper() + text[1:])
        parser.add_argument("--cache", required=True, type=Path, help="the cache directory")
        parser.add_argument(
            "--keep-run",
            action="append",
            type=Path,
            default=[],
            metavar="RECORD",
            help="keep the entries this key record names",
        )
        add_setting(parser, by_flag("--recent-days"), command=f"cache {name}")
        if name == "prune":
            mode = parser.add_mutually_exclusive_group()
            mode.add_argument("--apply", action="store_true", help="remove them")
            mode.add_argument(
                "--dry-run",
                action="store_true",
                help="list what would go and change nothing (the default)",
            )
            parser.add_argument(
                "--role",
                choices=("writer", "reader"),
                help="as for fetch: a reader removes nothing",
            )
        parser.set_defaults(handler=run_size if name == "size" else run_prune)


def _no_action(args: argparse.Namespace) -> int:
    raise UsageError("`cache` needs an action", fix=f"for example: {EXAMPLE}")


def _device_and_topology(
    device: str | None, topology: str | None, env: Mapping[str, str]
) -> tuple[str, str]:
    from xla_host.gate.target import default_device

    device = device or default_device()
    topology = topology or env.get("TPU_ACCELERATOR_TYPE")
    if not topology:
        if device != "CPU":
            raise UsageError(
                "this TPU host's topology is unknown (TPU_ACCELERATOR_TYPE is not set)",
                fix="pass --topology <accelerator type, e.g. v6e-8>",
            )
        topology = f"cpu-1x{env.get('CPU_NUM_DEVICES') or 1}"
    return device, topology


def facts_of_host(
    bundle: str | None,
    python: Path,
    device: str | None,
    topology: str | None,
    env: Mapping[str, str],
) -> cache_pack.HostFacts:
    """This host as a pack must match it: read without importing torch_xla. ``env``: the
    environment the job runs with (its PJRT_DEVICE, TPU_ACCELERATOR_TYPE, CPU_NUM_DEVICES)."""
    device, topology = _device_and_topology(device, topology, env)
    facts = probe(
        str(python),
        ["torch_xla", "libtpu"],
        fix="pass --python <the training environment's python>",
    )
    return cache_pack.HostFacts(
        bundle=bundle,
        device=device,
        topology=topology,
        torch_xla_version=facts.versions.get("torch_xla"),
        libtpu_version=facts.versions.get("libtpu"),
    )


def host_facts(args: argparse.Namespace) -> cache_pack.HostFacts:
    python = args.python.absolute() if args.python else Path(sys.executable)
    return facts_of_host(args.bundle, python, args.device, args.topology, os.environ)


def _role(args: argparse.Namespace) -> cache_role.CacheRole:
    """This host's role on the cache by the one rule, a contradiction said."""
    decided = cache_role.decide(args.role, os.environ)
    if decided.warning:
        log.warning(decided.warning)
    return decided


@dataclass(frozen=True)
class Fetched:
    """A pack verified and installed: where from, and what it wrote."""

    source: str
    into: Path
    done: cache_pack.Installed
    row: lane_packs.PackRow | None
    """The lane's index row (a pack fetched from a lane by hash), else None."""

    @property
    def named(self) -> str:
        """The pack as a job's stamp names it."""
        manifest = self.done.manifest
        label = (
            self.row.label
            if self.row
            else f"{manifest.bundle or 'no bundle'} / {manifest.workload.get('name')} / "
            f"{manifest.topology}"
        )
        digest = f"sha256:{self.row.sha256} " if self.row else ""
        return f"{digest}({label}) from {recorded(self.source)}"

    def line(self) -> str:
        manifest = self.done.manifest
        return (
            f"cache pack installed into {self.into}: {len(self.done.installed)} entr(ies) "
            f"written, {len(self.done.present)} already there ({manifest.size} bytes; workload "
            f"{manifest.workload.get('name')}, topology {manifest.topology}, torch_xla "
            f"{manifest.torch_xla_version}); fetched and verified in {self.done.seconds:.2f}s"
        )


def fetch_pack(
    into: Path,
    key_paths: Sequence[Path],
    host: cache_pack.HostFacts,
    network: net.NetworkPolicy,
    *,
    pack: str | None = None,
    lane: LaneAddress | None = None,
    workload: str = "small",
) -> Fetched:
    """Verify and install a pack into ``into``: the file or URL ``pack``, or the lane's
    pack for ``host``'s bundle and topology and ``workload``, fetched by hash. The one
    fetch of ``cache fetch``, ``launch-env --pack-lane`` and the runtime image's
    entrypoint; the caller has decided that this host may write ``into`` (its role)."""
    keys = [cache_pack.read_public_key(path) for path in key_paths]
    source, row = pack, None
    if lane is not None:
        # Any spelling of the workload names the one the gate recorded (gate.workload).
        from xla_host.gate.workload import named

        workload = named(workload).name
        source, row = lane_packs.find_pack(lane, host.bundle, workload, host.topology, network)
    if source is None:
        raise UsageError("which pack? neither a pack nor a lane is given",
                         fix=f"for example: {EXAMPLE}")  # fmt: skip
    with log.section(f"cache pack {masked_url(source)} into {into}"):
        done = cache_pack.install(
            source, into, keys, host, network=network,
            expected_sha256=row.sha256 if row else None,
        )  # fmt: skip
    return Fetched(source, into, done, row)


def not_fetched(into: str | None) -> str:
    """What a reader's job says instead of installing the pack."""
    return (
        f"cache pack: not fetched: this job is a reader of {into} (read-only role) and "
        "writes nothing there; the writer (worker 0) installs the pack"
    )


@dataclass(frozen=True)
class PackRequest:
    """A job's opt-in to start warm: the lane whose pack to fetch, the workload, the key."""

    lane: LaneAddress
    workload: str
    key: Path


def pack_request(
    lane: str | None, workload: str | None, key: Path | str | None, env: Mapping[str, str]
) -> PackRequest | None:
    """The flags (``launch-env --pack-lane``), else their settings rows' variables
    (``XLA_WHEELS_PACK_LANE``, the runtime image's entrypoint); None: no pack asked for."""
    lane = lane or env.get(env_of("--pack-lane"))
    if not lane:
        return None
    address = lane_address.parse(lane)
    key = key or env.get(env_of("--pack-public-key"))
    if not key:
        raise UsageError(
            f"a cache pack is asked for (the lane {address.shown()}) without the key its "
            "signature must verify with",
            fix="pass --pack-public-key <the lane's public key, PEM> (or set "
            f"{env_of('--pack-public-key')}), or leave out --pack-lane "
            f"({env_of('--pack-lane')})",
        )
    workload = (
        workload or env.get(env_of("--pack-workload")) or str(by_flag("--pack-workload").default)
    )
    return PackRequest(address, workload, Path(key))


def launch_pack(
    request: PackRequest,
    bundle: str,
    env: Mapping[str, str],
    role: str,
    python: Path,
    network: net.NetworkPolicy,
) -> Fetched | None:
    """The lane's pack installed into the job's persistent cache directory (``env``'s
    ``XLA_PERSISTENT_CACHE_PATH``) before the job starts: ``launch-env --pack-lane`` and
    the runtime image's entrypoint. None for a reader: it writes nothing (its writer,
    worker 0, installs the pack into the shared directory)."""
    from xla_host.launch_profile import CACHE_PATH

    into = env.get(CACHE_PATH)
    if not into:
        raise UsageError(
            f"a cache pack goes into the persistent cache directory, and this launch "
            f"environment sets no {CACHE_PATH}",
            fix="use a launch profile whose [profiles.<name>.cache] sets "
            f"{CACHE_PATH}, or leave out the pack's lane",
        )
    if role == "reader":
        return None
    device = env.get("PJRT_DEVICE", "").upper()
    host = facts_of_host(bundle, python, device if device in ("CPU", "TPU") else None, None, env)
    return fetch_pack(
        Path(into), [request.key], host, network, lane=request.lane, workload=request.workload
    )


def run_fetch(args: argparse.Namespace) -> int:
    role = _role(args)
    if not role.writer:
        # A reader of a shared cache never writes it: the writer installs the pack.
        raise UsageError(
            f"this host is a {role.describe()} of {args.into} (read-only role): it writes "
            "nothing there",
            fix="run `cache fetch` on the writer of the cache directory (worker 0), or pass "
            "--role writer where this host owns the directory",
        )
    log.info(f"cache fetch: this host is the {role.describe()} of {args.into}")
    fetched = fetch_pack(
        args.into, args.key, host_facts(args), net.policy_from(args, os.environ),
        pack=args.pack, lane=lane_address.parse(args.lane) if args.lane else None,
        workload=args.workload,
    )  # fmt: skip
    print(fetched.line())
    return 0


def run_record(args: argparse.Namespace) -> int:
    from xla_host.gate.workload import resolve
    from xla_host.values import BadValue

    try:
        workload = resolve(args.workload)
    except BadValue as bad:
        raise UsageError(f"--workload {args.workload!r} {bad.reason}",
                         fix=f"pass --workload {bad.example}") from None  # fmt: skip
    device, topology = _device_and_topology(args.device, args.topology, os.environ)
    python = args.python.absolute() if args.python else Path(sys.executable)
    # Before the workload runs (minutes): a FIFO, device or directory at --out is refused.
    output_target(args.out)
    record = cache_keys.record_run(
        python,
        workload,
        device,
        topology,
        args.out.absolute().parent / "runs",
        args.child_timeout,
        seed_cache=args.cache,
    )
    write_by_rename(args.out, json.dumps(record, indent=2, sort_keys=True) + "\n")
    misses = sum(int(g.get("misses", 0)) for g in record["graphs"])
    hits = sum(int(g.get("hits", 0)) for g in record["graphs"])
    print(
        f"key record: {args.out} ({len(record['graphs'])} graph(s), {hits} hit(s), "
        f"{misses} miss(es))"
    )
    return 0


def run_explain(args: argparse.Namespace) -> int:
    record = cache_keys.read_record(args.run)
    if args.pack is not None:
        if not args.key:
            raise UsageError(
                "--pack needs --key: a pack's manifest is read once its " "signature verifies",
                fix=f"for example: {EXAMPLE}",
            )
        keys = [cache_pack.read_public_key(path) for path in args.key]
        manifest = cache_pack.read_manifest(args.pack, keys)
        if manifest.keys is None:
            raise UsageError(
                f"{args.pack} records no key components (made by an older gate)",
                fix="explain against a pack a gate of this version made",
            )
        references = [cache_explain.Reference(f"pack {args.pack}", manifest.keys)]
    else:
        references = cache_explain.references_of_cache(args.cache)
    try:
        found = cache_explain.explain(record, references)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as error:
        raise UsageError(
            f"{args.run} is not a key record: a graph lacks or mistypes {error}",
            fix="pass a key record: `xla-host cache record --out FILE` writes one",
        ) from None
    if not found:
        print(f"{args.run}: the run missed nothing")
        return 0
    print(f"{args.run}: {len(found)} graph(s) missed")
    for item in found:
        print("  " + item.line())
    return 0


def run_size(args: argparse.Namespace) -> int:
    found = cache_prune.survey(args.cache, args.keep_run, args.recent_days)
    print("\n".join(found.lines()))
    return 0


def run_prune(args: argparse.Namespace) -> int:
    found = cache_prune.survey(args.cache, args.keep_run, args.recent_days)
    print("\n".join(found.lines()))
    if not args.apply:
        print(
            f"dry run: {len(found.unreferenced)} unreferenced entr(ies) would be removed; "
            "nothing changed (--apply removes them)"
        )
        return 0
    if not (role := _role(args)).writer:
        raise UsageError(
            f"this host is a {role.describe()} of {args.cache}: it removes nothing",
            fix="prune on the writer of the cache directory (worker 0)",
        )
    if not found.is_a_cache:
        raise cache_prune.not_a_cache(found)
    with cache_prune.pruning(args.cache):
        # Listed again under the install lock: what a fetch installed meanwhile is kept.
        found = cache_prune.survey(args.cache, args.keep_run, args.recent_days)
        removed = cache_prune.prune(found)
    print(f"removed {len(removed)} entr(ies) ({sum(found.sizes[n] for n in removed):,} bytes)")
    return 0
