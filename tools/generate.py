"""``make generate``: every file written from the code, made current (``--check``: told).

One command for the generated files, so nobody has to remember which generator writes
which: each entry of :data:`GENERATORS` is a function of the checkout's root returning the
files it owns and their text, and this one reader writes (by rename) or compares them. The
generators are library functions (``outputs``) of the modules that own their facts: the
exit-code table (``xla_wheels.exit_codes``), the settings table and the Makefile's variable
mapping (``xla_wheels.settings_table``), each command's make variables and ``make help``'s
text (``xla_wheels.make_help``), the package layout (``xla_wheels.layout_docs``).

Exit codes: 0 current (or written), 1 a file is stale (``--check``), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from xla_wheels import exit_codes, layout_docs, make_help, settings_table

ROOT = Path(__file__).resolve().parents[1]
Generator = Callable[[Path], Mapping[Path, str]]
#: What each generator is named by in the report, in the order they run (make_help reads
#: the Makefile's included files the settings table writes, so it runs after it).
GENERATORS: dict[str, Generator] = {
    "exit codes": exit_codes.outputs,
    "settings table": settings_table.outputs,
    "make help": make_help.outputs,
    "package layout": layout_docs.outputs,
}


def _write(path: Path, text: str) -> None:
    """``text`` into ``path`` by rename: a reader sees the old file or the new one."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def stale_files(root: Path, *, write: bool) -> list[tuple[str, Path]]:
    """Each generated file that differs from what its generator says today (written
    first when ``write``), with the generator's name."""
    stale = []
    for name, generator in GENERATORS.items():
        for path, text in generator(root).items():
            if path.is_file() and path.read_text(encoding="utf-8") == text:
                continue
            stale.append((name, path))
            if write:
                _write(path, text)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = stale_files(ROOT, write=not args.check)
    for name, path in stale:
        verb = "is stale" if args.check else "written"
        print(f"{path.relative_to(ROOT)}: {verb} ({name})")
    if args.check and stale:
        print("  fix: make generate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
