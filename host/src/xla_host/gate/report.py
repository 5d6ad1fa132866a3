"""Gate reports: a table for people (stdout), JSON and JUnit XML for machines."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from xla_host import filemode
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target

REPORT_JSON = "report.json"
REPORT_JUNIT = "junit.xml"

_RUN_COLUMNS = (
    ("run", "name", "{}"),
    ("import s", "import_s", "{:.2f}"),
    ("ready s", "ready_s", "{:.2f}"),
    # How many graphs time-to-ready covers (the warm-up's: two with Adam or AdamW).
    ("graphs", "ready_graphs", "{}"),
    ("1st step s", "time_to_first_step_s", "{:.2f}"),
    ("steady s", "steady_step_s", "{:.3f}"),
    ("miss", "misses", "{}"),
    ("hit", "hits", "{}"),
    ("deser fail", "deserialize_failures", "{}"),
    ("compiles", "xla_compiles", "{}"),
)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else fmt.format(value)


def render_text(
    target: Target | None, results: Sequence[CheckResult], error: str | None = None
) -> str:
    lines = ["", "torch_xla ship gate"]
    if target is not None:
        lines.append(f"  build:  {target.label}  ({target.python})")
    if error is not None:
        lines += [f"  ERROR (environment unusable): {error}", ""]
        return "\n".join(lines)
    for result in results:
        lines += ["", f"[{'PASS' if result.passed else 'FAIL'}] {result.name}"]
        lines += [f"  - {reason}" for reason in result.reasons]
        lines += [f"  . {note}" for note in result.notes]
        lines += _status_rows(result.figures)
        if result.name in ("restart", "spmd-restart") and result.runs:
            rows = [[_cell(r, k, f) for _, k, f in _RUN_COLUMNS] for r in result.runs]
            table = format_table([h for h, _, _ in _RUN_COLUMNS], rows)
            lines += ["", *("  " + t for t in table.splitlines())]
            figures = result.figures
            if "warm_cold_ratio" in figures:
                lines.append(
                    f"  warm/cold time-to-ready: {figures['warm_ready_s']:.2f}s / "
                    f"{figures['cold_ready_s']:.2f}s = {figures['warm_cold_ratio']:.2f} "
                    "(wall time, reported)"
                )
            if "warm_cold_sync_cpu_ratio" in figures:
                lines.append(
                    f"  warm/cold CPU of the warm-up's syncs: {figures['warm_sync_cpu_s']:.2f}s / "
                    f"{figures['cold_sync_cpu_s']:.2f}s = "
                    f"{figures['warm_cold_sync_cpu_ratio']:.2f} "
                    f"(limit {figures['max_warm_ratio']:.2f})"
                )
    verdict = "PASS" if results and all(r.passed for r in results) else "FAIL"
    lines += ["", f"gate verdict: {verdict}", ""]
    return "\n".join(lines)


def _status_rows(figures: dict[str, Any]) -> list[str]:
    """Per-variant (cache-key) or per-case (upstream test) verdicts, one line each."""
    described = [
        (e, f"{e['variant']} ({e['setting']}; must {e['expect']})")
        for e in figures.get("variants", [])
    ]
    described += [(e, f"{e['case']} ({e['outcome']})") for e in figures.get("cases", [])]
    return [
        f"  {e['status'].upper():<15} {what}" + (f": {e['reason']}" if "reason" in e else "")
        for e, what in described
    ]


def _target_json(target: Target | None) -> dict[str, Any] | None:
    if target is None:
        return None
    return {
        **asdict(target),
        "python": str(target.python),
        "runtime_devices": list(target.runtime_devices),
    }


def write_reports(
    out_dir: Path,
    target: Target | None,
    results: Sequence[CheckResult],
    *,
    error: str | None = None,
    settings: dict[str, Any] | None = None,
    exit_code: int | None = None,
) -> tuple[Path, Path]:
    """``exit_code``: the run's, where an error has its own (a slice that timed out: 8)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    status = (
        "error" if error else ("pass" if results and all(r.passed for r in results) else "fail")
    )
    if exit_code is None:
        exit_code = {"pass": 0, "fail": 1, "error": 2}[status]
    payload = {
        "status": status,
        "exit_code": exit_code,
        "error": error,
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "target": _target_json(target),
        "settings": settings or {},
        "checks": [r.to_json() for r in results],
    }
    json_path = out_dir / REPORT_JSON
    junit_path = out_dir / REPORT_JUNIT
    # Both or neither, each complete: a full disk leaves the reports as they were and an
    # error naming the file, never an empty report.json a CI job would read.
    filemode.write_all(
        [
            (json_path, json.dumps(payload, indent=2, sort_keys=True) + "\n"),
            (junit_path, render_junit(target, results, error)),
        ]
    )
    return json_path, junit_path


def render_junit(target: Target | None, results: Sequence[CheckResult], error: str | None) -> str:
    suite = ET.Element(
        "testsuite",
        {
            "name": "xla-wheels-gate",
            "tests": str(len(results) or 1),
            "failures": str(sum(not r.passed for r in results)),
            "errors": "1" if error else "0",
            "time": f"{sum(r.duration_s for r in results):.3f}",
        },
    )
    if target is not None:
        props = ET.SubElement(suite, "properties")
        for key, value in (_target_json(target) or {}).items():
            ET.SubElement(props, "property", {"name": key, "value": str(value)})
    classname = f"gate.{target.device if target else 'unknown'}"
    if error:
        case = ET.SubElement(suite, "testcase", {"classname": classname, "name": "environment"})
        ET.SubElement(case, "error", {"message": error}).text = error
    for result in results:
        case = ET.SubElement(
            suite,
            "testcase",
            {"classname": classname, "name": result.name, "time": f"{result.duration_s:.3f}"},
        )
        if not result.passed:
            message = "; ".join(result.reasons)
            ET.SubElement(case, "failure", {"message": message}).text = "\n".join(result.reasons)
        out = ET.SubElement(case, "system-out")
        out.text = json.dumps(result.figures, sort_keys=True, default=str)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
