"""Errors of the gate stage, mapped to the gate's exit codes by the CLI edge.

Exit 1 means the build under test failed a check; exit 2 means the gate could not judge
it at all (no torch_xla, no such device, no usable environment).
"""

from __future__ import annotations

from xla_host.errors import CheckFailed, ExitCode, PipelineError


class GateEnvironmentError(PipelineError):
    """The environment cannot run the gate: the message says what to fix."""

    exit_code = ExitCode.BAD_INPUT


class GateFailed(CheckFailed):
    """At least one check failed; the report printed before it carries the verdicts."""
