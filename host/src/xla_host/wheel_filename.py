"""The one reader of wheel file names (``name-version[-build]-python-abi-platform.whl``).

Validation is ``packaging.utils.parse_wheel_filename`` wherever ``packaging`` is
importable (the pipeline's host environment). The builder image and the gate's receipt
step run with the standard library only, so there a small parser that follows the same
specification (the binary distribution format, PEP 427/491: project name, PEP 440
version, optional build tag starting with a digit, compressed tag set) decides instead;
``tests/test_wheel_filename.py`` runs one table of names through both and requires the
same answers. Either way the parts are returned as written in the file name, because the
callers pin, compare and re-assemble names exactly as the files carry them.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

from xla_host.errors import PipelineError

#: False in the builder image and the gate's bare interpreter. Looked up, not imported:
#: packaging.utils imports packaging.tags (sysconfig, platform probes), 10-30 ms of every
#: command's start (python -X importtime); only a name that is parsed needs it.
HAVE_PACKAGING = importlib.util.find_spec("packaging") is not None

_NORMALIZE = re.compile(r"[-_.]+")
_PROJECT = re.compile(r"[\w._]+", re.UNICODE)
_BUILD = re.compile(r"\d+.*")
# PEP 440, appendix B (the canonical public version regex), matched whole.
_VERSION = re.compile(
    r"""\s*v?(?:(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*
    (?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?
    (?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?
    (?:[-_.]?dev[-_.]?[0-9]*)?)
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*""",
    re.VERBOSE | re.IGNORECASE,
)


class WheelFilenameError(PipelineError, ValueError):
    """A file name that is not a wheel's; a ValueError too, for the standard-library callers."""


def normalize(name: str) -> str:
    """PEP 503 name normalization: runs of ``-_.`` become ``-``, lowercase."""
    return _NORMALIZE.sub("-", name).lower()


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel file name, each as written in it."""

    filename: str
    project: str
    """As written (``torch_xla``); use :attr:`normalized` to compare."""
    version: str
    build: str | None
    """The build tag (``1``), None without one."""
    python: str
    abi: str
    platform: str

    @property
    def normalized(self) -> str:
        return normalize(self.project)

    def with_build(self, build: str) -> str:
        """This file name with build tag ``build`` (any former one replaced)."""
        parts = [self.project, self.version, build, self.python, self.abi, self.platform]
        return "-".join(parts) + ".whl"


def _valid_by_standard_library(stem: str, dashes: int) -> bool:
    parts = stem.split("-", dashes - 2)
    if "__" in parts[0] or not _PROJECT.fullmatch(parts[0]) or not _VERSION.fullmatch(parts[1]):
        return False
    if dashes == 5 and not _BUILD.match(parts[2]):
        return False
    components = [component.split(".") for component in parts[-1].split("-")]
    return all("" not in c for c in components) and all(p.isidentifier() for p in components[0])


def _valid_by_packaging(filename: str) -> bool:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return True


def parse_wheel_name(filename: str, *, with_packaging: bool = HAVE_PACKAGING) -> WheelName:
    """The parts of ``filename``; :class:`WheelFilenameError` when it is not a wheel's.

    ``with_packaging`` False forces the standard-library check (tests compare the two).
    """
    if not filename.endswith(".whl"):
        raise WheelFilenameError(
            f"{filename} is not a wheel file name", fix="publish only .whl files"
        )
    stem = filename[: -len(".whl")]
    dashes = stem.count("-")
    valid = dashes in (4, 5) and (
        _valid_by_packaging(filename)
        if with_packaging
        else _valid_by_standard_library(stem, dashes)
    )
    if not valid:
        raise WheelFilenameError(
            f"{filename} is not a valid wheel file name (PEP 427: "
            "name-version[-build]-python-abi-platform.whl)",
            fix="rebuild the wheel; do not rename wheel files by hand",
        )
    parts = stem.split("-")
    build = parts.pop(2) if dashes == 5 else None
    project, version, python, abi, platform = parts
    return WheelName(filename, project, version, build, python, abi, platform)
