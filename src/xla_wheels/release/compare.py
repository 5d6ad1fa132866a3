"""``compare``: two bundles' receipts side by side, and where they are not like for like."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xla_host import receipt_verdict
from xla_host.gate.checks import compare_rows
from xla_host.gate.report import format_table
from xla_host.receipts import Receipt, StoredReceipt, environment_difference, workload_difference


@dataclass(frozen=True)
class Comparison:
    a: StoredReceipt
    b: StoredReceipt
    rows: tuple[tuple[str, str, str], ...]
    unlike: tuple[str, ...]
    """Why the figures do not compare like for like (empty when they do)."""


def latest_usable(receipts: list[StoredReceipt]) -> StoredReceipt | None:
    """The newest sealed gate receipt (a benchmark receipt if there is no gate one)."""
    sealed = [r for r in receipts if r.digest_ok]
    gates = [r for r in sealed if r.receipt.kind == "gate"]
    chosen = gates or sealed
    return chosen[-1] if chosen else None


def _workload(receipt: Receipt) -> str:
    digest = receipt.workload_sha256
    return receipt.workload + (f" (source sha256 {digest[:12]})" if digest else "")


def _wheels(receipt: Receipt) -> str:
    return ", ".join(f"{w.project} {w.sha256[:12]}" for w in receipt.wheels) or "-"


_ROWS: tuple[tuple[str, Callable[[Receipt], str]], ...] = (
    ("bundle", lambda r: str(r.bundle)),
    ("receipt kind", lambda r: r.kind),
    ("date", lambda r: r.created),
    ("host", lambda r: r.host),
    ("device", lambda r: r.device + (f" {r.chip}" if r.chip else "")),
    ("workload", lambda r: _workload(r)),
    ("topology", lambda r: r.topology or "one host"),
    ("verdict", lambda r: receipt_verdict.judge(r).word),
    ("wheels = lock", lambda r: "yes" if r.wheels_match_lock else "NO"),
    ("wheels (sha256)", _wheels),
    ("torch", lambda r: str(r.versions.get("torch"))),
    ("torch_xla", lambda r: str(r.versions.get("torch_xla"))),
    ("libtpu", lambda r: str(r.versions.get("libtpu") or r.versions.get("libtpu-nightly"))),
    ("jax / jaxlib", lambda r: f"{r.versions.get('jax')} / {r.versions.get('jaxlib')}"),
    # Then each check's own rows, in the gate's order (its registry).
    *((row.label, row.value) for row in compare_rows()),
)


def _profile(receipt: Receipt) -> str:
    if not receipt.profile_name:
        return "none (the caller's environment)"
    return f"{receipt.profile_name} sha256:{str(receipt.profile_sha256)[:12]}"


def _profile_environment(receipt: Receipt) -> dict[str, str]:
    env = (receipt.profile or {}).get("environment")
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}


def profile_rows(ra: Receipt, rb: Receipt) -> list[tuple[str, str, str]]:
    """The launch profile of each receipt, and each of its settings that differs."""
    rows = [("launch profile", _profile(ra), _profile(rb))]
    env_a, env_b = _profile_environment(ra), _profile_environment(rb)
    for name in sorted(set(env_a) | set(env_b)):
        if env_a.get(name) != env_b.get(name):
            rows.append((f"  {name}", env_a.get(name, "-"), env_b.get(name, "-")))
    return rows


def topology_unlike(ra: Receipt, rb: Receipt) -> list[str]:
    """Receipts of different slices (a v6e-8 and a v6e-32, or one recorded and one not)
    are not compared as alike."""
    if ra.topology == rb.topology:
        return []
    a, b = (r.topology or "not recorded" for r in (ra, rb))
    return [f"different topology: {a} vs {b}"]


def compare(a: StoredReceipt, b: StoredReceipt) -> Comparison:
    ra, rb = a.receipt, b.receipt
    rows = [(label, get(ra), get(rb)) for label, get in _ROWS]
    # Next to the workload: the figures below were measured under these settings.
    at = next(i for i, (label, _, _) in enumerate(rows) if label == "workload") + 1
    profiles = profile_rows(ra, rb)
    rows[at:at] = profiles
    unlike: list[str] = []
    if ra.profile_sha256 != rb.profile_sha256:
        changed = ", ".join(label.strip() for label, _, _ in profiles[1:]) or "its name"
        unlike.append(f"different launch profile: {_profile(ra)} vs {_profile(rb)} ({changed})")
    unlike += topology_unlike(ra, rb)
    differences = {
        what: f"{va} vs {vb}"
        for what, va, vb in (
            ("device", ra.device, rb.device),
            ("chip", ra.chip, rb.chip),
            ("libtpu", ra.versions.get("libtpu"), rb.versions.get("libtpu")),
            ("receipt kind", ra.kind, rb.kind),
        )
        if va != vb
    }
    # Another workload is another graph to restart: by name, and by source digest.
    if (workload := workload_difference(ra, rb)) is not None:
        differences["workload"] = workload
    for what in ("device", "chip", "workload", "libtpu", "receipt kind"):
        if what in differences:
            unlike.append(f"different {what}: {differences[what]}")
    if (environment := environment_difference(ra, rb)) is not None:
        unlike.append(f"different launch environment: {environment}")
    if ra.host != rb.host:
        unlike.append(f"different host: {ra.host} vs {rb.host} (timings depend on the machine)")
    for side, stored in (("A", a), ("B", b)):
        verdict = receipt_verdict.judge_stored(stored)
        if not verdict.passed:
            unlike.append(f"{side}'s receipt {verdict.shown}")
    return Comparison(a, b, tuple(rows), tuple(unlike))


def render(comparison: Comparison) -> str:
    table = format_table(["", "A", "B"], [list(r) for r in comparison.rows])
    lines = [f"A: {comparison.a.shown}", f"B: {comparison.b.shown}", "", table, ""]
    if comparison.unlike:
        lines.append("not like for like:")
        lines += [f"  - {u}" for u in comparison.unlike]
    else:
        lines.append(
            "like for like: same device, chip, topology, workload, launch profile and "
            "environment, libtpu and host"
        )
    return "\n".join(lines) + "\n"
