"""A gate run around its receipt, once for both command lines.

The builder's ``xla-wheels gate`` (the checkout's wheels.lock) and the host's
``xla-wheels-host gate`` (the lane's bundle document) differ only in how they write the
receipt; what comes before and after it is :func:`run_and_leave`:

- before any child starts, the receipt store (``--receipts``, ``--sign-key``) is proved
  (:func:`xla_host.receipt_store.upload_for`): a typo costs seconds, not a gate run;
- the run, its verdicts printed; a slice's worker other than 0 leaves no receipt and ends
  as its verdicts do;
- after the receipt: the run's cache pack (``--pack``, ``--pack-key``:
  :func:`xla_host.cache_pack.pack_gate_run`, when the restart check passed), the receipt
  sent to the store, then the verdict: exit 0, or ``GateFailed`` (exit 1) naming the
  checks that failed, only once everything the run leaves is left.

Standard library only: a TPU host runs it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from xla_host import cache_pack, log, receipt_store
from xla_host.gate import arguments as gate_arguments
from xla_host.gate.result import ensure_passed
from xla_host.gate.run import GateConfig, GateOutcome
from xla_host.net import NetworkPolicy


def run_and_leave(
    args: argparse.Namespace,
    config: GateConfig,
    *,
    bundle: str | None,
    network: NetworkPolicy,
    write_receipt: Callable[[GateOutcome], Path],
) -> int:
    """Run the gate of ``config`` and leave what it leaves (module doc); the exit code.

    ``args``: the gate's parsed arguments (``gate.arguments.add_gate_arguments``, the same
    on both command lines); ``bundle``: the bundle the receipt is for (the store keeps
    receipts per bundle); ``network``: the store's time limits and retries;
    ``write_receipt``: the command line's own step, the receipt's path."""
    upload = receipt_store.upload_for(  # before the run
        args.receipts, args.sign_key, bundle,
        uploads=gate_arguments.leaves_receipt(config), network=network,
    )  # fmt: skip
    outcome = gate_arguments.run_printed(config)
    if not gate_arguments.leaves_receipt(config):
        return gate_arguments.ended_without_receipt(config, outcome)
    written = write_receipt(outcome)
    pack = cache_pack.pack_gate_run(
        config.pack_dir, args.pack_key, outcome, written, bundle, config.workload,
        config.child_timeout_s,
    )  # fmt: skip
    if pack is not None:
        log.result(f"cache pack: {pack}")
    receipt_store.send_written(upload, written)
    ensure_passed(outcome.results)
    return 0
