"""The workload the gate times: a built-in preset, or the user's own model.

``--workload`` (``gate``, ``bench-restart``) takes one of:

==============================  ===================================================
``small``, ``medium``, ``large``  a built-in preset (``gate/presets.py``, written
                                against the protocol below like any user's file)
``path/to/file.py[:factory]``   a file, loaded by path; its directory goes first on
                                ``sys.path`` so it can import its neighbours
                                (default factory: ``workload``)
``package.module:factory``      a module importable in the environment under test
==============================  ===================================================

The protocol. Every training child (``child_workload.py --mode train``, a fresh process
of the environment under test) imports torch and torch_xla, enters SPMD when the check
asks for it, then calls the factory once, with those of these keyword arguments its
signature names (all of them for ``**kwargs``):

* ``device``: ``torch_xla.device()``; put the model and the inputs there;
* ``mesh``: under SPMD a ``torch_xla.distributed.spmd.Mesh`` over every device of the
  process, shape ``(devices, 1)``, axes ``("data", "model")``; ``None`` on a single
  device. The factory shards (``xs.mark_sharding``) what it wants sharded.

The factory returns a ``dict``, or any object (a dataclass) with the same attributes:

* ``model`` (required): the ``torch.nn.Module`` trained, its parameters on ``device``;
* ``inputs`` (required): a tuple of tensors (or one tensor) passed to ``step`` at every
  step, or a callable ``inputs(index)`` returning step ``index``'s tuple; their shapes
  must be the same at every step;
* ``step`` (required): ``step(*inputs)`` runs one training step (forward, backward,
  optimizer step) and returns the loss tensor; the child calls ``torch_xla.sync()``
  after it and reads the loss back, so the losses of a cold and a warm process are
  compared bit for bit;
* ``steps`` (required): an ``int >= 1``, the steps each process runs (the SPMD restart
  check runs at least 8);
* ``params`` (optional): a dict of JSON values describing the workload, recorded in the
  receipt with its name and source digest;
* ``warmup_steps`` (optional, default 2): an ``int >= 1``, the steps after which no step
  brings a new graph (the steady state). The first step always compiles; an optimizer
  that creates its state on the first step (Adam, AdamW) makes the second one another
  graph; a schedule that switches on later needs more. Given, ``steps`` must exceed it.
  Time-to-ready ends with the last step that brought a graph, so it covers every graph
  the warm-up compiles (or, warm, loads).

A workload that cannot be judged is exit 2 (``GateEnvironmentError``), not a failed
check: the factory or module is not found, the factory raises, it returns something
else than the above, or the shapes change between steps (an input's or the loss's shape
differs from the first step's, or a step after ``warmup_steps`` brings a new graph:
torch_xla's ``UncachedCompile`` or ``PersistentCacheHit`` counter moves in it; a disk
hit counts as ``CachedCompile`` like an in-memory one, so the first alone misses a warm
run's graphs), or ``warmup_steps`` is not an int >= 1 or not below ``steps``. The probe
child calls the factory once before any check runs; a shape change shows in the first
training run. The error names the problem and the child's log, which holds the traceback.

What identifies a workload (receipts, baselines, promotion): its name (the preset's, the
file's base name with its factory, or ``module:factory``), the sha256 of the source file
that holds the factory (the child computes it; what that file imports is not covered) and
its ``params``. Receipts of different workloads, by name or by digest, are never judged
against each other (``receipts.workload_difference``).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host import filemode
from xla_host.errors import UsageError
from xla_host.gate import presets
from xla_host.gate.errors import GateEnvironmentError
from xla_host.settings import default_of
from xla_host.values import BadValue

#: The built-in presets, by name.
PRESETS = tuple(presets.PRESETS)
#: The factory of a file given without ``:factory``.
DEFAULT_FACTORY = "workload"
PRESETS_FILE = Path(presets.__file__)

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*")
_FORMS = f"a preset ({', '.join(PRESETS)}), path/to/file.py[:factory] or package.module:factory"


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload as the parent knows it: a name, and what the child loads."""

    name: str
    """How reports, receipts and baselines name it."""
    reference: str
    """What the child loads: ``<absolute file>:<factory>`` or ``<module>:<factory>``."""
    is_file: bool = True

    @property
    def preset(self) -> bool:
        return self.name in PRESETS and self.reference == f"{PRESETS_FILE}:{self.name}"

    def child_args(self) -> list[str]:
        """The training child's arguments naming this workload."""
        kind = "--workload-file" if self.is_file else "--workload-module"
        return [kind, self.reference, "--workload-name", self.name]

    def __str__(self) -> str:
        return self.name


def preset(name: str) -> WorkloadSpec:
    """A built-in preset (``small``, ``medium``, ``large``)."""
    if name not in PRESETS:
        raise UsageError(f"no workload preset {name!r}", fix=f"use one of {', '.join(PRESETS)}")
    return WorkloadSpec(name, f"{PRESETS_FILE}:{name}")


#: The preset of the --workload row of the settings table.
DEFAULT = preset(str(default_of("--workload")))


def _what_is_at(path: Path) -> str:
    """Why ``path`` (no regular file) is no workload file, from ``stat``: what is there."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if os.path.lexists(path):
            return f"{path} is a symbolic link to nothing"
        return f"there is no file {path}"
    except OSError as error:
        return f"{path} cannot be read ({error.strerror})"
    if stat.S_ISDIR(mode):
        return f"{path} is a directory, not a Python file"
    if stat.S_ISFIFO(mode):
        return f"{path} is a FIFO, not a Python file"
    return f"{path} is not a regular file (a device or a socket), not a Python file"


def resolve(text: str, *, cwd: Path | None = None) -> WorkloadSpec:
    """``--workload``'s value as a :class:`WorkloadSpec`; bad input is :class:`BadValue`
    (the CLI's argparse type refuses it before anything runs, naming the setting).

    A file must exist here (the parent checks it; the child loads it); a module is looked
    up by the child in the environment under test, whose ``sys.path`` the parent does not
    share.
    """
    text = text.strip()
    if text in PRESETS:
        return preset(text)
    where, _, factory = text.rpartition(":") if ":" in text else (text, "", "")
    if where.endswith(".py") or "/" in where:
        factory = factory or DEFAULT_FACTORY
        if not re.fullmatch(_IDENTIFIER, factory):
            raise BadValue(f"names no factory: {factory!r} is not a Python identifier", "small")
        path = ((cwd or Path.cwd()) / where).absolute()
        if not path.is_file():
            raise BadValue(f"is not a workload: {_what_is_at(path)}", "small")
        return WorkloadSpec(f"{path.name}:{factory}", f"{path}:{factory}")
    if not factory or not _MODULE.fullmatch(where) or not re.fullmatch(_IDENTIFIER, factory):
        raise BadValue(f"is not a workload: give {_FORMS}", "small")
    return WorkloadSpec(text, text, is_file=False)


@dataclass(frozen=True)
class WorkloadName:
    """A workload as receipts, packs, lanes and policies name it, from any spelling of it."""

    name: str
    """``small``, ``decoder.py:build`` (a file: its base name and factory, wherever it is),
    ``package.module:factory``."""
    sha256: str | None
    """The source file's digest, where this spelling names a file that is here; None for a
    preset (the gate that ran it may carry another version of the presets file), a
    module, or a file that is not here."""


def name_of(text: str, *, cwd: Path | None = None) -> WorkloadName:
    """The one identity of ``--workload``'s value (``gate``, ``cache record``, ``cache
    fetch --workload``, ``make cache-pack WORKLOAD=``, a policy's ``workload`` and
    ``require-packs``): ``/path/decoder.py:build``, ``decoder.py:build`` and
    ``./decoder.py:build`` are one workload. Unlike :func:`resolve` the file need not be
    here (a host fetching a pack names the workload its training job runs); bad input is
    :class:`BadValue`."""
    text = text.strip()
    if text in PRESETS:
        return WorkloadName(text, None)
    where, _, factory = text.rpartition(":") if ":" in text else (text, "", "")
    if where.endswith(".py") or "/" in where:
        factory = factory or DEFAULT_FACTORY
        if not re.fullmatch(_IDENTIFIER, factory):
            raise BadValue(f"names no factory: {factory!r} is not a Python identifier", "small")
        path = (cwd or Path.cwd()) / where
        return WorkloadName(f"{path.name}:{factory}", _sha256(path) if path.is_file() else None)
    if not factory or not _MODULE.fullmatch(where) or not re.fullmatch(_IDENTIFIER, factory):
        raise BadValue(f"is not a workload: give {_FORMS}", "small")
    return WorkloadName(text, None)


def named(text: str, flag: str = "--workload") -> WorkloadName:
    """:func:`name_of` of a flag's value, bad input refused as the CLI's usage error."""
    try:
        return name_of(text)
    except BadValue as bad:
        fix = f"pass {flag} {bad.example}"
        raise UsageError(f"{flag} {text!r} {bad.reason}", fix=fix) from None


def _sha256(path: Path) -> str | None:
    """The file's digest; None when it is not a regular file (never opened: a FIFO)."""
    try:
        return filemode.file_sha256(path)
    except (OSError, filemode.NotARegularFile):
        return None


def same_workload(wanted: WorkloadName, name: str, sha256: str | None) -> str | None:
    """Why a record's workload (``name``, source ``sha256``) is not ``wanted``; None when
    it is (a digest is compared only where both are known)."""
    if name != wanted.name:
        return f"workload {name}, not {wanted.name}"
    if wanted.sha256 and sha256 and wanted.sha256 != sha256:
        return (
            f"workload {name} from source sha256 {sha256[:12]}…, not {wanted.sha256[:12]}… (the "
            "file changed since)"
        )
    return None


def unjudgeable(name: str, problem: str, log: Path | str) -> GateEnvironmentError:
    """The error of a workload the gate cannot judge (exit 2): the problem, and where the
    child's traceback is."""
    return GateEnvironmentError(
        f"workload {name} cannot be judged: {problem} (the child's log, with any "
        f"traceback: {log})",
        fix="fix the workload so it follows the protocol of docs/gate.md "
        '"Your own workload" (factory, fixed shapes), then run the gate again',
    )


def refuse_unjudgeable(name: str, rows: list[dict[str, Any]]) -> None:
    """Raise :func:`unjudgeable` for the first run (a ``restart.summarize`` row) whose
    child found the workload unusable."""
    for row in rows:
        problem = row.get("workload_problem")
        if problem:
            raise unjudgeable(name, str(problem), row.get("log", "?"))
