"""The plan's data types: commands and stages as data, printed by a dry run and executed
by a real run.

This is a low module: every stage may import it, and it imports nothing of the pipeline
but ``log``. As in JAX's ``build/build.py``, a stage composes its commands as these
objects; the dry run prints them and the real run executes the very same objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from xla_host import log
from xla_host.redact import mask_url_credentials, printable


@dataclass(frozen=True)
class PlannedCommand:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    note: str = ""

    def render(self) -> str:
        line = log.format_command(list(self.argv), dict(self.env) or None, self.cwd)
        return f"{line}    # {self.note}" if self.note else line


@dataclass(frozen=True)
class PlannedStage:
    name: str
    facts: tuple[str, ...] = ()
    commands: tuple[PlannedCommand, ...] = ()


def render_plan(stages: list[PlannedStage]) -> str:
    lines = []
    for number, stage in enumerate(stages, start=1):
        lines.append(f"[{number}/{len(stages)}] {stage.name}")
        lines.extend(f"    {fact}" for fact in stage.facts)
        lines.extend(f"    $ {command.render()}" for command in stage.commands)
    # Facts name remotes and indexes as the manifests give them: a URL may carry credentials.
    # A manifest's values may carry terminal escapes: shown escaped.
    return printable(mask_url_credentials("\n".join(lines)))
