"""``xla-host cache fetch``: install a signed cache pack, so a new host starts warm.

Both command lines take it (the host's ``xla_host.cli`` and the builder's
``xla_wheels.cli``) from :func:`add_arguments`. Exit 0 installed (or every entry already
there); 1 the pack was refused (its signature, an entry's sha256, a host that differs,
an existing entry that differs: nothing installed); 2 bad input (not a pack, not a
public key, a reader's role); 8 the pack's URL did not answer in time; 10 a disk fault.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from xla_host import cache_pack, log, net
from xla_host.errors import UsageError
from xla_host.host_probe import probe

HELP = (
    "install a signed cache pack into a cache directory (verified: signature, every "
    "entry's sha256, bundle/device/topology/torch_xla of this host; all or nothing)"
)
EXAMPLE = (
    "xla-host cache fetch --pack https://lanes.corp/packs/<pack>.xlapack.tar "
    "--into /mnt/xla-cache --key lane-key.pub.pem --bundle v6e-2.11"
)
_TRUE = ("1", "true", "yes", "on")


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define ``cache``'s subcommands on ``parser`` and set their handler."""
    actions = parser.add_subparsers(
        dest="cache_action",
        metavar="ACTION",
        help="fetch: install a signed cache pack (default: none, an action is required)",
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
    fetch.add_argument(
        "--pack", required=True, metavar="FILE|URL", help="the pack: a file, or its URL"
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
        help="this host's role on the cache; a reader writes nothing (default: reader when "
        "XLA_PERSISTENT_CACHE_READ_ONLY is set, else writer)",
    )
    net.add_network_arguments(fetch)  # the settings rows' flags, as every network step's
    fetch.set_defaults(handler=run_fetch)


def _no_action(args: argparse.Namespace) -> int:
    raise UsageError("`cache` needs an action", fix=f"for example: {EXAMPLE}")


def host_facts(args: argparse.Namespace) -> cache_pack.HostFacts:
    """This host as a pack must match it: read without importing torch_xla."""
    from xla_host.gate.target import default_device

    device = args.device or default_device()
    topology = args.topology or os.environ.get("TPU_ACCELERATOR_TYPE")
    if not topology:
        if device != "CPU":
            raise UsageError(
                "this TPU host's topology is unknown (TPU_ACCELERATOR_TYPE is not set)",
                fix="pass --topology <accelerator type, e.g. v6e-8>",
            )
        topology = f"cpu-1x{os.environ.get('CPU_NUM_DEVICES') or 1}"
    python = args.python.absolute() if args.python else Path(sys.executable)
    facts = probe(str(python), ["torch_xla", "libtpu"], fix="pass --python <the training "
                  "environment's python>")  # fmt: skip
    return cache_pack.HostFacts(
        bundle=args.bundle,
        device=device,
        topology=topology,
        torch_xla_version=facts.versions.get("torch_xla"),
        libtpu_version=facts.versions.get("libtpu"),
    )


def run_fetch(args: argparse.Namespace) -> int:
    role = args.role or (
        "reader"
        if os.environ.get("XLA_PERSISTENT_CACHE_READ_ONLY", "").lower() in _TRUE
        else "writer"
    )
    if role == "reader":
        # A reader of a shared cache never writes it: the writer installs the pack.
        raise UsageError(
            f"this host is a reader of {args.into} (read-only role): it writes nothing there",
            fix="run `cache fetch` on the writer of the cache directory (worker 0), or pass "
            "--role writer where this host owns the directory",
        )
    keys = [cache_pack.read_public_key(path) for path in args.key]
    host = host_facts(args)
    with log.section(f"cache pack {args.pack} into {args.into}"):
        done = cache_pack.install(
            args.pack, args.into, keys, host, network=net.policy_from(args, os.environ)
        )
    manifest = done.manifest
    print(
        f"cache pack installed into {args.into}: {len(done.installed)} entr(ies) written, "
        f"{len(done.present)} already there ({manifest.size} bytes; workload "
        f"{manifest.workload.get('name')}, topology {manifest.topology}, torch_xla "
        f"{manifest.torch_xla_version}); fetched and verified in {done.seconds:.2f}s"
    )
    return 0
