"""PEP 751 ``pylock.toml``: the same closure as a lane's requirements.txt, as a lock file.

Every file is named with the URL its index serves it at and its sha256
(https://peps.python.org/pep-0751/): our wheels from the lane's index, the public runtime
wheels from the public index. Installed with ``pip install -r pylock.toml`` (pip >= 26.1;
pip calls the support experimental) or ``uv pip install -r pylock.toml``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xla_host.net import NetworkPolicy
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.publish.errors import PublishError
from xla_wheels.publish.index import Credentials, IndexFile, project_files

if TYPE_CHECKING:
    from packaging.pylock import Pylock

PYLOCK_NAME = "pylock.toml"


@dataclass(frozen=True)
class LockedFile:
    """One wheel of the closure: its project, version, file name and sha256."""

    project: str
    version: str
    name: str
    sha256: str
    index: str
    """The simple/ URL that serves it."""


def locate(
    files: Sequence[LockedFile], credentials: Credentials, *, network: NetworkPolicy
) -> dict[str, IndexFile]:
    """The index entry of every file, checked against the hash we pin."""
    pages: dict[tuple[str, str], dict[str, IndexFile]] = {}
    found: dict[str, IndexFile] = {}
    for file in files:
        key = (file.index, parse_wheel_name(file.name).normalized)
        if key not in pages:
            pages[key] = project_files(file.index, key[1], credentials, network=network)
        entry = pages[key].get(file.name)
        if entry is None:
            raise PublishError(
                f"{file.index} does not list {file.name}",
                fix="publish or promote the bundle to the lane first",
            )
        if entry.sha256 and entry.sha256 != file.sha256:
            raise PublishError(
                f"{file.index} lists {file.name} with sha256 {entry.sha256}, the lock has "
                f"{file.sha256}",
                fix="investigate the index: it serves another file under the locked name",
            )
        found[file.name] = entry
    return found


def render_pylock(
    files: Sequence[LockedFile], urls: dict[str, IndexFile], python: str, comment: str
) -> str:
    """``comment`` and the lock as TOML, built with :mod:`packaging.pylock`, which checks
    it against PEP 751: what it refuses (a wheel whose file name says another project or
    version than its package, an invalid file name) is a :class:`PublishError`."""
    from packaging.pylock import PylockValidationError

    try:
        lock = _pylock(files, urls, python)
        lock.validate()
    except PylockValidationError as error:
        raise PublishError(
            f"{PYLOCK_NAME} would not be a valid PEP 751 lock: {error}",
            fix="re-record the bundle's wheels (`make wheels`, `make requirements`): the "
            "lock's records disagree with the wheel file names",
        ) from None
    import tomli_w  # lazy: reading needs only tomllib, the gate's receipt too

    return comment + tomli_w.dumps(dict(lock.to_dict()))


def _pylock(files: Sequence[LockedFile], urls: dict[str, IndexFile], python: str) -> Pylock:
    # packaging.pylock is imported here: 20-40 ms of the start of every release command
    # (python -X importtime), and only writing a lock needs it.
    from packaging.pylock import Package, PackageWheel, Pylock
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    wheels: dict[tuple[str, str, str], list[PackageWheel]] = {}
    for file in sorted(files, key=lambda f: (f.project, f.name)):
        wheels.setdefault((file.project, file.version, file.index), []).append(
            PackageWheel(
                name=file.name,
                # The link's #sha256= fragment is the index's; PEP 751 carries hashes apart.
                url=urllib.parse.urldefrag(urls[file.name].url).url,
                hashes={"sha256": file.sha256},
            )
        )
    return Pylock(
        lock_version=Version("1.0"),
        created_by="xla-wheels",
        requires_python=SpecifierSet(f"=={python}.*"),
        packages=[
            Package(
                name=canonicalize_name(project),
                version=Version(version),
                index=index,
                wheels=package_wheels,
            )
            for (project, version, index), package_wheels in wheels.items()
        ],
    )
