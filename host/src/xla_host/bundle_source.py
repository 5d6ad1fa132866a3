"""Where a host command's bundle comes from: the protocol the host commands are written over.

The host commands (:mod:`xla_host.host_commands`: ``gate``, ``doctor``, ``launch-env``)
are written once, over this protocol.

Two sources implement :class:`BundleSource`: a lane's bundle document on a training host
(:class:`xla_host.lane_source.LaneSource`), and the project's checkout on a builder
(``xla_wheels.cli.checkout_source``), which adds the checks only the checkout can make
(wheels.lock, the SBOM, the ABI of the installed pair, the provenance, lanes.lock, the
signed attestations) through :meth:`BundleSource.check_installed` and
:meth:`BundleSource.check_lane`. Everything else a command does (the launch files, the
role, the environment checks, the stamp, the receipt) is the same code on both.

A command line reaches its source through a :class:`CommandLine`: the flags that name
the bundle on it, its default interpreter, and how its fixes spell a flag (``--python X``
on ``xla-host``, ``PYTHON=X`` through make on the builder).

Standard library only, like the whole host package; the protocol holds no behaviour.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from xla_host.host_doctor import Report
    from xla_host.host_probe import HostFacts
    from xla_host.installed import EnvironmentMatch, InstalledFacts
    from xla_host.launch_profile import LaunchProfile
    from xla_host.net import NetworkPolicy
    from xla_host.settings import Table
    from xla_host.stamp import StampedWheel

#: The file name of the pre-import helper ``launch-env`` writes beside ``env.json``
#: (:mod:`xla_host.xla_launch_profile`, the one copy).
HELPER_NAME = "xla_launch_profile.py"


@dataclass(frozen=True)
class Stamped:
    """What a source knows of the audit stamp's fields that are its own."""

    lane: str | None
    wheels: tuple[StampedWheel, ...]
    receipt_digest: str | None


class BundleSource(Protocol):
    """One bundle, as a command line knows it (module doc)."""

    @property
    def bundle(self) -> str:
        """The bundle's name."""
        ...

    @property
    def profiles(self) -> Mapping[str, LaunchProfile]:
        """Its launch profiles, by name."""
        ...

    @property
    def out_dir(self) -> Path:
        """The work directory ``launch-env`` writes under by default
        (``<out-dir>/launch/<bundle>/<profile>-<role>``)."""
        ...

    @property
    def document_sha256(self) -> str | None:
        """The digest of the bundle document the commands judged against (None: none, the
        checkout's manifests and lock)."""
        ...

    def build_directory(self) -> str:
        """``{build}`` of a profile's cache path: the cache contract's directory name of the
        torch_xla wheel this bundle installs (a :class:`UsageError` when none is known)."""
        ...

    def launch_helper(self) -> bytes:
        """The pre-import helper to copy beside the launch files, read before anything is
        written."""
        ...

    def doctor_report(self, python: str) -> Report:
        """An empty report of doctor's findings, titled for this source."""
        ...

    def probe_packages(self) -> Sequence[str]:
        """Projects to read the versions of, besides doctor's own
        (:data:`xla_host.host_doctor.PACKAGES`)."""
        ...

    def check_installed(self, report: Report, facts: HostFacts, python: Path) -> None:
        """The installed packages against the bundle (versions, files; the checkout adds
        provenance, SBOM and ABI)."""
        ...

    def check_lane(self, report: Report) -> None:
        """What only this source can say after the common checks (the checkout: the lane of
        lanes.lock, the signed attestations); nothing on a host."""
        ...

    def stamped(self, python: Path) -> Stamped:
        """The audit stamp's lane, wheels and receipt, as this source knows them."""
        ...

    def receipt_evidence(self, python: Path) -> tuple[InstalledFacts, EnvironmentMatch | None]:
        """The judged environment compared with the bundle's wheels, for the gate's receipt."""
        ...

    def receipts_root(self, out: Path) -> Path:
        """The directory under which a gate receipt of this bundle is sealed
        (``receipts/<bundle>/``)."""
        ...


class CommandLine(Protocol):
    """How one command line (``xla-host``, ``xla-wheels``) names a bundle and spells its
    flags (module doc)."""

    @property
    def table(self) -> Table:
        """The settings table whose rows give the shared flags (the host's, or the whole)."""
        ...

    @property
    def bundle_flags(self) -> str:
        """What names the bundle, for a message (``--lane and --bundle``)."""
        ...

    def add_source_arguments(self, parser: argparse.ArgumentParser, command: str) -> None:
        """The flags that name the bundle on this command line."""
        ...

    def source(self, args: argparse.Namespace, command: str) -> BundleSource | None:
        """The bundle the flags name (None: none named; only the gate runs without one)."""
        ...

    def python(self, args: argparse.Namespace, command: str) -> Path | Callable[[], Path]:
        """The interpreter ``command`` judges: ``--python``, else this command line's
        default (a callable: found only when the run needs it)."""
        ...

    def network(self, args: argparse.Namespace) -> NetworkPolicy:
        """The network settings every step that talks to another host uses."""
        ...

    def spell(self, flag: str, value: str) -> str:
        """``flag`` given ``value``, as a fix on this command line writes it."""
        ...

    def invocation(self, command: str, *flags: tuple[str, str]) -> str:
        """A command line a fix names: ``command`` with ``flags`` (flag, value)."""
        ...

    def again(self, command: str, bundle: str) -> str:
        """The fix after a check failed: run the same again."""
        ...
