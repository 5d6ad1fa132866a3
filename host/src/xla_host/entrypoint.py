"""The runtime image's entrypoint: check the job against the baked bundle facts, stamp it,
then run the training command.

``python -m xla_host.entrypoint [--facts FILE] [--stamp FILE] -- COMMAND...``

The facts (``/opt/xla-wheels/image.json``, written by ``make runtime-image``) name the
bundle, the lane, every wheel of ours (file name and sha256, the files kept in the image),
the launch profile (name, digest, its environment) and the lane's receipt digest. Before
the command starts:

1. the environment runs exactly the locked wheels' files (``installed.match_environment``:
   content hashed on both sides; the wheel files are kept in the image for this);
2. the launch environment is the profile's (``launch_profile.compare_environment``): a
   variable missing, different, or one a profile may set that it does not. The role, by
   the one rule (:mod:`xla_host.cache_role`: ``XLA_WHEELS_ROLE``, else reader where
   ``XLA_PERSISTENT_CACHE_READ_ONLY=1``, else ``TPU_WORKER_ID``: worker 0 writes the
   cache, the others read it; else writer), decides ``XLA_PERSISTENT_CACHE_READ_ONLY``
   when the job does not set it, and a job whose switch contradicts it is refused.

3. asked through ``XLA_WHEELS_PACK_LANE`` (with ``XLA_WHEELS_PACK_PUBLIC_KEY`` and
   ``XLA_WHEELS_PACK_WORKLOAD``, the settings rows of ``launch-env --pack-lane``), the
   lane's signed cache pack for the bundle, the workload and this host's topology is
   fetched by hash, verified and installed into ``XLA_PERSISTENT_CACHE_PATH`` by
   ``cache fetch``'s own function (:func:`xla_host.cache_command.fetch_pack`); a reader
   installs nothing and says so. A refused pack (its signature, an entry's sha256, another
   topology, no pack for this host, the lane's time limit) installs nothing and stops the
   job with the pack's exit code (1, 2, 8 or 10); ``XLA_WHEELS_ON_MISMATCH=warn`` starts
   it anyway, cold. A job refused by 1. or 2. fetches nothing.

Then the stamp (``xla_host.stamp``, naming the installed pack) is written to standard
error (the job's log) and to ``--stamp`` / ``$XLA_WHEELS_STAMP``. On a mismatch the
command is not started: exit 1 (``error:``/``fix:`` lines name each problem).
``XLA_WHEELS_ON_MISMATCH=warn`` starts it anyway with a warning (the stamp says
``warned``); any other value than ``refuse`` or ``warn`` is refused with exit 2. A stamp
that cannot be written stops the job (exit 10 for a full or read-only disk, else 2).
Without a command it checks, stamps and exits (0 or 1).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host import cache_command, cache_role, filemode, installed, launch_profile, net
from xla_host.errors import ExitCode, PipelineError, UsageError
from xla_host.redact import shown
from xla_host.stamp import Stamp, StampedWheel, job_facts, now, stamp_file, this_host, write_stamp
from xla_host.tables import Field, Table, loads_json, read_utf8

FACTS = Path("/opt/xla-wheels/image.json")
MISMATCH_VARIABLE = "XLA_WHEELS_ON_MISMATCH"
MISMATCH_MODES = ("refuse", "warn")
CACHE = launch_profile.CACHE_PATH


class JobRefused(PipelineError):
    """The job does not run what the image was built with: exit 1, the command not run."""


@dataclass(frozen=True)
class Wheel:
    name: str
    sha256: str


@dataclass(frozen=True)
class ImageFacts:
    bundle: str
    lane: str
    wheels: tuple[Wheel, ...]
    wheel_dir: Path
    profile: str | None
    profile_sha256: str | None
    environment: Mapping[str, str]
    """The profile's environment as baked (placeholders filled, no read-only switch)."""
    receipt_digest: str | None


def _facts_error(message: str, fix: str | None = None) -> UsageError:
    return UsageError(message, fix=fix or "rebuild the image with `make runtime-image`")


def read_facts(path: Path) -> ImageFacts:
    try:
        text, _ = read_utf8(path, _facts_error, what="image facts")
        data: Any = loads_json(text, source=str(path), error=_facts_error)
    except FileNotFoundError:
        raise _facts_error(f"{path} does not exist: this is not a runtime image") from None
    except ValueError as problem:
        raise _facts_error(f"{path}: not JSON ({problem})") from None
    if not isinstance(data, dict):
        raise _facts_error(f"{path}: not a JSON object")
    table = Table(data, source=str(path), error=_facts_error)
    values = table.read(
        Field("bundle", str, required=True),
        Field("lane", str, required=True),
        Field("wheels", list, required=True),
        Field("wheel-dir", str, required=True),
        Field("profile", (str, type(None))),
        Field("profile-sha256", (str, type(None))),
        Field("environment", dict, default={}),
        Field("receipt-digest", (str, type(None))),
        ignored=("facts-version", "host-package", "runtime-wheels"),
    )
    wheels = tuple(
        Wheel(**{k: row.get(k, str, required=True) for k in ("name", "sha256")})
        for row in table.rows("wheels") or []
    )
    return ImageFacts(
        bundle=values["bundle"],
        lane=values["lane"],
        wheels=wheels,
        wheel_dir=Path(values["wheel-dir"]),
        profile=values["profile"],
        profile_sha256=values["profile-sha256"],
        environment={str(k): str(v) for k, v in values["environment"].items()},
        receipt_digest=values["receipt-digest"],
    )


def role_of(env: Mapping[str, str]) -> cache_role.CacheRole:
    """The job's role by the one rule (:mod:`xla_host.cache_role`; the entrypoint has no
    flag: ``XLA_WHEELS_ROLE`` is how a launcher names it)."""
    return cache_role.decide(None, env)


def launch_environment(facts: ImageFacts, env: Mapping[str, str], role: str) -> dict[str, str]:
    """The job's environment: as given, plus the read-only switch its role implies when the
    job did not set it (the profile never sets it: the role does)."""
    job = dict(env)
    if launch_profile.CACHE_PATH in facts.environment:
        job.setdefault(launch_profile.CACHE_READ_ONLY, "1" if role == "reader" else "0")
    return job


def expected_environment(facts: ImageFacts, role: str) -> dict[str, str]:
    expected = dict(facts.environment)
    if launch_profile.CACHE_PATH in expected:
        expected[launch_profile.CACHE_READ_ONLY] = "1" if role == "reader" else "0"
    return expected


@dataclass(frozen=True)
class Checked:
    wheels: list[StampedWheel]
    problems: list[str]
    """Empty: the job runs what was baked."""
    warnings: list[str]
    """What does not change what runs (an extra logging switch), as doctor judges it."""


def check(facts: ImageFacts, env: Mapping[str, str], role: str, python: Path) -> Checked:
    _, match = installed.match_environment(python, facts.wheels, facts.wheel_dir)
    wheels = [StampedWheel(w.name, w.sha256, w.matched) for w in match.wheels]
    problems = list(match.problems)
    differences = launch_profile.compare_environment(expected_environment(facts, role), env)
    problems += [f"launch environment: {d.describe()}" for d in differences if not d.logging_only]
    warnings = [f"launch environment: {d.describe()}" for d in differences if d.logging_only]
    return Checked(wheels, problems, warnings)


def mismatch_mode(env: Mapping[str, str]) -> str:
    mode = env.get(MISMATCH_VARIABLE, "refuse") or "refuse"
    if mode not in MISMATCH_MODES:
        raise UsageError(
            f"{MISMATCH_VARIABLE}={mode!r} is neither refuse nor warn",
            fix=f"set {MISMATCH_VARIABLE}=warn to start despite a mismatch, or unset it",
        )
    return mode


def _fetch_pack(
    request: cache_command.PackRequest,
    facts: ImageFacts,
    job_env: Mapping[str, str],
    role: str,
    network: net.NetworkPolicy,
) -> tuple[str | None, PipelineError | None]:
    """The lane's pack installed into the job's cache directory (``cache fetch``'s own
    function): what the stamp names it, or why it was refused (nothing installed)."""
    try:
        fetched = cache_command.launch_pack(
            request, facts.bundle, job_env, role, Path(sys.executable), network
        )
    except PipelineError as refused:
        return None, refused
    if fetched is None:
        sys.stderr.write(f"xla-wheels: {cache_command.not_fetched(job_env.get(CACHE))}\n")
        return None, None
    sys.stderr.write(f"xla-wheels: {fetched.line()}\n")
    return fetched.named, None


def run(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, list[str], dict[str, str]]:
    """Check and stamp; (exit status, the command to run or [], its environment)."""
    parser = argparse.ArgumentParser(prog="python -m xla_host.entrypoint")
    parser.add_argument("--facts", type=Path, default=FACTS, help=f"default: {FACTS}")
    parser.add_argument("--stamp", type=Path, help="default: $XLA_WHEELS_STAMP, else none")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = list(args.command[1:] if args.command[:1] == ["--"] else args.command)
    mode = mismatch_mode(env)
    facts = read_facts(args.facts)
    decided = role_of(env)
    if decided.warning:
        # Not silent: the job's log says it, and the environment check refuses the job.
        sys.stderr.write(f"warning: {decided.warning}\n")
    sys.stderr.write(f"xla-wheels: cache role {decided.describe()}\n")
    role = decided.role
    job_env = launch_environment(facts, env, role)
    # Bad input (a lane without its key, a network variable out of range) before any check.
    request = cache_command.pack_request(None, None, None, env)
    network = net.policy_from(argparse.Namespace(), env)
    checked = check(facts, job_env, role, Path(sys.executable))
    wheels, problems = checked.wheels, checked.problems
    pack, pack_refused = None, None
    # A job that will not start fetches nothing: the image's checks come first.
    if request is not None and (not problems or mode == "warn"):
        pack, pack_refused = _fetch_pack(request, facts, job_env, role, network)
        if pack_refused is not None:
            problems.append(f"cache pack: {pack_refused.message}")
    verdict = "ok" if not problems else "warned" if mode == "warn" else "refused"
    stamp = Stamp(
        created=now(),
        host=this_host(),
        bundle=facts.bundle,
        lane=facts.lane,
        wheels=tuple(wheels),
        receipt_digest=facts.receipt_digest,
        profile=facts.profile,
        profile_sha256=facts.profile_sha256,
        cache_path=job_env.get(launch_profile.CACHE_PATH),
        role=role,
        verdict=verdict,
        problems=tuple(problems),
        job=job_facts(env, command),
        cache_pack=pack,
    )
    # The job's log keeps the stamp whatever happens next; the file is for collecting.
    sys.stderr.write("xla-wheels stamp:\n" + stamp.render())
    if path := (args.stamp or stamp_file(env)):
        write_stamp(path, stamp)
        sys.stderr.write(f"xla-wheels: stamp written to {path}\n")
    if pack_refused is not None and mode == "refuse":
        raise pack_refused  # its own exit code: 1 refused, 8 the lane's time limit, ...
    if problems and mode == "refuse":
        raise JobRefused(
            f"this job does not run what image {facts.bundle}/{facts.lane} was built with: "
            + "; ".join(problems),
            fix="run the job with the profile's environment and the image's wheels (make "
            f"runtime-image), or set {MISMATCH_VARIABLE}=warn to start it anyway",
        )
    for problem in problems:
        sys.stderr.write(f"warning: {problem} ({MISMATCH_VARIABLE}=warn: starting anyway)\n")
    for warning in checked.warnings:
        sys.stderr.write(f"warning: {warning} (logging only: not judged)\n")
    return 0, command, job_env


def main(argv: Sequence[str] | None = None) -> int:
    try:
        status, command, job_env = run(sys.argv[1:] if argv is None else argv, os.environ)
    except PipelineError as error:
        sys.stderr.write(f"error: {error.message}\n")
        if error.fix:
            sys.stderr.write(f"fix: {error.fix}\n")
        return int(error.exit_code)
    except filemode.NotARegularFile as error:  # a FIFO or device where a file is read
        sys.stderr.write(f"error: {shown(error.message)}\nfix: {shown(error.fix)}\n")
        return int(ExitCode.BAD_INPUT)
    if not command:
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, job_env)
    except OSError as error:
        sys.stderr.write(f"error: cannot start {command[0]}: {error.strerror}\n")
        return int(ExitCode.BAD_INPUT)


if __name__ == "__main__":
    sys.exit(main())
