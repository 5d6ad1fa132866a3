"""Upstream's own persistent-cache test, run on CPU against the environment under test.

pytorch/xla's ``test/test_persistent_cache.py`` skips itself unless the device is a TPU
(or Neuron), and upstream's TPU CI does not run it, so nothing upstream exercises it. The
gate copies it from a given pytorch/xla checkout (a work tree, or a bare repository read
at a revision) into a temporary directory, lifts the device skips on the copy, and runs it
with the judged interpreter, ``PJRT_DEVICE=CPU`` and ``CPU_NUM_DEVICES=4``.

The transform (``lift_device_skips``), applied to the copy only: every decorator of the
form ``@absltest.skipUnless(xr.device_type() == 'TPU', ...)`` or
``@absltest.skipUnless(xr.device_type() in {...}, ...)`` gets ``True`` as its condition;
nothing else changes. If the file has no such decorator the transform refuses (upstream
changed the file; the gate must not run something it does not understand).

Cases known not to apply on CPU are reported as such, with the reason, never as a pass:
``persistent_cache_mp`` cannot initialise its per-process cache on CPU (``xmp.spawn``
brings the runtime up first; measured on stock 2.7.0, whose cache works).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from xla_host import lineage, log, runner
from xla_host.gate.children import kill_group, runtime_env
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target

NAME = "upstream-persistent-cache"
TEST_PATH = "test/test_persistent_cache.py"
CPU_DEVICES = 4
#: Case -> why it cannot be judged on CPU (its outcome is reported, not counted).
KNOWN_NOT_APPLICABLE_ON_CPU: dict[str, str] = {
    "test_persistent_cache_mp": (
        "on CPU, xmp.spawn brings each process's runtime up (runtime.global_ordinal()) "
        "before the case calls xr.initialize_cache, which then asserts 'Computation cache "
        "has already been initialized'; it fails so on stock 2.7.0, whose cache works, so "
        "its outcome says nothing about the cache"
    ),
}
_SKIP = re.compile(
    r"(@absltest\.skipUnless\()\s*xr\.device_type\(\)\s*(?:==\s*'[A-Z]+'|in\s*\{[^}]*\})"
)


@dataclass(frozen=True)
class CaseResult:
    name: str
    outcome: str  # passed | failed | error | skipped
    message: str = ""


def lift_device_skips(source: str) -> tuple[str, int]:
    """The test file with its device skips' conditions replaced by ``True``, and how many."""
    return _SKIP.subn(r"\1True", source)


def read_test_file(checkout: Path, revision: str | None = None) -> str:
    """``test/test_persistent_cache.py`` of a work tree, or of a (bare) repository at a revision."""
    if revision is None and (checkout / TEST_PATH).is_file():
        return (checkout / TEST_PATH).read_text(encoding="utf-8")
    spec = f"{revision or 'HEAD'}:{TEST_PATH}"
    git_dir = checkout / ".git" if (checkout / ".git").exists() else checkout
    # The directory joined to its option, the revision after --end-of-options: neither is
    # read as an option whatever the user named.
    argv = [
        "git",
        f"--git-dir={git_dir}",
        "show",
        *runner.after_options(spec, separator="--end-of-options"),
    ]
    try:
        shown = runner.run(argv, echo="none", timeout=60, check=False)
        detail, ok = shown.stderr.strip(), shown.returncode == 0
    except runner.StepTimedOut as error:
        detail, ok = error.message, False
    except OSError as error:
        detail, ok = str(error), False
    if not ok:
        raise GateEnvironmentError(
            f"no {TEST_PATH} in {checkout}{f' at {revision}' if revision else ''}: {detail}",
            fix="pass --upstream-tests a pytorch/xla checkout (work tree or bare repository)",
        )
    return shown.stdout  # ok implies shown is set


def parse_junit(text: str) -> list[CaseResult]:
    """Cases of absltest's ``--xml_output_file`` report."""
    cases = []
    for case in ET.fromstring(text).iter("testcase"):
        name = case.get("name", "?")
        failure = case.find("failure")
        node = failure if failure is not None else case.find("error")
        if node is not None:
            message = (node.get("message") or node.text or "").strip().splitlines()
            outcome = "failed" if node is failure else "error"
            cases.append(CaseResult(name, outcome, message[-1][:300] if message else ""))
        elif case.get("result") == "suppressed" or case.find("skipped") is not None:
            cases.append(CaseResult(name, "skipped"))
        else:
            cases.append(CaseResult(name, "passed"))
    return cases


def judge_upstream(
    cases: list[CaseResult],
    device: str,
    *,
    lifted: int,
    exit_code: int | None,
    timed_out: bool = False,
) -> CheckResult:
    """Each case with its verdict; known-not-applicable cases reported, not counted."""
    reasons: list[str] = []
    notes = [f"device skips lifted on the copy: {lifted}"]
    rows = []
    for case in cases:
        why = KNOWN_NOT_APPLICABLE_ON_CPU.get(case.name) if device == "CPU" else None
        status = "not applicable" if why else case.outcome
        row = {"case": case.name, "outcome": case.outcome, "status": status}
        if case.message:
            row["message"] = case.message
        if why:
            row["reason"] = why
        elif case.outcome in ("failed", "error"):
            reasons.append(f"{case.name}: {case.outcome}: {case.message}")
        elif case.outcome == "skipped":
            reasons.append(f"{case.name}: skipped although the device skips were lifted")
        rows.append(row)
    if timed_out:
        reasons.append("the upstream test did not finish in time (process group killed)")
    elif not cases:
        reasons.append(f"the upstream test reported no cases (exit {exit_code})")
    return CheckResult(NAME, not reasons, reasons, notes, {"cases": rows})


def prepare(checkout: Path, revision: str | None = None) -> tuple[str, int]:
    """The lifted test source and how many skips were lifted; refuses what it cannot lift.

    Called before any check runs, so a wrong checkout fails fast (exit 2).
    """
    source, lifted = lift_device_skips(read_test_file(checkout, revision))
    if lifted == 0:
        raise GateEnvironmentError(
            f"{TEST_PATH} in {checkout} has no device skip the gate knows how to lift",
            fix="update xla_host.gate.upstream_tests for the new file, or pass an older checkout",
        )
    return source, lifted


def run_upstream_test(
    target: Target,
    checkout: Path,
    runs_dir: Path,
    *,
    revision: str | None = None,
    timeout_s: float = 900.0,
    prepared: tuple[str, int] | None = None,
) -> CheckResult:
    began = time.monotonic()
    source, lifted = prepared or prepare(checkout, revision)
    runs = runs_dir / "upstream"
    runs.mkdir(parents=True, exist_ok=True)
    log_path = runs / "test_persistent_cache.log"
    junit = runs / "test_persistent_cache.xml"
    junit.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="xla-gate-upstream-") as tmp:
        copy = Path(tmp) / "test_persistent_cache.py"
        copy.write_text(source, encoding="utf-8")
        (runs / "test_persistent_cache.lifted.py").write_text(source, encoding="utf-8")
        env = runtime_env(target.device, cpu_devices=CPU_DEVICES)
        env["TMPDIR"] = tmp
        argv = [str(target.python), str(copy), f"--xml_output_file={junit}"]
        log.command(argv)
        timed_out = False
        title = f"upstream {TEST_PATH} (device skips lifted)"
        with log.section(title), open(log_path, "wb") as out:
            # Not runner.run: the test's own processes (xmp.spawn's workers) must end with it,
            # so it runs in a process group of its own that is killed as one.
            process = lineage.popen(
                argv, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                if process.returncode is None:
                    kill_group(process)
    cases = parse_junit(junit.read_text()) if junit.exists() and not timed_out else []
    result = judge_upstream(
        cases, target.device, lifted=lifted, exit_code=process.returncode, timed_out=timed_out
    )
    result.figures.update({"log": str(log_path), "checkout": str(checkout)})
    result.duration_s = time.monotonic() - began
    return result
