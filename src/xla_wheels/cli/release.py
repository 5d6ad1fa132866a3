"""Subcommands ``publish-lane``, ``promote``, ``rollback``, ``compare``,
``lane-requirements``, ``lanes``, ``status``, ``cache-pack``.

Exit codes: 0 done; 1 a lane refused, or (``status``) a lane drifts or its index did not
answer (the report is printed whole first); (the message names each rule that failed) or a
check failed; 2 bad input (unknown lane or bundle, malformed lanes.toml).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from xla_host import log
from xla_host.errors import UsageError
from xla_host.redact import one_line, shown
from xla_wheels.bundle import load_bundle
from xla_wheels.cli.arguments import add_bundle_arguments, add_common_arguments
from xla_wheels.cli.settings import pipeline_options
from xla_wheels.layout import BundleLayout
from xla_wheels.publish import requirements
from xla_wheels.publish.wheels import locked_wheels
from xla_wheels.release import compare as compare_mod
from xla_wheels.release import host_document, lane_packs, lane_state, lanes, promote
from xla_wheels.release import status as status_mod
from xla_wheels.settings_rows import add_settings
from xla_wheels.wheels_lock import (
    read_lock,
    written_on_success,
)

# ------------------------------------------------------------------ lanes


def cmd_publish_lane(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    load_bundle(options.root, args.bundle)
    config = lanes.load_config(options.root)
    lane = config.lane(args.lane or config.publish_lane)
    with _holding(options, lane) as head:
        outcomes = promote.publish_to_lane(
            options.root,
            read_lock(options.lock_path),
            args.bundle,
            BundleLayout.of(options, args.bundle).dist,
            lane,
            network=options.network,
            dry_run=options.dry_run,
            expected_head=head,
        )
        for outcome in outcomes:
            print(f"{outcome.action:<10} {outcome.filename}  sha256:{outcome.sha256}")
        if options.dry_run:
            print(
                f"DRY_RUN: nothing copied; would record {args.bundle} as lane {lane.name}'s "
                "current bundle in lanes.lock"
            )
        else:
            print(f"lane {lane.name}: {lane.where} now serves {args.bundle} (lanes.lock)")
    return 0


def _holding(options: Any, lane: lanes.Lane) -> contextlib.AbstractContextManager[str | None]:
    """The lane and lanes.lock held for the whole change (copy, index, record, host side:
    ``lanes.lane_lock``); a dry run changes nothing and takes no lock."""
    if options.dry_run:
        return contextlib.nullcontext(None)
    return lanes.lane_lock(options.root, lane)


def cmd_promote(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    load_bundle(options.root, args.bundle)
    config = lanes.load_config(options.root)
    lane = config.lane(args.lane)
    source = config.lane(args.source or lane.promote_from or config.publish_lane)
    if source.name == lane.name:
        raise UsageError(
            f"lane {lane.name} cannot be promoted from itself",
            fix="set promote-from in build/lanes.toml or pass --from",
        )
    lock = read_lock(options.lock_path)  # parsed once for the whole promotion
    with _holding(options, lane) as head:
        verdict, outcomes = promote.promote(
            options.root, lock, args.bundle, lane, source, dry_run=options.dry_run,
            dist=BundleLayout.of(options, args.bundle).dist, network=options.network,
            stores=config.receipt_stores, expected_head=head,
        )  # fmt: skip
        if verdict.chosen:
            print(f"policy of lane {lane.name} holds: receipt {verdict.chosen.path.name}")
            if verdict.chosen.origin:
                kept = "would be kept" if options.dry_run else "kept"
                print(
                    f"  read from {verdict.chosen.origin}; {kept} as "
                    f"receipts/{verdict.chosen.path}"
                )
        else:
            print(f"lane {lane.name} has no policy: promoting without a receipt")
        for outcome in outcomes:
            print(f"{outcome.action:<10} {outcome.filename}  sha256:{outcome.sha256}")
        if options.dry_run:
            print(
                f"DRY_RUN: nothing copied from {source.name} to {lane.name}; lanes.lock unchanged"
            )
        else:
            print(f"lane {lane.name}: current bundle is now {args.bundle} (lanes.lock)")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    if not args.to:
        raise UsageError(
            "rollback needs the bundle to return to",
            fix='make rollback LANE=preferred TO=<bundle> REASON="…" (make lanes HISTORY=1 '
            "shows what the lane served)",
        )
    lane = lanes.load_config(options.root).lane(args.lane)
    with _holding(options, lane) as head:
        plan = promote.rollback(
            options.root, read_lock(options.lock_path), lane, args.to, args.reason or "",
            dry_run=options.dry_run, dist=BundleLayout.of(options, args.to).dist,
            network=options.network, expected_head=head,
        )  # fmt: skip
    print("\n".join(plan.lines()))
    if options.dry_run:
        print("DRY_RUN: lanes.lock unchanged")
    else:
        print(
            f"lane {lane.name}: current bundle is now {args.to} (lanes.lock, its document "
            "and install lists)"
        )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    # The lanes' receipt stores, when the checkout has lanes; compare needs none.
    has_lanes = (options.root / lanes.LANES_CONFIG).exists()
    stores = lanes.load_config(options.root).receipt_stores if has_lanes else ()
    chosen = []
    for bundle in (args.a, args.b):
        if not bundle:
            raise UsageError("compare needs two bundles", fix="make compare A=<bundle> B=<bundle>")
        found = compare_mod.latest_usable(
            promote.bundle_evidence(options.root, bundle, stores, options.network)
        )
        if found is None:
            raise UsageError(
                f"bundle {bundle} has no sealed receipt in receipts/{bundle}/"
                + (f" or {', '.join(stores)}" if stores else ""),
                fix=f"run `make gate BUNDLE={bundle} PYTHON=…` first",
            )
        chosen.append(found)
    print(compare_mod.render(compare_mod.compare(chosen[0], chosen[1])), end="")
    return 0


def cmd_lane_requirements(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    config = lanes.load_config(options.root)
    state = lanes.read_state(options.root)
    names = [args.lane] if args.lane else sorted(config.lanes)
    locked = read_lock(options.lock_path)  # parsed once for every lane
    wrote = 0
    for name in names:
        lane = config.lane(name)
        current = state.get(name)
        if current is None:
            log.info(f"lane {name} has no current bundle yet: nothing to write")
            continue
        bundle = load_bundle(options.root, current.bundle)
        with written_on_success():
            entry = locked.entry(bundle.name)
            runtime, stale = lane_state.recorded_runtime(locked, bundle)
            if args.resolve:
                dist = BundleLayout.of(options, bundle.name).dist
                wheels = locked_wheels(locked, bundle.name, dist)
                runtime = requirements.runtime_records(
                    options.lock_path,
                    locked,
                    bundle,
                    wheels,
                    args.platform or requirements.host_platforms(),
                    network=options.network,
                )
            elif stale and entry.runtime_wheels:
                raise UsageError(
                    f"the runtime wheels wheels.lock records for {bundle.name} were resolved for "
                    "other inputs (its wheels or runtime pins changed since)",
                    fix=f"run `make requirements BUNDLE={bundle.name} REFRESH=1`, or pass "
                    "--resolve",
                )
            elif stale:
                raise UsageError(
                    f"bundle {bundle.name} has runtime pins but wheels.lock records no resolved "
                    "runtime wheels",
                    fix=f"run `make requirements BUNDLE={bundle.name}` once (it resolves and locks "
                    "them), or pass --resolve",
                )
            # The lane's document, install lists and pack index, and the runtime wheels
            # --resolve records, all or none, under the lane's lock (release.lane_state).
            with lanes.lane_lock(options.root, lane):
                if lanes.read_state(options.root).get(name) != current:
                    raise UsageError(
                        f"lane {name} moved while its install lists were written (another "
                        "publish, promotion or rollback); nothing was written",
                        fix="run make requirements again",
                    )
                # read_lock sees what --resolve recorded (held back until the files go).
                lane_state.update(
                    options.root, read_lock(options.lock_path), lane, current,
                    network=options.network, action=None, runtime=runtime, with_pylock=True,
                    public_index=args.public_index,
                )  # fmt: skip
            print(f"lane {name} (bundle {bundle.name}): wrote its document and install lists")
        wrote += 1
    if not wrote:
        print("no lane has a current bundle: `make publish BUNDLE=…` first")
    return 0


def _print_history(record: lanes.LanesRecord, only: str | None) -> None:
    entries = [e for e in record.history if only is None or e.lane == only]
    if not entries:
        print("no history yet (lanes.lock records none)")
    for entry in entries:
        moved = (
            f"{entry.previous_bundle} -> {entry.bundle}" if entry.previous_bundle else entry.bundle
        )
        # Each field one line, escapes shown as text: the record's values are free text
        # (a reason, a user name) that must not forge a line or act on the terminal.
        print(one_line(f"{entry.when}  {entry.lane}: {entry.action} {moved}  by {entry.who}"))
        if entry.receipt:
            print(one_line(f"  receipt {entry.receipt} (sha256 {entry.receipt_digest})"))
        if entry.reason:
            print(f"  reason: {one_line(entry.reason)}")


def cmd_lanes(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    config = lanes.load_config(options.root)
    record = lanes.read_record(options.root)
    if args.history:
        _print_history(record, args.lane and config.lane(args.lane).name)
        return 0
    state = record.states
    for name, lane in sorted(config.lanes.items()):
        current = state.get(name)
        rules = lane.policy
        policy = (
            "none"
            if rules.empty
            else (
                f"device={rules.device or 'any'} checks={','.join(rules.checks) or '-'} "
                f"max-warm-regression={rules.max_warm_regression} "
                f"max-memory-regression={rules.max_memory_regression}"
                + (f" topologies={','.join(rules.topologies)}" if rules.topologies else "")
            )
        )
        print(f"{name}: {lane.where}")
        print(
            f"  current bundle: {current.bundle if current else '(none)'}"
            + (f" (receipt {current.receipt})" if current and current.receipt else "")
        )
        if rules.receipt_keys:
            policy += " signed-receipts=" + ",".join(k.name for k in rules.receipt_keys)
        print(f"  policy: {policy}")
        if current and (published := host_document.published(options.root, lane, current.bundle)):
            print(f"  bundle document: {published[0]} sha256:{published[1]}")
        if lane.receipts:
            print(f"  receipts: {shown(lane.receipts)}")
        if history := record.lane_history(name):
            last = history[-1]
            print(f"  since {last.when}: {last.action} by {last.who} (make lanes HISTORY=1)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    config = lanes.load_config(options.root)
    record = lanes.read_record(options.root)
    found = status_mod.collect(options.root, options.lock_path, config, record, options.network)
    if args.json:
        print(json.dumps(found.as_json(), indent=2))
    else:
        print(status_mod.render(found), end="")
    bad = status_mod.summary(found)
    for key, names in bad.items():
        if names:
            log.warning(f"status: lane(s) {', '.join(names)}: {key} (see above)")
    return 0 if found.ok else 1


def _gate_packs(
    directory: Any, keys: Sequence[Any], bundle: str, workload: Any
) -> tuple[list[Any], list[str]]:
    """The packs of ``directory`` (a gate run's --pack) for this bundle and ``workload``
    (a :class:`~xla_host.gate.workload.WorkloadName`) whose signature verifies, newest
    first, and why each other pack is not it; a pack that does not verify is refused, not
    skipped."""
    from pathlib import Path

    from xla_host import cache_pack
    from xla_host.gate.workload import same_workload

    found, others = [], []
    for path in sorted(Path(directory).glob(f"*{cache_pack.SUFFIX}")):
        manifest = cache_pack.read_manifest(str(path), keys)
        named = manifest.workload
        differs = (
            f"bundle {manifest.bundle}"
            if manifest.bundle != bundle
            else same_workload(workload, str(named.get("name")), named.get("sha256"))
        )
        if differs is None:
            found.append((path, manifest))
        else:
            others.append(f"{path.name}: {differs}")
    return sorted(found, key=lambda item: item[1].created, reverse=True), others


def _require_proof(
    pack: str, digest: str | None, sealed: Mapping[str, Any], lane: lanes.Lane, bundle: str,
    locked: set[tuple[str, str]],
) -> None:  # fmt: skip
    """Refuse a pack whose receipt (``digest``, among the bundle's ``sealed`` receipts)
    did not prove it for ``lane``: the receipt verdict (receipt_verdict) on the bundle's
    locked wheels, or on any wheels where the lane says so (``pack-receipts``), and its
    restart check passed."""
    from xla_host import receipt_verdict

    proof = sealed.get(digest or "")
    if proof is None:
        raise UsageError(
            f"{pack} names receipt {digest}, which is no sealed receipt of {bundle} "
            f"(receipts/{bundle}/ and the lanes' receipt stores)",
            fix="commit or upload the receipt of the gate run that wrote the pack, then "
            "publish the pack",
        )
    verdict = receipt_verdict.judge_stored(proof, bundle=bundle, locked=locked)
    restart = proof.receipt.check("restart")
    accepted = verdict.passed or (lane.pack_receipts == "any-wheels" and verdict.checks_passed)
    if accepted and restart is not None and restart.passed is True:
        return
    why = verdict.why if not accepted else "it has no passing restart check"
    fix = (
        f"run the gate on the locked wheels of {bundle} (make gate BUNDLE={bundle} "
        'GATE_ARGS="--pack …"), then publish its pack'
    )
    if verdict.checks_passed and not verdict.passed:
        fix += (
            "; a CPU or demo lane may take packs proven on other wheels: "
            f'pack-receipts = "any-wheels" in [lanes.{lane.name}] (docs/cache-packs.md)'
        )
    raise UsageError(
        f"{pack} is proven by receipt {proof.shown}, which does not prove it for lane "
        f"{lane.name}: {why}",
        fix=fix,
    )


def cmd_cache_pack(args: argparse.Namespace) -> int:
    from xla_host import cache_pack

    options = pipeline_options(args, os.environ)
    load_bundle(options.root, args.bundle)
    config = lanes.load_config(options.root)
    lane = config.lane(args.lane or config.publish_lane)
    packs_dir = args.packs or options.out_dir / "gate" / "packs"
    if args.public_key is None:
        raise UsageError(
            "cache-pack needs the public key the gate's packs are signed with",
            fix=f"make cache-pack BUNDLE={args.bundle} PUBLIC_KEY=pack-key.pub.pem",
        )
    keys = [cache_pack.read_public_key(args.public_key)]
    from xla_host.gate.workload import named

    workload = named(args.workload)
    found, others = _gate_packs(packs_dir, keys, args.bundle, workload)
    if not found:
        raise UsageError(
            f"{packs_dir} holds no cache pack of bundle {args.bundle} and workload "
            f"{workload.name}" + (f" (it holds: {'; '.join(others)})" if others else ""),
            fix=f"run the gate with --pack: make gate BUNDLE={args.bundle} "
            f'WORKLOAD={args.workload} GATE_ARGS="--pack {packs_dir} --pack-key <key.pem>"'
            if not others
            else "pass the WORKLOAD= and BUNDLE= of a pack it holds (any spelling of the "
            "file: /path/decoder.py:build and decoder.py:build are one workload)",
        )
    path, manifest = found[0]
    # Every entry as a host will check it before the lane serves it: a pack hosts refuse
    # would replace (and remove) the good pack they fetch now.
    try:
        cache_pack.verify_pack(str(path), keys)
    except cache_pack.PackRefused as refused:
        raise cache_pack.PackRefused(
            f"{refused.message}; not published, lane {lane.name} is unchanged",
            fix=f"run the gate again with --pack to make a new pack (or remove {path} to "
            "publish the newest pack before it)",
        ) from None
    # Published only with the receipt that proved its warm restart: one of the bundle's.
    receipts = {r.digest: r for r in promote.bundle_evidence(
        options.root, args.bundle, config.receipt_stores) if r.digest_ok}  # fmt: skip
    # The locked wheels the receipt must have judged (none yet: no receipt can prove them).
    entry = read_lock(options.lock_path).bundles.get(args.bundle)
    locked = {(r.name, r.sha256) for r in (entry.wheels or ())} if entry else set()
    _require_proof(path.name, manifest.receipt_digest, receipts, lane, args.bundle, locked)
    with _holding(options, lane):
        retained = lane_packs.retained_bundles(lanes.read_record(options.root), lane.name)
        done = lane_packs.publish_pack(lane, path, manifest, retained, dry_run=options.dry_run)
    row = done.row
    verb = "would publish" if options.dry_run else ("published" if done.added else "already in")
    print(f"{verb} {path.name} into lane {lane.name} as {row.path} ({row.size:,} bytes, "
          f"{row.label}, sha256:{row.sha256})")  # fmt: skip
    keeps = ", ".join(
        f"{b} ({why})" for b, why in sorted((str(b), why) for b, why in done.retained.items())
    )
    print(f"lane {lane.name} keeps the packs of: {keeps}")
    for removed, why in done.removed:
        verb = "would remove" if options.dry_run else "removed"
        print(f"{verb} {removed.path} ({removed.label}): {why}")
    if options.dry_run:
        print("DRY_RUN: nothing written into the lane")
    return 0


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define subcommand ``name``'s arguments on ``parser`` and set its handler."""
    # publish-lane and promote write a lane and lanes.lock, not the bundle's files.
    if name == "publish-lane":
        add_bundle_arguments(parser, writes_bundle=False, dry_run=True)
        add_settings(parser, name, "--lane")
        parser.set_defaults(handler=cmd_publish_lane)
    elif name == "promote":
        add_bundle_arguments(parser, writes_bundle=False, dry_run=True)
        add_settings(parser, name, "--lane", "--from")
        parser.set_defaults(handler=cmd_promote)
    elif name == "rollback":
        add_common_arguments(parser, dry_run=True)
        add_settings(parser, name, "--lane", "--to", "--reason")
        parser.set_defaults(handler=cmd_rollback)
    elif name == "compare":
        add_common_arguments(parser)
        parser.add_argument("a", nargs="?", help="a bundle")
        parser.add_argument("b", nargs="?", help="another bundle")
        parser.set_defaults(handler=cmd_compare)
    elif name == "lane-requirements":
        add_common_arguments(parser)
        add_settings(parser, name, "--lane", "--resolve", "--platform", "--public-index")
        parser.set_defaults(handler=cmd_lane_requirements)
    elif name == "lanes":
        add_common_arguments(parser)
        add_settings(parser, name, "--history", "--lane")
        parser.set_defaults(handler=cmd_lanes)
    elif name == "status":
        add_common_arguments(parser)
        add_settings(parser, name, "--json")
        parser.set_defaults(handler=cmd_status)
    elif name == "cache-pack":
        add_bundle_arguments(parser, writes_bundle=False, dry_run=True)
        add_settings(parser, name, "--lane", "--workload", "--packs", "--public-key")
        parser.set_defaults(handler=cmd_cache_pack)
    else:
        raise ValueError(f"{name} is not a subcommand of {__name__}")
