"""The outcome of one gate check, independent of the others."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from xla_host.gate.errors import GateFailed


@dataclass
class CheckResult:
    """A verdict: ``passed`` plus the reasons that decided it and the figures behind it."""

    name: str
    passed: bool
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def verdict(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        return f"{head} {self.name}: " + ("; ".join(self.reasons) if self.reasons else "ok")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "notes": self.notes,
            "figures": self.figures,
            "runs": self.runs,
            "duration_s": round(self.duration_s, 3),
        }


def failed(name: str, *reasons: str, **figures: Any) -> CheckResult:
    return CheckResult(name=name, passed=False, reasons=list(reasons), figures=dict(figures))


def ensure_passed(results: Sequence[CheckResult]) -> None:
    """Raise :class:`GateFailed` (exit 1) when a check failed, as doctor and verify-install do."""
    failures = [r.name for r in results if not r.passed]
    if failures:
        raise GateFailed(
            f"the gate failed: {', '.join(failures)}",
            fix="read the verdicts above (report.json and the child logs say why); do not "
            "ship this build",
        )
