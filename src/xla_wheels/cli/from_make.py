"""What the CLI knows when the Makefile runs it: the user's words are make variables.

The Makefile's one mapping (``MAKE_VARIABLES``: ``NAME=--flag``, or ``NAME=`` for a
variable that is not a flag) is written from the settings table
(:mod:`xla_wheels.settings_table`), which the CLI reads directly. The Makefile passes the
target (:data:`ENV_GOAL`) and the names of the variables given on make's command line
(:data:`ENV_COMMAND_LINE`; make exports their values to the recipe's environment). With
them the CLI

- refuses a command-line variable the Makefile does not read (``DRYRUN=1``,
  ``BUNDEL=x``), naming the one it probably meant: make itself would ignore it, and a
  typo of ``DRY_RUN`` would run for real;
- names the make variable, not the flag, when a value is refused, and gives the whole
  ``make`` command with a value that works as the fix.

Without those variables (the CLI run directly) nothing here applies.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from xla_host.errors import UsageError
from xla_host.values import BadValue, parse_switch
from xla_wheels.settings_rows import SETTINGS

ENV_GOAL = "XLA_WHEELS_MAKE_GOAL"
ENV_COMMAND_LINE = "XLA_WHEELS_MAKE_COMMAND_LINE"

#: Variables of make itself that a user may set on its command line.
MAKE_OWN = frozenset({"MAKEFLAGS", "MAKE", "SHELL", "MAKEOVERRIDES", "MAKEFILES", "VPATH"})


@dataclass(frozen=True)
class MakeRun:
    """The make invocation that runs this CLI."""

    goal: str
    flags: Mapping[str, str]
    """Every make variable the Makefile reads -> its CLI flag ('' when not a flag)."""
    given: Mapping[str, str]
    """The variables on make's command line -> their values."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> MakeRun | None:
        if ENV_GOAL not in environ:
            return None
        flags = {s.make: s.flag or "" for s in SETTINGS if s.make}
        given = {name: environ.get(name, "") for name in environ.get(ENV_COMMAND_LINE, "").split()}
        return cls(goal=environ.get(ENV_GOAL, ""), flags=flags, given=given)

    def variable_of(self, option_strings: list[str]) -> str | None:
        """The make variable that carries one of ``option_strings``, if any."""
        return next((name for name, flag in self.flags.items() if flag in option_strings), None)

    def command(self, name: str | None, value: str = "", *, instead_of: str | None = None) -> str:
        """The user's make command with ``name=value`` (in the place of ``instead_of``,
        which is dropped); ``name`` None only drops ``instead_of``."""
        pairs: dict[str, str] = {}
        for given, given_value in self.given.items():
            if given not in (name, instead_of):
                pairs[given] = given_value
            elif name is not None:
                pairs.setdefault(name, value)  # in the place of the first one replaced
        if name is not None:
            pairs.setdefault(name, value)
        words = [f"{key}={shlex.quote(text)}" for key, text in pairs.items()]
        return " ".join([f"make {self.goal}".strip(), *words])

    def check_command_line(self) -> None:
        """Refuse a variable on make's command line that the Makefile does not read."""
        for name in self.given:
            if name in self.flags or name in MAKE_OWN:
                continue
            guess = closest(name, self.flags)
            if guess is None:
                raise UsageError(
                    f"make variable {name} is not read by any target of this Makefile",
                    fix=f"{self.command(None, instead_of=name)} (`make help` lists each "
                    "target's variables)",
                )
            raise UsageError(
                f"make variable {name} is not read by any target of this Makefile "
                f"(did you mean {guess}?)",
                fix=self.command(guess, self.given[name], instead_of=name),
            )

    def check_received(self, arguments: Sequence[str]) -> None:
        """Refuse a flag's variable on make's command line that the target did not pass to
        this command (``make gate ROLE=reader`` when the recipe leaves ROLE out): make
        would ignore it and the run would go on without what was asked."""
        for name, value in self.given.items():
            flag = self.flags.get(name)
            if not flag or not value or name == "DRY_RUN":  # DRY_RUN: check_dry_run's
                continue
            if any(word == flag or word.startswith(f"{flag}=") for word in arguments):
                continue
            raise UsageError(
                f"make {self.goal} does not read {name} (it would run without {flag})",
                fix=f"{self.command(None, instead_of=name)} (`make help` lists each "
                "target's variables)",
            )

    def check_dry_run(self, *, honoured: bool) -> None:
        """Refuse ``DRY_RUN`` on make's command line when the target's command did not
        take it as a dry run (``honoured``): the target would run for real."""
        text = self.given.get("DRY_RUN")
        if text is None or honoured:
            return
        fix = self.command(None, instead_of="DRY_RUN")
        try:
            on = parse_switch(text)
        except BadValue as bad:
            raise UsageError(f"DRY_RUN: {text!r} {bad.reason}", fix=fix) from None
        if on:
            raise UsageError(f"DRY_RUN: make {self.goal} has no dry run", fix=fix)


def closest(name: str, known: Collection[str], *, prefix: str = "") -> str | None:
    """The one of ``known`` (upper-case names) that ``name`` probably meant, if any."""
    # Case and underscores are the commonest slips (dry_run, DRYRUN); then spelling.
    squeezed = {k.replace("_", ""): k for k in known}
    if (exact := squeezed.get(name.upper().replace("_", ""))) is not None:
        return exact
    # Compared without a shared prefix, which would make any two names look alike.
    tails = {k.removeprefix(prefix): k for k in known}
    matches = difflib.get_close_matches(
        name.upper().removeprefix(prefix), list(tails), n=1, cutoff=0.75
    )
    return tails[matches[0]] if matches else None
