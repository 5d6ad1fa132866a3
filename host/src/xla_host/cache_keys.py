"""Key records: what a run recorded about the persistent-cache keys it took.

A **key record** (``key-record`` 1) is written from a run of ``child_workload.py``'s
``train --record-keys``: the run's components (compile options as XLA parses them, the
switches that shape the module, the platform, the revisions), the topology, and for each
graph it brought: the canonical fingerprint of the module (``gate/hlo_canonical.py``, as
the key probe's children compute it), the sync's persistent-cache hits and misses and the
entry files it wrote. The gate writes one for the pack it makes (``keys.json`` beside its
report; the pack's manifest carries the entries' ``keys``), ``cache record`` for any run
of a workload; ``cache explain`` reads them (:mod:`xla_host.cache_explain`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xla_host.errors import UsageError
from xla_host.filemode import read_shared
from xla_host.gate.children import run_child, runtime_env
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.workload import WorkloadSpec
from xla_host.redact import mask_environment, mask_flag_values
from xla_host.tables import loads_json

RECORD_VERSION = 1


def make_record(child_keys: Mapping[str, Any], workload: str, topology: str) -> dict[str, Any]:
    """A key record from a child's ``keys`` report, its components masked
    (:func:`masked_components`): every writer of key records (``keys.json``, ``cache
    record``, a pack manifest's ``keys``) starts from one."""
    return {
        "key-record": RECORD_VERSION,
        "workload": workload,
        "topology": topology,
        "components": masked_components(child_keys["components"]),
        "graphs": list(child_keys["graphs"]),
    }


def masked_components(components: Mapping[str, Any]) -> dict[str, Any]:
    """A run's key components as a record holds them: each parsed flag of XLA_FLAGS and
    LIBTPU_INIT_ARGS and each custom compile option masked by name or value, each switch
    by its variable's name (:mod:`xla_host.redact`'s rule). Two runs under the same
    secret still compare equal (``cache explain``), under different ones unequal; the key
    the runtime took saw the real values."""
    masked = dict(components)
    options = components.get("compile_options")
    if isinstance(options, Mapping):
        masked["compile_options"] = dict(options)
        for name, value in options.items():
            if isinstance(value, Mapping):
                mask = mask_environment if name == "switches" else mask_flag_values
                masked["compile_options"][name] = mask(value)
    switches = components.get("module_switches")
    if isinstance(switches, Mapping):
        masked["module_switches"] = mask_environment(switches)
    return masked


def manifest_keys(record: Mapping[str, Any], entries: Sequence[str]) -> dict[str, Any]:
    """A pack manifest's ``keys`` from the key record of a run of the same workload:
    each of ``entries`` the record saw written, with its module."""
    modules = {
        name: {"module": graph["module"], "step": graph["step"]}
        for graph in record["graphs"]
        for name in graph.get("entries", ())
        if name in entries
    }
    return {
        "topology": record["topology"],
        "components": record["components"],
        "entries": dict(sorted(modules.items())),
    }


def read_record(path: Path) -> dict[str, Any]:
    fix = "pass a key record: `xla-host cache record --out FILE` writes one, a gate run with " \
        "--pack leaves keys.json beside its report"  # fmt: skip
    try:
        data = loads_json(
            read_shared(path, what="key record"), source=str(path), error=UsageError, fix=fix
        )
    except OSError as error:
        raise UsageError(
            f"the key record {path} cannot be read: {error.strerror}", fix=fix
        ) from None
    except ValueError:
        raise UsageError(f"{path} is not JSON", fix=fix) from None
    if not isinstance(data, dict) or data.get("key-record") != RECORD_VERSION:
        raise UsageError(f"{path} is not a key record (key-record {RECORD_VERSION})", fix=fix)
    return data


def _not_entries(directory: str, names: list[str]) -> set[str]:
    """What a scratch copy of a cache leaves out: hidden names (packs' records, temporary
    files) and anything that is no regular file (a FIFO would fail the copy, a device
    would be read without end), decided from ``lstat``."""
    skipped = set()
    for name in names:
        try:
            mode = os.lstat(os.path.join(directory, name)).st_mode
        except OSError:
            mode = 0
        if name.startswith(".") or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            skipped.add(name)
    return skipped


def record_run(
    python: Path,
    workload: WorkloadSpec,
    device: str,
    topology: str,
    workdir: Path,
    timeout_s: float,
    seed_cache: Path | None = None,
) -> dict[str, Any]:
    """Run ``workload`` once with ``--record-keys`` in a scratch cache directory (a copy
    of ``seed_cache``'s entries, or empty: the user's cache is never written) and return
    its key record. The caller's environment (XLA_FLAGS, XLA_USE_BF16, ...) is the run's."""
    workdir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="xla-keys-"))
    try:
        cache = scratch / "cache"
        if seed_cache is not None and seed_cache.is_dir():
            shutil.copytree(seed_cache, cache, ignore=_not_entries)
        else:
            cache.mkdir()
        result = run_child(
            python, "key-record", workdir,
            ["--mode", "train", *workload.child_args(), "--record-keys"],
            runtime_env(device, cache_dir=cache), timeout_s,
        )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = result.report or {}
    if not report.get("ok") or "keys" not in report:
        raise GateEnvironmentError(
            f"the key-record run of {workload} failed: {report.get('error', 'no report')}",
            fix=f"read its log: {result.log_path}",
        )
    return make_record(report["keys"], workload.name, topology)
