"""The kinds of value a user types, one rule each, checked where the value enters.

- Switches (``DRY_RUN``, ``KEEP_RECORDED``, ``FORCE``, ``CONTINUE``, ``REFRESH``,
  ``NO_DEPS`` and their ``XLA_WHEELS_*`` variables): :data:`SWITCH_TRUE` means on,
  :data:`SWITCH_FALSE` (and the empty string) means off, in any case; anything else is
  refused (exit 2) before anything runs. A switch that is not understood must never mean
  "do it for real", nor silently "don't".
- Names that become paths or command arguments (bundles, lanes): :data:`NAME_PATTERN`.
- Numbers: finite and within a stated range, so that ``JOBS=1e9`` or a negative timeout
  is refused at once instead of failing, or hanging, later; written in ASCII digits only
  (Python's ``int``/``float`` also read ``1_0`` and ``'٨'``, which no user means as a
  number here, and other tools reading the same value would not).

Every parser raises :class:`BadValue` with what is wrong and an example of a good value;
the caller names where the value came from (make variable, flag, environment variable,
manifest key), because only it knows.
"""

from __future__ import annotations

import math
import re

SWITCH_TRUE: tuple[str, ...] = ("1", "true", "yes", "on", "y")
SWITCH_FALSE: tuple[str, ...] = ("0", "false", "no", "off", "n")
SWITCH_SPELLINGS = f"on: {'/'.join(SWITCH_TRUE)}; off: {'/'.join(SWITCH_FALSE)} or empty; any case"

#: Bundle and lane names: they become directory names (``out/<bundle>``,
#: ``dist/<bundle>``, ``receipts/<bundle>``) and command arguments. A letter or digit
#: first (no ``-`` read as an option, no hidden or ``..`` name), then letters, digits,
#: ``.``, ``_`` and ``-``; at most 64 characters.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = (
    "a letter or digit, then letters, digits, '.', '_' or '-' (at most 64 characters, "
    "no spaces or slashes)"
)


class BadValue(ValueError):
    """``reason`` says what is wrong with the value; ``example`` is a value that works."""

    def __init__(self, reason: str, example: str) -> None:
        self.reason = reason
        self.example = example
        super().__init__(reason)


def parse_switch(text: str) -> bool:
    """On or off, by the one documented set of spellings; anything else is refused."""
    spelling = text.strip().lower()
    if spelling in SWITCH_TRUE:
        return True
    if spelling in SWITCH_FALSE or spelling == "":
        return False
    raise BadValue(f"is not a switch value ({SWITCH_SPELLINGS})", "1")


def check_name(text: str) -> str:
    """``text`` when it is a valid bundle or lane name, else :class:`BadValue`."""
    if NAME_PATTERN.fullmatch(text) is None:
        raise BadValue(f"is not a valid name ({NAME_RULE})", "v6e-2.11")
    return text


#: A whole number and a decimal number as the user may write them: ASCII digits only.
WHOLE_NUMBER = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
#: Words ``float`` reads that are refused as out of range, not as misspelt numbers.
_NOT_FINITE = frozenset({"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan"})


def digits_hint(text: str) -> str:
    """Why ``text`` that Python would read as a number is not one here, if it would."""
    if "_" in text or any(c.isdigit() and not c.isascii() for c in text):
        return " (write it with the ASCII digits 0-9 only, no '_' or other scripts' digits)"
    return ""


def parse_count(text: str, *, low: int, high: int, example: int) -> int:
    """A whole number in ``[low, high]`` (jobs, rounds, runs)."""
    stripped = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", stripped):
        raise BadValue(
            f"is not a whole number from {low} to {high}{digits_hint(stripped)}", str(example)
        )
    value = int(stripped)
    if not low <= value <= high:
        raise BadValue(f"is out of range: give a whole number from {low} to {high}", str(example))
    return value


def parse_amount(text: str, *, low: float, high: float, example: float, unit: str) -> float:
    """A finite number in ``[low, high]`` (seconds, GiB, ratios, tolerances)."""
    stripped = text.strip()
    if not (_DECIMAL.fullmatch(stripped) or stripped.lower() in _NOT_FINITE):
        raise BadValue(f"is not a number of {unit}{digits_hint(stripped)}", f"{example:g}")
    value = float(stripped)
    if not math.isfinite(value) or not low <= value <= high:
        raise BadValue(
            f"is out of range: give a number of {unit} from {low:g} to {high:g}", f"{example:g}"
        )
    return value
