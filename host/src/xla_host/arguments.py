"""argparse types of the values both command lines read (numbers in a range, an output
directory): a value is refused at parse time with :mod:`xla_host.values`' reason, and
``example`` is a value that works, for the fix the CLI edge prints."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from xla_host.values import BadValue, check_output_dir, parse_amount, parse_count


class ValueType:
    """An argparse ``type`` from a :mod:`xla_host.values` parser: a value is refused at
    parse time with the parser's reason; ``example`` is a value that works (for the fix)."""

    def __init__(self, parse: Callable[[str], Any], example: str, name: str) -> None:
        self.parse = parse
        self.example = example
        self.__name__ = name  # argparse names the type in some of its messages

    def __call__(self, text: str) -> Any:
        try:
            return self.parse(text)
        except BadValue as bad:
            raise argparse.ArgumentTypeError(f"{text!r} {bad.reason}") from None


def count(low: int, high: int, example: int) -> ValueType:
    """A whole number in ``[low, high]``."""
    return ValueType(
        lambda text: parse_count(text, low=low, high=high, example=example), str(example), "count"
    )


def amount(low: float, high: float, example: float, unit: str) -> ValueType:
    """A finite number of ``unit`` in ``[low, high]``."""
    return ValueType(
        lambda text: parse_amount(text, low=low, high=high, example=example, unit=unit),
        f"{example:g}",
        "amount",
    )


#: A directory the pipeline writes into (``--out``, ``--out-dir``, ``--cache-dir``).
OUTPUT_DIR = ValueType(check_output_dir, "out", "directory")


def machine_cache(environ: Mapping[str, str], variable: str = "XLA_WHEELS_CACHE") -> Path:
    """Per-machine cache (sources, environments, wheel files): survives ``git clean``.

    ``$XLA_WHEELS_CACHE`` (``variable``: the builder names it from its settings table),
    else ``$XDG_CACHE_HOME/xla-wheels``, else ``~/.cache/xla-wheels``. The builder, the
    gate and the host's commands all call this, so they share one cache.
    """
    if value := environ.get(variable):
        return Path(value).expanduser()
    if base := environ.get("XDG_CACHE_HOME"):
        return Path(base).expanduser() / "xla-wheels"
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return home / ".cache" / "xla-wheels"
