"""The exit-code table written out: the CLI's ``--help`` epilog and the docs' table.

Both are made from :class:`xla_host.errors.ExitCode` and its meanings, so neither is
written by hand. The docs' table (``docs/exit-codes.md``) also names the exception classes
that carry each code, found by importing every module of the package (only when the table
is written, never on a CLI run). ``make generate``
rewrites the table between its marker comments; a test fails while it is not current.
"""

from __future__ import annotations

import importlib
import pkgutil
import textwrap
from pathlib import Path

import xla_host
import xla_wheels
from xla_host.errors import MEANINGS, ExitCode, PipelineError

BEGIN = "<!-- exit-codes:begin (make generate) -->"
END = "<!-- exit-codes:end -->"

#: Codes no PipelineError carries: a run interrupted by a signal (``xla_host.signals``).
NOT_AN_ERROR = {
    ExitCode.OK: "",
    ExitCode.SIGHUP: "`signals.Terminated` (SIGHUP)",
    ExitCode.SIGINT: "`KeyboardInterrupt` (Ctrl-C)",
    ExitCode.SIGPIPE: "`BrokenPipeError` (stdout closed)",
    ExitCode.SIGTERM: "`signals.Terminated` (SIGTERM)",
}


def help_epilog() -> str:
    """The lines ``xla-wheels --help`` ends with."""
    rows = [
        textwrap.fill(
            MEANINGS[code],
            width=88,
            initial_indent=f"  {int(code):>3}  ",
            subsequent_indent=" " * 7,
            break_on_hyphens=False,
        )
        for code in ExitCode
    ]
    return "exit codes:\n" + "\n".join(rows)


def error_classes() -> list[type[PipelineError]]:
    """Every :class:`PipelineError` subclass of both packages (the builder side and the
    host side), each module imported once."""
    for package in (xla_wheels, xla_host):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)
    found: set[type[PipelineError]] = set()
    pending = [PipelineError]
    while pending:  # a class with two parents (VerifyFailed) is met twice, kept once
        cls = pending.pop()
        found.add(cls)
        pending.extend(cls.__subclasses__())
    return sorted(
        (cls for cls in found if cls.__module__.startswith(("xla_wheels.", "xla_host."))),
        key=lambda cls: cls.__name__,
    )


def readme_table() -> str:
    """The README's table: code, name, meaning, the classes that carry it."""
    carriers: dict[int, list[str]] = {int(code): [] for code in ExitCode}
    for cls in error_classes():
        carriers.setdefault(int(cls.exit_code), []).append(f"`{cls.__name__}`")
    lines = [
        BEGIN,
        "| code | name | meaning | raised as |",
        "|---:|---|---|---|",
    ]
    for code in ExitCode:
        raised = NOT_AN_ERROR.get(code) or ", ".join(carriers[int(code)])
        lines.append(f"| {int(code)} | {code.name} | {MEANINGS[code]} | {raised} |")
    lines.append(END)
    return "\n".join(lines)


def rewrite(text: str) -> str:
    """``text`` with the block between :data:`BEGIN` and :data:`END` made current."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + readme_table() + text[end:]


def outputs(root: Path) -> dict[Path, str]:
    """The page this module writes (``make generate``): docs/exit-codes.md's table."""
    page = root / "docs" / "exit-codes.md"
    return {page: rewrite(page.read_text(encoding="utf-8"))}
