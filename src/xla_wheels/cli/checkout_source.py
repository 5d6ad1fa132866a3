"""``xla-wheels gate``, ``doctor`` and ``launch-env``: the host commands
(:mod:`xla_host.host_commands`, written once) over the project's checkout.

The checkout is this command line's bundle source (:mod:`xla_host.bundle_source`): the
bundle's manifest (``build/bundles/<bundle>.toml``: its launch profiles, its pins),
``wheels.lock`` (its wheels, ``{build}`` of a cache path), ``scripts/`` (the launch
helper), ``receipts/<bundle>/`` (the gate's sealed receipts). It adds only the checks
the checkout can make: the locked versions, the provenance and the SBOM against the lock,
the ABI of the installed pair (:mod:`xla_wheels.publish.doctor`), which bundle the host
runs and whether its lane of ``lanes.lock`` serves it, the signed attestations. Its fixes
name make's variables (``PYTHON=``), as ``make doctor`` passes them.

``gate`` stays standard library only (the builder image runs it as the ship check,
without the pipeline's dependencies): what it does not need is imported where used.

Exit codes of ``gate``: 0 every selected check passed; 1 a check failed (the verdict says
which and why); 2 the environment cannot be judged (no torch_xla, no such device); 8 a
worker of a slice did not arrive at a phase (``xla_host.gate.slice``). Without
``--python`` the gate uses the cached stock torch_xla 2.9.0 environment (built on first
use, in the same per-machine cache as the pipeline's), so a newcomer sees the
persistent-cache defect in one command. ``launch-env``: 0 written; 1 the pack was refused
(nothing installed, nothing written); 2 an unknown bundle, profile or role (the fix names
the valid ones), a pack without its key; 8 the lane did not answer in time; 10 a disk
fault.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_host import host_commands, net
from xla_host.bundle_source import HELPER_NAME, Stamped
from xla_host.errors import UsageError
from xla_host.host_doctor import Report
from xla_host.host_probe import HostFacts
from xla_host.launch_profile import LaunchProfile
from xla_host.net import NetworkPolicy
from xla_host.settings import Table
from xla_host.tables import read_regular
from xla_wheels.options import machine_cache
from xla_wheels.settings_rows import TABLE, add_settings

if TYPE_CHECKING:  # the checkout's libraries: loaded by the command that reads them
    from xla_host.installed import EnvironmentMatch, InstalledFacts
    from xla_wheels.bundle import Bundle
    from xla_wheels.wheels_lock import Lock

#: The launch helper in a checkout: a link to the host package's one copy.
HELPER = Path("scripts") / HELPER_NAME


@dataclass
class CheckoutSource:
    """A bundle as the checkout holds it (module doc)."""

    root: Path
    name: str
    args: argparse.Namespace
    work_dir: Path
    """``--out-dir`` (``<root>/out``): where launch-env writes by default."""
    _bundle: Bundle | None = field(default=None, repr=False)
    _lock: Lock | None = field(default=None, repr=False)

    @property
    def bundle(self) -> str:
        return self.name

    @property
    def manifest(self) -> Bundle:
        if self._bundle is None:
            # Imported here: `gate --help` and a gate without a profile read no manifest.
            from xla_wheels.bundle import load_bundle

            self._bundle = load_bundle(self.root, self.name)
        return self._bundle

    @property
    def lock(self) -> Lock:
        if self._lock is None:
            from xla_wheels.wheels_lock import read_lock

            self._lock = read_lock(self.root / "wheels.lock")  # parsed once per command
        return self._lock

    @property
    def profiles(self) -> Mapping[str, LaunchProfile]:
        return self.manifest.profiles

    @property
    def out_dir(self) -> Path:
        return self.work_dir

    @property
    def document_sha256(self) -> str | None:
        return None  # judged against the manifest and wheels.lock, not a document

    def build_directory(self) -> str:
        """``{build}``: the cache contract's directory name for the torch_xla wheel
        wheels.lock records and the libtpu version hosts install."""
        from xla_host.cache_contract import directory_name
        from xla_wheels.publish.wheels import locked_versions

        entry = self.lock.bundles.get(self.name)
        version = locked_versions(entry.wheels or () if entry else ()).get("torch-xla")
        if version is None:
            raise UsageError(
                f"the cache path of this profile names the build ({{build}}), and "
                f"wheels.lock records no torch_xla wheel for {self.name}",
                fix=f"build it first (`make wheels BUNDLE={self.name}`), or launch with a "
                "profile whose cache path does not use {build}",
            )
        libtpu = self.manifest.runtime.get("libtpu")
        return directory_name(self.name, version, libtpu.install_version if libtpu else None)

    def launch_helper(self) -> bytes:
        path = self.root / HELPER
        try:
            return read_regular(path, UsageError, what="launch helper")
        except FileNotFoundError:
            raise UsageError(
                f"{path} does not exist: the project root {self.root} has no launch helper "
                "to copy beside the environment files",
                fix=f"run from a full checkout of the project (or pass --root one), or "
                f"restore it: `git checkout -- {HELPER}`",
            ) from None

    def doctor_report(self, python: str) -> Report:
        from xla_wheels.publish.doctor import DoctorReport

        return DoctorReport(self.name, python)

    def probe_packages(self) -> Sequence[str]:
        return ()

    def check_installed(self, report: Report, facts: HostFacts, python: Path) -> None:
        from xla_wheels.publish import doctor

        assert isinstance(report, doctor.DoctorReport)
        report.host = facts
        doctor.check_versions(report, self.manifest, facts, self.lock)
        doctor.check_abi(report, str(python))  # needs pyelftools: the builder's own

    def check_lane(self, report: Report) -> None:
        from xla_wheels.publish.doctor import DoctorReport
        from xla_wheels.release.host_lane import add_lane_findings

        assert isinstance(report, DoctorReport)
        add_lane_findings(report, self.root, self.lock, self.args.lane, self.name)
        self._add_signature_findings(report)

    def _search(self) -> list[Path]:
        """Where the locked wheel files may be at hand: the lane's directory, dist/<bundle>."""
        from xla_wheels.layout import BundleLayout
        from xla_wheels.release import lanes

        search = [BundleLayout.of(self._options(), self.name).dist]
        if self.args.lane:
            lane = lanes.load_config(self.root).lane(self.args.lane)
            if (directory := lane.backend.directory) is not None:
                search.insert(0, directory)
        return search

    def _options(self) -> Any:
        from xla_wheels.cli.settings import pipeline_options

        return pipeline_options(self.args, os.environ)

    def _add_signature_findings(self, report: Report) -> None:
        """With the team's public key (setting, else the lane's): each locked wheel's
        envelope."""
        from xla_wheels import attestation as attest
        from xla_wheels.cli.settings import supply_options
        from xla_wheels.release import lanes

        public_key = supply_options(self.args, os.environ).public_key
        if self.args.lane:
            lane = lanes.load_config(self.root).lane(self.args.lane)
            public_key = public_key or lane.signing_public_key
        entry = self.lock.bundles.get(self.name)
        if public_key is None or entry is None or not entry.wheels:
            return
        wheels = [(r.name, r.sha256) for r in entry.wheels]
        for check in attest.signature_checks(public_key, wheels, self._search()):
            fix = (
                ""
                if check.status == "ok"
                else "install only wheels the team signed; re-sign with `make attest "
                "BUNDLE=<bundle>`"
            )
            report.add(check.status, f"signature {check.wheel}", check.detail, fix)

    def stamped(self, python: Path) -> Stamped:
        """Each locked wheel compared by content with its file where the file is at hand
        (the lane's directory, else dist/<bundle>); the lane's receipt from lanes.lock."""
        from xla_host import installed
        from xla_host.stamp import StampedWheel
        from xla_wheels.release import lanes

        entry = self.lock.bundles.get(self.name)
        records = list(entry.wheels or ()) if entry else []
        receipt_digest = None
        if self.args.lane:
            state = lanes.read_state(self.root).get(self.args.lane)
            if state is not None and state.bundle == self.name:
                receipt_digest = state.receipt_digest
        at_hand = next((d for d in self._search() if records and all(
            (d / r.name).is_file() for r in records)), None)  # fmt: skip
        wheels: tuple[StampedWheel, ...] = ()
        if records:
            _, match = installed.match_environment(python, records, at_hand)
            wheels = tuple(
                StampedWheel(m.name, m.sha256, m.matched if at_hand is not None else None)
                for m in match.wheels
            )
        return Stamped(lane=self.args.lane, wheels=wheels, receipt_digest=receipt_digest)

    def receipt_evidence(self, python: Path) -> tuple[InstalledFacts, EnvironmentMatch | None]:
        from xla_wheels.release import gate_receipt

        return gate_receipt.evidence(_receipt_place(self.args), python)

    def receipts_root(self, out: Path) -> Path:
        return self.root


def _checkout(args: argparse.Namespace) -> Path:
    """The gate's project checkout: --root, else $XLA_WHEELS_ROOT, else the current directory."""
    from xla_wheels.cli.settings import Settings

    return (Settings(args, os.environ).path("--root") or Path(".")).resolve()


def _receipt_place(args: argparse.Namespace) -> Any:
    # Imported when a run leaves its receipt, not before: reading wheels.lock and the
    # installed wheels loads the lock and publish modules, which `gate --help` must not.
    from xla_wheels.release import gate_receipt

    return gate_receipt.ReceiptPlace(
        root=_checkout(args),
        bundle=args.bundle,
        wheel_dir=args.wheel_dir,
        out_dir=Path(args.out),
        cache_dir=machine_cache(os.environ),
    )


@dataclass(frozen=True)
class BuilderLine:
    """``xla-wheels``' :class:`xla_host.bundle_source.CommandLine`: a bundle is a manifest
    of the checkout, its flags the settings table's rows, its fixes make's variables."""

    table: Table = TABLE
    bundle_flags: str = "--bundle"

    def add_source_arguments(self, parser: argparse.ArgumentParser, command: str) -> None:
        if command == "gate":
            # No common options: the gate runs without the pipeline (the ship check).
            parser.add_argument(
                "--bundle",
                help="bundle whose locked wheels the environment should be; the receipt "
                "goes to receipts/<bundle>/ (default: none: out/.../receipt.json, unusable "
                "to promote)",
            )
            add_settings(parser, command, "--root", "--wheel-dir")
            return
        from xla_wheels.cli.arguments import add_bundle_arguments

        # Neither writes the bundle's work or products (launch-env: out/launch/<bundle>).
        add_bundle_arguments(parser, writes_bundle=False)
        if command == "doctor":
            add_settings(parser, command, "--lane", "--public-key")

    def source(self, args: argparse.Namespace, command: str) -> CheckoutSource | None:
        if command == "gate":
            if not args.bundle:
                return None
            from xla_wheels.release.gate_receipt import locked_records

            root = _checkout(args)
            # Before a run of minutes: a named bundle must be in wheels.lock.
            locked_records(root / "wheels.lock", args.bundle)
            return CheckoutSource(root, args.bundle, args, root / "out")
        from xla_wheels.bundle import load_bundle
        from xla_wheels.cli.settings import pipeline_options

        options = pipeline_options(args, os.environ)
        bundle = load_bundle(options.root, args.bundle)
        return CheckoutSource(options.root, bundle.name, args, options.out_dir, bundle)

    def python(self, args: argparse.Namespace, command: str) -> Path | Callable[[], Path]:
        if command == "doctor":
            # As given (PYTHON=python3 is looked up on PATH by the probe); by default not
            # this process's: it runs in the checkout's .venv, not a training environment.
            return Path(args.python or shutil.which("python3") or sys.executable)
        # Not resolved: a venv's python symlink must stay the venv's entry point.
        given = Path(args.python).absolute() if args.python else None
        if command == "gate":
            from xla_wheels import stock_envs

            return lambda: stock_envs.resolve_python(given, machine_cache(os.environ))
        return given or Path(sys.executable)

    def network(self, args: argparse.Namespace) -> NetworkPolicy:
        if hasattr(args, "writes_bundle"):  # the common options: read with the pipeline's
            from xla_wheels.cli.settings import pipeline_options

            return pipeline_options(args, os.environ).network
        return net.policy_from(args, os.environ)  # XLA_WHEELS_NET_*, as every network step

    def spell(self, flag: str, value: str) -> str:
        make = self.table.by_flag(flag).make
        return f"{make}={value}" if make else f"{flag} {value}"

    def invocation(self, command: str, *flags: tuple[str, str]) -> str:
        return " ".join(["make", command, *(self.spell(f, v) for f, v in flags)])

    def again(self, command: str, bundle: str) -> str:
        return f"run `make {command} BUNDLE={bundle}` (with the same PYTHON=, ROLE=, ...) again"


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define host command ``name``'s arguments on ``parser`` and set its handler."""
    host_commands.add_arguments(name, parser, BuilderLine())
