"""Receipts: what the gate (or the restart benchmark) judged, for exactly which wheels.

This module owns the format. A receipt is one JSON file,
``receipts/<bundle>/<UTC time>-<device>[-<chip>]-<kind>.json`` next to ``wheels.lock``,
reviewed in pull requests like any other evidence. Keys (``receipt-version`` 1)::

    receipt-version  "1"
    kind             "gate" | "bench"
    bundle           the bundle whose locked wheels were compared (null: none named)
    created, host    UTC time (ISO 8601) and host name of the run
    device, chip     "CPU" | "TPU"; "v6e"-style chip generation on TPU, else null
    workload         the gate's workload: a preset's name (small, medium, large), a file's
                     ``<file name>:<factory>`` or ``<module>:<factory>`` (gate.workload)
    workload-sha256  sha256 of the source file holding the workload's factory (absent in
                     receipts from before the gate loaded workloads by protocol)
    workload-params  the workload's own description of itself (a preset's shapes), when given
    versions         torch, torch_xla, libtpu, libtpu-nightly, jax, jaxlib as installed
                     (null: not installed)
    wheels-match-lock  true only when every locked wheel was found installed byte for byte
    wheels           [{name, sha256, project, version, matched, files, problems}]: the
                     lock's files and what the content comparison found (release.installed)
    problems         why the environment is not the lock's wheels (empty when it is)
    checks           [{name, passed, reasons, figures}]: the gate's verdicts and figures
                     (restart: cold/warm time-to-ready, misses, hits, compiles, peak host
                     memory and the restart's phases per run, and ``memory``,
                     ``breakdown``, ``load_floor`` for the check: gate.recalibration;
                     hbm: per-chip figures); bench: medians and spread, passed = null
    bundle-document  (a host's gate: ``xla_host.cli``) "sha256:<hex>" of the bundle
                     document it judged against
    profile          (when the gate ran under a launch profile, ``make gate PROFILE=``)
                     {name, sha256, environment, set-by-gate, inert}: the profile, its
                     digest as wheels.lock records it, what the children got from it, and
                     which settings the gate controlled itself or were inert on the device
                     (gate.under_profile); absent: the caller's environment, no profile
    launch-environment  the runtime environment every child started with (XLA_FLAGS,
                     LIBTPU_INIT_ARGS, PJRT_*, XLA_*, TPU_* and the other switches torch_xla
                     reads; gate.children.launch_environment), so runs under other flags
                     are told apart (absent in receipts from before it was recorded)
    slice            (when the gate ran as worker 0 of a slice, ``--workers``/TPU_WORKER_ID)
                     {accelerator-type, hosts, chips-per-host, topology, workers: [{worker,
                     host, role, addressable-devices, checks: [{name, passed, reasons}]}]}:
                     what promotion compares receipts by (``topology``) and every worker's
                     verdicts (xla_host.gate.slice); absent: one host, topology not recorded
    digest           "sha256:<hex>" of the canonical JSON of every other key

The digest is a tamper seal, not a signature: anyone can recompute it, so it catches an
edited figure or hash, not a forger; review in a pull request is the trust boundary.
Promotion refuses a receipt whose digest does not match, whose ``wheels-match-lock`` is
false, or whose wheel hashes are not the lock's.

A receipt may also come signed: the same JSON as the payload of a DSSE envelope
(``receipt_signing``), read here from its payload; a lane that requires signatures has
them verified on the builder side. Receipts also live in a lane's store
(``receipt_store``), as ``<store>/<bundle>/<file>``.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from xla_host import filemode, receipt_signing
from xla_host.errors import PipelineError
from xla_host.gate.children import PER_HOST_NAMES, launch_environment
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target
from xla_host.installed import EnvironmentMatch, InstalledFacts, WheelMatch
from xla_host.tables import Table, loads_json, read_regular

RECEIPT_VERSION = "1"
RECEIPTS_DIRNAME = "receipts"
#: Per-run keys of the restart check kept in a receipt (logs and paths stay in out/).
_RUN_KEYS = (
    "name",
    "ok",
    "ready_s",
    "time_to_first_step_s",
    "import_s",
    "misses",
    "hits",
    "deserialize_failures",
    "xla_compiles",
    "host_peak_rss_bytes",
    "breakdown",
    "ready_steps",
    "ready_graphs",
)


class ReceiptError(PipelineError):
    """A receipt file is unreadable, malformed or was edited after it was written."""


@dataclass(frozen=True)
class CheckEvidence:
    name: str
    passed: bool | None
    """None for a measurement that judges nothing (the benchmark)."""
    reasons: tuple[str, ...]
    figures: Mapping[str, Any]


@dataclass(frozen=True)
class Receipt:
    kind: str
    bundle: str | None
    created: str
    host: str
    device: str
    chip: str | None
    workload: str
    versions: Mapping[str, str | None]
    wheels_match_lock: bool
    wheels: tuple[WheelMatch, ...]
    problems: tuple[str, ...]
    checks: tuple[CheckEvidence, ...]
    profile: Mapping[str, Any] | None = None
    bundle_document: str | None = None
    """``sha256:<hex>`` of the bundle document a host judged against (``xla_host.cli``):
    promotion can tell the receipt was made under the document the lane published."""
    workload_sha256: str | None = None
    workload_params: Mapping[str, Any] | None = None
    slice: Mapping[str, Any] | None = None
    launch_environment: Mapping[str, str] | None = None

    @property
    def topology(self) -> str | None:
        """The slice's topology (``v6e-32``, ``cpu-2x1``); None when not recorded."""
        value = self.slice.get("topology") if self.slice else None
        return str(value) if value is not None else None

    @property
    def profile_name(self) -> str | None:
        return str(self.profile["name"]) if self.profile else None

    @property
    def profile_sha256(self) -> str | None:
        return str(self.profile["sha256"]) if self.profile else None

    def check(self, name: str) -> CheckEvidence | None:
        return next((c for c in self.checks if c.name == name), None)

    def figure(self, check: str, key: str) -> Any:
        """A figure of one check; None when the check or the figure is absent."""
        found = self.check(check)
        return found.figures.get(key) if found else None

    @property
    def locked_files(self) -> set[tuple[str, str]]:
        return {(w.name, w.sha256) for w in self.wheels}

    def payload(self) -> dict[str, Any]:
        """Every key of the file but the digest: the fields, spelled with dashes."""
        # Through JSON and back: what the file will hold (tuples as lists, others as str).
        data = json.loads(json.dumps(asdict(self), sort_keys=True, default=str))
        # Only when there is one: a receipt without it reads (and seals) as before (only a
        # host's receipt has a bundle document, only a slice's has a slice).
        optional = ("profile", "bundle_document", "workload_sha256", "workload_params", "slice")
        for key in (*optional, "launch_environment"):
            if data[key] is None:
                del data[key]
        return {
            "receipt-version": RECEIPT_VERSION,
            **{k.replace("_", "-"): v for k, v in data.items()},
        }


@dataclass(frozen=True)
class StoredReceipt:
    """A receipt read from disk, with whether its seal holds."""

    path: Path
    receipt: Receipt
    digest: str
    digest_ok: bool
    raw: bytes = b""
    """The file's bytes as read (a signed receipt's: its DSSE envelope)."""
    origin: str | None = None
    """Where it was read from when not a file here: its URL in a receipt store
    (``receipt_store``); ``path`` is then ``<bundle>/<file>``."""

    @property
    def shown(self) -> str:
        return self.origin or str(self.path)

    @property
    def envelope(self) -> dict[str, Any] | None:
        """The DSSE envelope a signed receipt came in (None: unsigned)."""
        data = json.loads(self.raw) if self.raw.lstrip().startswith(b"{") else None
        return data if receipt_signing.is_envelope(data) else None


def environment_difference(a: Receipt, b: Receipt) -> str | None:
    """The launch-environment variables two receipts' runs differ in, or None when they
    agree (or either is from before the environment was recorded). Which host or worker
    ran (``PER_HOST_NAMES``) is not a difference."""
    if a.launch_environment is None or b.launch_environment is None:
        return None
    names = sorted((set(a.launch_environment) | set(b.launch_environment)) - PER_HOST_NAMES)
    differ = [
        f"{name} {a.launch_environment.get(name, '(unset)')!r} vs "
        f"{b.launch_environment.get(name, '(unset)')!r}"
        for name in names
        if a.launch_environment.get(name) != b.launch_environment.get(name)
    ]
    return "; ".join(differ) or None


def workload_difference(a: Receipt, b: Receipt) -> str | None:
    """Why two receipts' figures come from different workloads, or None when they are the
    same one: the same name and, where both record it, the same source digest. A receipt
    from before digests were recorded (a preset's name only) matches by name."""
    if a.workload != b.workload:
        return f"{a.workload} vs {b.workload}"
    if a.workload_sha256 and b.workload_sha256 and a.workload_sha256 != b.workload_sha256:
        return (
            f"{a.workload} from source sha256 {a.workload_sha256[:12]} vs "
            f"{b.workload_sha256[:12]} (its source changed)"
        )
    return None


def canonical_digest(payload: Mapping[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def render(receipt: Receipt) -> str:
    payload = receipt.payload()
    return (
        json.dumps({**payload, "digest": canonical_digest(payload)}, indent=2, sort_keys=True)
        + "\n"
    )


def _restart_figures(result: CheckResult) -> dict[str, Any]:
    figures = {k: v for k, v in result.figures.items() if k != "baseline_file"}
    figures["runs"] = [{k: run[k] for k in _RUN_KEYS if k in run} for run in result.runs]
    return figures


def receipt_from_gate(
    target: Target,
    results: Sequence[CheckResult],
    *,
    bundle: str | None,
    workload: str,
    facts: InstalledFacts,
    match: EnvironmentMatch | None,
) -> Receipt:
    """The one seam between the gate's result objects and the receipt format."""
    checks = tuple(
        CheckEvidence(
            r.name,
            r.passed,
            tuple(r.reasons),
            _restart_figures(r) if r.name == "restart" else dict(r.figures),
        )
        for r in results
    )
    return _receipt("gate", target, checks, bundle, workload, facts, match)


def receipt_from_bench(
    target: Target,
    summary: Mapping[str, Any],
    *,
    bundle: str | None,
    facts: InstalledFacts,
    match: EnvironmentMatch | None,
) -> Receipt:
    figures = {
        k: summary[k]
        for k in ("import_s", "cold", "warm", "ratio_ready", "ratio_time_to_first_step", "rounds")
        if k in summary
    }
    check = CheckEvidence("bench", None, (), figures)
    return _receipt("bench", target, (check,), bundle, str(summary.get("workload")), facts, match)


def _receipt(
    kind: str,
    target: Target,
    checks: tuple[CheckEvidence, ...],
    bundle: str | None,
    workload: str,
    facts: InstalledFacts,
    match: EnvironmentMatch | None,
) -> Receipt:
    versions = dict(facts.versions)
    versions.setdefault("torch", target.torch_version)
    versions.setdefault("torch_xla", target.torch_xla_version)
    # The workload as the gate's probe loaded it (gate.workload): its digest and params.
    loaded = target.workload or {}
    sha256, params = loaded.get("sha256"), loaded.get("params")
    if bundle is None:
        problems: tuple[str, ...] = (
            "no bundle named (BUNDLE=): these wheels were not compared with any lock entry",
        )
    elif match is None:
        problems = (f"bundle {bundle} records no wheels in wheels.lock",)
    else:
        problems = match.problems
    return Receipt(
        kind=kind,
        bundle=bundle,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        host=socket.gethostname(),
        device=target.device,
        chip=f"v{target.tpu_version}" if target.device == "TPU" and target.tpu_version else None,
        workload=workload,
        versions=versions,
        wheels_match_lock=bool(match and match.matches_lock and bundle),
        wheels=match.wheels if match else (),
        problems=problems,
        checks=checks,
        workload_sha256=str(sha256) if sha256 else None,
        workload_params=dict(params) if isinstance(params, dict) else None,
        launch_environment=launch_environment(target.device),
    )


def receipt_file_name(receipt: Receipt) -> str:
    stamp = receipt.created.replace(":", "").replace("-", "")
    device = receipt.device.lower() + (f"-{receipt.chip}" if receipt.chip else "")
    return f"{stamp}-{device}-{receipt.kind}.json"


def receipt_path(root: Path, receipt: Receipt) -> Path:
    return root / RECEIPTS_DIRNAME / str(receipt.bundle) / receipt_file_name(receipt)


def write_receipt(path: Path, receipt: Receipt, *, replace: bool = False) -> Path:
    """Write by rename; never over an existing receipt (evidence is append-only) unless
    ``replace`` (the scratch receipt of a run that named no bundle, in out/)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = path, 1
    while candidate.exists() and not replace:
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    filemode.write_by_rename(candidate, render(receipt))
    return candidate


_RESTORE = "receipts are written by `make gate BUNDLE=…`; restore the file from git"
_WHEEL_KEYS = {
    "name": str,
    "sha256": str,
    "project": str,
    "version": str,
    "matched": bool,
    "files": int,
}


def _wheel_match(row: Table) -> WheelMatch:
    # A hand-edited entry without a key is a named error, not a KeyError traceback.
    return WheelMatch(
        **{key: row.get(key, kind, required=True) for key, kind in _WHEEL_KEYS.items()},
        problems=tuple(str(p) for p in row.data.get("problems", [])),
    )


def _check_evidence(row: Table) -> CheckEvidence:
    return CheckEvidence(
        row.get("name", str, required=True),
        row.data.get("passed"),
        tuple(row.data.get("reasons", [])),
        dict(row.data.get("figures", {})),
    )


def read_receipt(path: Path) -> StoredReceipt:
    try:
        raw = read_regular(path, ReceiptError, what="receipt")
    except OSError as error:
        raise ReceiptError(
            f"{path} is not a readable receipt: {error}", fix="restore it from git or delete it"
        ) from error
    return parse_receipt(raw, path)


def parse_receipt(raw: bytes, path: Path, origin: str | None = None) -> StoredReceipt:
    """A receipt from its bytes; a signed one (a DSSE envelope) is read from its payload,
    whose signature the builder side verifies (``release.receipt_trust``)."""
    try:
        data = loads_json(raw, source=origin or str(path), error=ReceiptError, fix=_RESTORE)
        if receipt_signing.is_envelope(data):
            signed = receipt_signing.envelope_payload(data, origin or str(path))
            data = loads_json(signed, source=origin or str(path), error=ReceiptError)
    except ValueError as error:
        raise ReceiptError(
            f"{origin or path} is not a readable receipt: {error}",
            fix="restore it from git or delete it",
        ) from error
    version = data.get("receipt-version") if isinstance(data, dict) else None
    if version != RECEIPT_VERSION:
        raise ReceiptError(
            f"{origin or path} has receipt-version {version!r}, this pipeline reads "
            f"{RECEIPT_VERSION!r}",
            fix="produce a new receipt with `make gate BUNDLE=…`",
        )
    digest = str(data.get("digest", ""))
    payload = {k: v for k, v in data.items() if k != "digest"}
    top = Table(data, source=origin or str(path), error=ReceiptError, fix=_RESTORE)

    def required(key: str, kind: type) -> Any:
        return top.get(key, kind, required=True)

    # rows() is None for an absent key, which required() then names.
    wheels = tuple(_wheel_match(row) for row in top.rows("wheels") or required("wheels", list))
    checks = tuple(_check_evidence(row) for row in top.rows("checks") or required("checks", list))
    receipt = Receipt(
        kind=required("kind", str),
        bundle=data.get("bundle"),
        created=required("created", str),
        host=required("host", str),
        device=required("device", str),
        chip=data.get("chip"),
        workload=required("workload", str),
        versions=required("versions", dict),
        wheels_match_lock=required("wheels-match-lock", bool),
        wheels=wheels,
        problems=tuple(required("problems", list)),
        checks=checks,
        profile=data["profile"] if isinstance(data.get("profile"), dict) else None,
        bundle_document=top.get("bundle-document", str),
        workload_sha256=top.get("workload-sha256", str),
        workload_params=top.get("workload-params", dict),
        slice=data["slice"] if isinstance(data.get("slice"), dict) else None,
        launch_environment=top.get("launch-environment", dict),
    )
    return StoredReceipt(path, receipt, digest, digest == canonical_digest(payload), raw, origin)


def bundle_receipts(root: Path, bundle: str) -> list[StoredReceipt]:
    """Every receipt of ``bundle``, oldest first (file names start with the UTC time)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", bundle):
        return []
    directory = root / RECEIPTS_DIRNAME / bundle
    return [read_receipt(p) for p in sorted(directory.glob("*.json"))]
