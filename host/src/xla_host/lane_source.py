"""The host's bundle source, a lane's bundle document, and xla-host's command line over it.

``xla-host`` names a bundle by ``--lane`` (a directory, or the URL serving it) and
``--bundle``, the document's sha256 checked against ``--bundle-sha256`` or the lane's
index, or by ``--bundle-document FILE``; the installed files are compared with the
document's wheels, fetched from the lane by hash into the per-machine cache (or
``--wheel-dir``). :class:`HostLine` is ``xla-host``'s :class:`CommandLine`; the host
commands themselves are :mod:`xla_host.host_commands`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from xla_host import bundle_document, host_doctor, installed, lane_address, log, net, stamp
from xla_host.arguments import machine_cache, read_setting
from xla_host.bundle_source import HELPER_NAME, Stamped
from xla_host.errors import UsageError
from xla_host.host_probe import HostFacts
from xla_host.launch_profile import LaunchProfile
from xla_host.settings import HOST, Cascade, Table

#: The command line's name, in usage lines, examples and fixes.
PROG = "xla-host"


@dataclass
class LaneSource:
    """A bundle as its lane's document says it (module doc)."""

    document: bundle_document.BundleDocument
    digest: str
    lane: lane_address.LaneAddress | None
    """Where the document came from (None: a file given with ``--bundle-document``)."""
    wheel_dir: Path | None
    network: net.NetworkPolicy
    environ: Mapping[str, str]
    _match: installed.EnvironmentMatch | None = field(default=None, repr=False)

    @property
    def bundle(self) -> str:
        return self.document.bundle

    @property
    def profiles(self) -> Mapping[str, LaunchProfile]:
        return self.document.profiles

    @property
    def out_dir(self) -> Path:
        # The builder's work directory setting, read the same way: a host that sets
        # XLA_WHEELS_OUT gets its launch files there too; else out/ of this directory.
        given: Path | None = read_setting(Cascade({}, self.environ), "--out-dir")
        return given or Path("out")

    @property
    def document_sha256(self) -> str | None:
        return self.digest

    def build_directory(self) -> str:
        return self.document.build_directory()

    def launch_helper(self) -> bytes:
        # The one copy, inside the host package (the host wheel carries it).
        return resources.files("xla_host").joinpath(HELPER_NAME).read_bytes()

    def doctor_report(self, python: str) -> host_doctor.Report:
        return host_doctor.HostReport(self.bundle, python, document_sha256=self.digest)

    def probe_packages(self) -> Sequence[str]:
        return list(self.document.pins)

    def check_installed(self, report: host_doctor.Report, facts: HostFacts, python: Path) -> None:
        urls = None
        if self.lane is not None:
            # The lane's install list, judged against the document (a moved lane whose
            # list did not follow installs other wheels), and the install line that answers.
            served = bundle_document.install_list(self.lane, network=self.network)
            urls = bundle_document.install_urls(self.lane) if served is not None else None
            host_doctor.check_install_list(
                report, self.document, served, bundle_document.install_urls(self.lane)[1]
            )
        fix = host_doctor.install_fix(urls)
        host_doctor.check_versions(report, self.document, facts, fix)
        _, self._match = self._compare_files(python)
        host_doctor.check_files(report, self._match, fix)

    def check_lane(self, report: host_doctor.Report) -> None:
        """Nothing more: the lane's install list is judged with the installed files."""

    def stamped(self, python: Path) -> Stamped:
        match = self._match or self._compare_files(python)[1]
        return Stamped(
            lane=self.document.lane,
            wheels=tuple(stamp.StampedWheel(m.name, m.sha256, m.matched) for m in match.wheels),
            receipt_digest=None,  # the document names no receipt: the lane's record does
        )

    def receipt_evidence(
        self, python: Path
    ) -> tuple[installed.InstalledFacts, installed.EnvironmentMatch | None]:
        facts, match = self._compare_files(python)
        for problem in match.problems:
            log.warning(problem)
        return facts, match

    def receipts_root(self, out: Path) -> Path:
        return out

    def _compare_files(
        self, python: Path
    ) -> tuple[installed.InstalledFacts, installed.EnvironmentMatch]:
        """This environment against the document's wheels, file by file, the wheel files
        fetched from the lane by hash when not at hand."""
        cache = machine_cache(self.environ)
        wheel_dir = self.wheel_dir or cache / "lane-wheels"
        with log.section(f"compare the environment with the wheels of bundle {self.bundle}"):
            bundle_document.wheel_files(self.lane, self.document.wheels, wheel_dir,
                                        network=self.network)  # fmt: skip
            return installed.match_environment(
                python, self.document.wheels, wheel_dir, cache / "wheel-content"
            )


@dataclass(frozen=True)
class HostLine:
    """``xla-host``'s :class:`xla_host.bundle_source.CommandLine`: a bundle is a lane's
    document."""

    environ: Mapping[str, str]
    table: Table = HOST
    bundle_flags: str = "--lane and --bundle (or --bundle-document)"

    def add_source_arguments(self, parser: argparse.ArgumentParser, command: str) -> None:
        parser.add_argument(
            "--lane",
            help="the lane: its directory, or the URL serving it (its root or its simple/ index)",
        )
        parser.add_argument("--bundle", help="the bundle whose document to fetch from the lane")
        parser.add_argument(
            "--bundle-sha256",
            metavar="HEX",
            help="the document's sha256 (`make publish`, `make lanes`): required unless the "
            "lane's index lists it",
        )
        parser.add_argument(
            "--bundle-document",
            type=Path,
            metavar="FILE",
            help="a bundle document given as a file, instead of --lane/--bundle",
        )
        parser.add_argument(
            "--wheel-dir",
            type=Path,
            help="where the document's wheel files are kept to compare with the installed "
            "files; missing ones are fetched from --lane by hash (default: the per-machine "
            "cache, $XLA_WHEELS_CACHE or ~/.cache/xla-wheels)",
        )
        # The builder's rows, the same ranges and XLA_WHEELS_NET_* variables (policy_from).
        net.add_network_arguments(parser)

    def source(self, args: argparse.Namespace, command: str) -> LaneSource | None:
        """The document the flags name; None when none is named and ``command`` is the
        gate (a staging directory's ship check)."""
        if command == "gate" and not (args.lane or args.bundle or args.bundle_document):
            return None
        lane = lane_address.parse(args.lane) if args.lane else None
        network = self.network(args)
        if args.bundle_document is not None:
            document, digest = bundle_document.read_file(
                args.bundle_document, sha256=args.bundle_sha256
            )
            if args.bundle and args.bundle != document.bundle:
                raise UsageError(
                    f"{args.bundle_document} is the document of bundle {document.bundle}, "
                    f"not {args.bundle}",
                    fix="pass the document of the bundle you mean, or leave out --bundle",
                )
        elif lane is None or not args.bundle:
            return None
        else:
            document, digest = bundle_document.fetch(
                lane, args.bundle, sha256=args.bundle_sha256, network=network
            )
        return LaneSource(document, digest, lane, args.wheel_dir, network, self.environ)

    def python(self, args: argparse.Namespace, command: str) -> Path:
        # Not resolved: a venv's python symlink must stay the venv's entry point.
        return Path(args.python).absolute() if args.python else Path(sys.executable)

    def network(self, args: argparse.Namespace) -> net.NetworkPolicy:
        policy: net.NetworkPolicy = args.network  # checked before anything ran (cli._run)
        return policy

    def spell(self, flag: str, value: str) -> str:
        if flag == "--bundle":  # a bundle is named in its lane
            return f"--lane <the lane's directory or URL> --bundle {value}"
        return f"{flag} {value}"

    def invocation(self, command: str, *flags: tuple[str, str]) -> str:
        given = "".join(f" {self.spell(flag, _quoted(value))}" for flag, value in flags)
        return f"{PROG} {command}{given}"

    def again(self, command: str, bundle: str) -> str:
        return "run the same command again"


def _quoted(value: str) -> str:
    """A value a fix shows, quoted for the shell where it needs it (a placeholder stays)."""
    return value if value.startswith("<") else shlex.quote(value)
