"""The kinds of value a user types, one rule each, checked where the value enters.

- Switches (``DRY_RUN``, ``KEEP_RECORDED``, ``FORCE``, ``CONTINUE``, ``REFRESH``,
  ``NO_DEPS`` and their ``XLA_WHEELS_*`` variables): :data:`SWITCH_TRUE` means on,
  :data:`SWITCH_FALSE` (and the empty string) means off, in any case; anything else is
  refused (exit 2) before anything runs. A switch that is not understood must never mean
  "do it for real", nor silently "don't".
- Names that become paths or command arguments (bundles, lanes): :data:`NAME_PATTERN`.
- Values that reach a command line as arguments (git remotes and mirrors, index URLs):
  :func:`check_remote`, :func:`check_url`. None may start with ``-`` (a program would read
  it as an option: ``--upload-pack=<command>`` runs a command), and each is also passed
  after ``--`` where the program takes one (``gitutil.compose``'s ``operands``).
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
from pathlib import Path
from urllib.parse import urlsplit

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


#: The URL schemes a git remote or mirror may use. Not ``ext::`` or any other
#: ``<transport>::<address>`` form: those run programs.
REMOTE_SCHEMES: tuple[str, ...] = ("https", "http", "ssh", "git", "file")
REMOTE_RULE = (
    "a URL (" + ", ".join(f"{scheme}://" for scheme in REMOTE_SCHEMES) + "), an scp-like "
    "host:path (git@github.com:pytorch/xla.git) or a local path, never starting with '-'"
)
_SCP_HOST = re.compile(r"(?:[A-Za-z0-9._~+-]+@)?(?:[A-Za-z0-9][A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _not_an_option(text: str, example: str) -> None:
    if not text.strip():
        raise BadValue("is empty", example)
    if text.startswith("-"):
        raise BadValue(
            "starts with '-', so the program it is passed to would read it as an option", example
        )
    if _CONTROL.search(text):
        raise BadValue("contains a control character (a newline, a tab, an escape...)", example)


def check_remote(text: str) -> str:
    """``text`` when it is a git remote (:data:`REMOTE_RULE`), else :class:`BadValue`."""
    example = "https://github.com/pytorch/xla.git"
    _not_an_option(text, example)
    head = text.split("/", 1)[0]
    if "::" in head and not head.startswith("["):
        raise BadValue(
            "is a '<transport>::<address>' remote, which makes git run a program "
            f"(a remote is {REMOTE_RULE})",
            example,
        )
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme.lower() not in REMOTE_SCHEMES:
            raise BadValue(
                f"uses the scheme '{parts.scheme}:' (a remote is {REMOTE_RULE})", example
            )
        if parts.scheme.lower() != "file" and not parts.hostname:
            raise BadValue("names no host", example)
        if (parts.hostname or "").startswith("-"):
            raise BadValue("names a host starting with '-'", example)
        return text
    if ":" in head:  # scp-like [user@]host:path, as git reads it (a ':' before any '/')
        host = head.split(":", 1)[0]
        if not _SCP_HOST.fullmatch(host):
            raise BadValue(f"is not an scp-like host:path (a remote is {REMOTE_RULE})", example)
    return text


def check_url(text: str, schemes: tuple[str, ...], example: str) -> str:
    """``text`` when it is an absolute URL of one of ``schemes``, else :class:`BadValue`."""
    _not_an_option(text, example)
    parts = urlsplit(text)
    if parts.scheme.lower() not in schemes:
        wanted = " or ".join(f"{scheme}://" for scheme in schemes)
        raise BadValue(f"is not a {wanted} URL", example)
    if parts.scheme.lower() != "file" and not parts.hostname:
        raise BadValue("names no host", example)
    return text


def check_output_dir(text: str) -> Path:
    """A directory the pipeline writes into, when it is not inside a ``.git`` directory
    (git's own data: files written there can break the repository), else :class:`BadValue`."""
    _not_an_option(text, "out")
    path = Path(text).expanduser()
    if ".git" in path.parts or ".git" in path.resolve().parts:
        raise BadValue(
            "is inside a .git directory, git's own data, where written files can break "
            "the repository",
            "out",
        )
    return path
