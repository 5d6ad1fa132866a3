"""The audit stamp: one JSON document per job, written when the job starts.

A stamp says what a training job ran with: the host, the bundle and lane, every wheel of
ours by file name and sha256 (and whether the environment runs its files, when they were
at hand to compare), the receipt that let the bundle into the lane (its digest), the
launch profile (name and digest), the persistent cache directory and the host's role,
and the check's verdict. Hosts write it (the runtime image's entrypoint,
``xla_host.entrypoint``; the builder's ``doctor --json --stamp FILE``), so its format is
owned here, on the host side; the builder side reads a directory of them to answer
"which jobs ran this wheel" (``make jobs``).

Written by rename (:func:`xla_host.filemode.write_by_rename`): a job killed while it
writes leaves no half stamp. Read back strictly: a stamp of another version, or one
missing a field, is refused naming the file and the field.
"""

from __future__ import annotations

import datetime
import errno
import json
import shlex
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xla_host import filemode
from xla_host.errors import DiskError, ExitCode, PipelineError, UsageError
from xla_host.redact import mask_flag_string
from xla_host.tables import Field, Table, loads_json, read_utf8

STAMP_VERSION = "1"
#: The variable naming the file the entrypoint writes its stamp to (besides the job log).
STAMP_FILE_VARIABLE = "XLA_WHEELS_STAMP"


class StampError(PipelineError):
    """A stamp file cannot be read as a stamp: bad input (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class StampedWheel:
    name: str
    sha256: str
    matched: bool | None
    """True: the environment runs this wheel's files byte for byte; False: it does not;
    None: not compared (the wheel file was not at hand)."""


@dataclass(frozen=True)
class Stamp:
    created: str
    host: str
    bundle: str
    lane: str | None
    wheels: tuple[StampedWheel, ...]
    receipt_digest: str | None
    profile: str | None
    profile_sha256: str | None
    cache_path: str | None
    role: str | None
    verdict: str
    """The entrypoint's: ``ok``, ``warned`` (a mismatch, started anyway: the switch said
    warn) or ``refused`` (not started); doctor's: ``ok`` or ``failed``."""
    problems: tuple[str, ...] = ()
    job: Mapping[str, str] = field(default_factory=dict)
    """What names the job where it runs (the command, and e.g. a Kubernetes pod name)."""
    cache_pack: str | None = None
    """The cache pack the entrypoint installed before the job (its sha256, bundle,
    workload, topology and lane), else None."""

    def as_json(self) -> dict[str, Any]:
        """The document, as JSON holds it (lists, not tuples), keys spelt with dashes; the
        job's facts (its command line) and the problems masked as every record is
        (:func:`xla_host.redact.mask_flag_string`: a ``--token=...`` never reaches a stamp)."""
        data = json.loads(json.dumps(asdict(self)))
        data["job"] = {name: mask_flag_string(value) for name, value in data["job"].items()}
        data["problems"] = [mask_flag_string(problem) for problem in data["problems"]]
        return {"stamp-version": STAMP_VERSION, **{k.replace("_", "-"): v for k, v in data.items()}}

    def render(self) -> str:
        return json.dumps(self.as_json(), indent=2, sort_keys=True) + "\n"

    def ran(self, wheel: str) -> bool:
        """Whether this job ran ``wheel``: a file name, or a sha256 (``sha256:`` optional)."""
        wanted = wheel.removeprefix("sha256:").lower()
        return any(w.name == wheel or w.sha256 == wanted for w in self.wheels)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def this_host() -> str:
    return socket.gethostname()


#: Variables that name the job where it runs, copied into the stamp when they are set.
JOB_VARIABLES = ("HOSTNAME", "JOB_NAME", "POD_NAME", "TPU_WORKER_ID", "MEGASCALE_SLICE_ID")


def job_facts(env: Mapping[str, str], command: Sequence[str] = ()) -> dict[str, str]:
    facts = {k: env[k] for k in JOB_VARIABLES if env.get(k)}
    if command:
        facts["command"] = shlex.join(command)
    return facts


def write_stamp(path: Path, stamp: Stamp) -> Path:
    """Write ``stamp`` to ``path`` by rename (a killed job leaves the old file or none).

    A stamp that cannot be written is an error, not a warning: a job without its audit
    record is what the stamp exists to prevent (a full or read-only disk, no permission:
    exit 10, as ``DiskError`` says)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        filemode.write_by_rename(path, stamp.render())
    except filemode.NotARegularFile as error:
        # The entrypoint has no CLI edge of its own: bad input, said here (exit 2).
        raise UsageError(
            error.message,
            fix=f"{error.fix} (doctor: --stamp; image: {STAMP_FILE_VARIABLE}=)",
        ) from None
    except OSError as error:
        message = f"cannot write the stamp {path}: {error.strerror or error}"
        fix = (
            f"write it to a writable directory (doctor: --stamp; image: {STAMP_FILE_VARIABLE}=, "
            "a volume mounted there)"
        )
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise DiskError(message, fix=fix) from None
        raise StampError(message, fix=fix) from None
    return path


def _error(message: str, fix: str | None = None) -> StampError:
    return StampError(message, fix=fix)


_FIX = (
    "a stamp is written by the runtime image's entrypoint or `doctor --stamp FILE`; move "
    "the file that is not one out of the stamps directory"
)


def parse_stamp(data: Any, source: str) -> Stamp:
    if not isinstance(data, dict):
        raise _error(f"{source}: not a stamp (a JSON object is expected)", _FIX)
    if data.get("stamp-version") != STAMP_VERSION:
        raise _error(
            f"{source}: stamp-version {data.get('stamp-version')!r} is not {STAMP_VERSION!r}",
            _FIX,
        )
    table = Table(data, source=source, error=_error, fix=_FIX)
    values = table.read(
        Field("created", str, required=True),
        Field("host", str, required=True),
        Field("bundle", str, required=True),
        Field("lane", (str, type(None))),
        Field("wheels", list, required=True),
        Field("receipt-digest", (str, type(None))),
        Field("profile", (str, type(None))),
        Field("profile-sha256", (str, type(None))),
        Field("cache-path", (str, type(None))),
        Field("role", (str, type(None))),
        Field("verdict", str, required=True),
        Field("problems", list, default=[], items=str),
        Field("job", dict, default={}),
        Field("cache-pack", (str, type(None))),
        ignored=("stamp-version",),
    )
    wheels = []
    for row in table.rows("wheels") or []:
        wheel = row.read(
            Field("name", str, required=True),
            Field("sha256", str, required=True),
            Field("matched", (bool, type(None))),
        )
        wheels.append(StampedWheel(wheel["name"], wheel["sha256"], wheel["matched"]))
    return Stamp(
        created=values["created"],
        host=values["host"],
        bundle=values["bundle"],
        lane=values["lane"],
        wheels=tuple(wheels),
        receipt_digest=values["receipt-digest"],
        profile=values["profile"],
        profile_sha256=values["profile-sha256"],
        cache_path=values["cache-path"],
        role=values["role"],
        verdict=values["verdict"],
        problems=tuple(values["problems"]),
        job={str(k): str(v) for k, v in values["job"].items()},
        cache_pack=values["cache-pack"],
    )


def read_stamp(path: Path) -> Stamp:
    text, _ = read_utf8(path, _error, what="stamp")
    try:
        data = loads_json(text, source=str(path), error=_error, fix=_FIX)
    except ValueError as problem:
        raise _error(f"{path}: not JSON ({problem})", _FIX) from None
    return parse_stamp(data, str(path))


def read_stamps(directory: Path) -> list[tuple[Path, Stamp]]:
    """Every ``*.json`` stamp under ``directory`` (recursively), oldest first."""
    if not directory.is_dir():
        raise _error(
            f"{directory} is not a directory of stamps",
            "pass STAMPS=<the directory the jobs' stamp files are collected in>",
        )
    found = [(p, read_stamp(p)) for p in sorted(directory.rglob("*.json")) if p.is_file()]
    return sorted(found, key=lambda item: (item[1].created, str(item[0])))


def jobs_that_ran(stamps: Iterable[tuple[Path, Stamp]], wheel: str) -> list[tuple[Path, Stamp]]:
    return [(path, stamp) for path, stamp in stamps if stamp.ran(wheel)]


def stamp_file(env: Mapping[str, str]) -> Path | None:
    value = env.get(STAMP_FILE_VARIABLE)
    return Path(value) if value else None
