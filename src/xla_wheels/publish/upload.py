"""``publish``: upload a bundle's locked wheels with twine, idempotently.

Plan first, then act: every wheel is checked against the lock and against the index's
simple page before anything is uploaded, so a conflict (same file name, different
sha256) stops the run before the index holds half a bundle. After each upload the simple
page is read again and must list the file with the local sha256.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from xla_host import log, runner
from xla_host.net import (
    TIMEOUT_SETTING,
    NetworkPolicy,
    Transient,
    attempts_text,
    host_of,
    with_retries,
)
from xla_host.redact import scrub
from xla_wheels.publish.errors import (
    CredentialsRejected,
    HashMismatch,
    IndexUnreachable,
    PublishError,
)
from xla_wheels.publish.index import (
    Credentials,
    check_reachable,
    credentials_for,
    project_files,
    reject_userinfo,
    remote_sha256,
    upload_url_for,
)
from xla_wheels.publish.static_index import INDEX_DIRNAME, write_static_index
from xla_wheels.publish.wheels import LocalWheel, locked_wheels
from xla_wheels.wheels_lock import Lock

#: What twine (requests, urllib3) prints for a fault that may pass: tried again.
_TWINE_FAULTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("refused", re.compile(r"connection refused|ConnectionRefusedError|Errno 111", re.I)),
    ("reset", re.compile(r"connection reset|RemoteDisconnected|Connection aborted", re.I)),
    ("timed out", re.compile(r"timed out|ReadTimeout|ConnectTimeout", re.I)),
)
_SERVER_ERROR = re.compile(r"HTTPError: (5[0-9][0-9])\b[^\n]*")


def _twine_fault(output: str) -> Transient | None:
    """The transient fault twine's failed run reports, if that is why it failed."""
    if server_error := _SERVER_ERROR.search(output):
        return Transient(f"HTTP {server_error.group(1)}", server_error.group(0).strip())
    for kind, pattern in _TWINE_FAULTS:
        if pattern.search(output):
            return Transient(kind)
    return None


@dataclass(frozen=True)
class Outcome:
    filename: str
    action: str
    """``uploaded``, ``skipped`` (already there, same sha256), ``indexed`` (static),
    ``would-upload``, ``would-index``; into a lane (``release``) also ``copied``, ``pushed``
    (devpi), ``would copy``, ``would push``."""
    sha256: str


@dataclass(frozen=True)
class PublishResult:
    index_url: str
    outcomes: list[Outcome]


def _plan(
    wheels: list[LocalWheel], index_url: str, credentials: Credentials, network: NetworkPolicy
) -> tuple[list[LocalWheel], list[Outcome]]:
    to_upload: list[LocalWheel] = []
    skipped: list[Outcome] = []
    conflicts: list[str] = []
    pages: dict[str, dict] = {}
    for wheel in wheels:
        project = wheel.name.normalized
        if project not in pages:
            pages[project] = project_files(index_url, project, credentials, network=network)
        existing = pages[project].get(wheel.record.name)
        if existing is None:
            to_upload.append(wheel)
            continue
        remote = remote_sha256(existing, credentials, size=wheel.record.size, network=network)
        if remote == wheel.sha256:
            skipped.append(Outcome(wheel.record.name, "skipped", wheel.sha256))
        else:
            conflicts.append(
                f"{wheel.record.name}: the index has sha256 {remote}, "
                f"wheels.lock and dist/ have {wheel.sha256}"
            )
    if conflicts:
        raise HashMismatch(
            "the index already holds a different file under the same name "
            "(nothing was uploaded):\n  " + "\n  ".join(conflicts),
            fix="never overwrite a published wheel: bump the version or local label of the "
            "new build, or delete the old file on the index if it was never installed",
        )
    return to_upload, skipped


def _uploaded_meanwhile(
    wheel: LocalWheel, index_url: str, credentials: Credentials, network: NetworkPolicy
) -> PublishError | None:
    """After the index refused an upload (pypiserver: a bare ``400 Bad Request``): the
    error when the file is on the index now, though it was not when this run compared,
    i.e. another publish uploaded it at the same time."""
    listed = project_files(index_url, wheel.name.normalized, credentials, network=network)
    entry = listed.get(wheel.record.name)
    if entry is None:
        return None
    there = remote_sha256(entry, credentials, size=wheel.record.size, network=network)
    if there != wheel.sha256:
        return HashMismatch(
            f"the index now holds {wheel.record.name} with sha256 {there}, not the locked "
            f"{wheel.sha256}: another publish uploaded other bytes under this name while this "
            "one ran",
            fix="never overwrite a published wheel: find which checkout published it; bump "
            "the version or local label of this build",
        )
    return PublishError(
        f"the index now holds {wheel.record.name} with the same sha256: another publish "
        "uploaded it while this one ran (it was not there when this run compared), so the "
        "index refused this upload",
        fix="run publish again: files already on the index with the same sha256 are skipped",
    )


def _twine_upload(
    wheel: LocalWheel,
    upload_url: str,
    credentials: Credentials,
    network: NetworkPolicy,
    index_url: str,
) -> None:
    argv = [
        sys.executable, "-m", "twine", "upload", "--non-interactive",
        # The URL joined to its option, and the file after "--": neither can be read as an
        # option whatever it holds.
        "--disable-progress-bar", f"--repository-url={upload_url}",
        *runner.after_options(str(wheel.path)),
    ]  # fmt: skip
    # Credentials travel in the environment (twine's own TWINE_* variables), never argv;
    # twine's child environment inherits ours (proxies, TWINE_* credentials).
    env = {}
    if credentials.username is not None:
        env["TWINE_USERNAME"] = credentials.username
    if credentials.password is not None:
        env["TWINE_PASSWORD"] = credentials.password

    returncode, output = _run_twine(argv, env, wheel, upload_url, credentials, network)
    if returncode != 0:
        raise _upload_failure(output, wheel, upload_url, credentials, network, index_url)


def _run_twine(
    argv: list[str],
    env: dict[str, str],
    wheel: LocalWheel,
    upload_url: str,
    credentials: Credentials,
    network: NetworkPolicy,
) -> tuple[int, str]:
    """twine's exit code and its output (colours off, credentials masked), retried while
    the index fails on its side; an index that never answers is an error of its own."""

    def readable(text: str) -> str:
        # twine colours its messages; the error text must read cleanly in logs and reports.
        return scrub(re.sub(r"\x1b\[[0-9;]*m", "", text), credentials.secrets)

    step = f"uploading {wheel.record.name}"

    def upload(limit: float) -> tuple[int, str]:
        try:
            result = runner.run(
                argv, step=step, env=env, timeout=limit, redact=readable, check=False
            )  # its output goes to out/<bundle>/logs/publish.log
        except runner.StepTimedOut:
            raise Transient("timed out", f"no end within {limit:g}s") from None
        output = f"{result.stdout}\n{result.stderr}".strip()
        if result.returncode != 0 and (fault := _twine_fault(output)):
            raise fault
        return result.returncode, output

    def give_up(fault: Transient, attempts: int) -> PublishError:
        tried = attempts_text(attempts)
        if fault.kind == "refused":
            return IndexUnreachable(
                f"{step}: the index at {host_of(upload_url)} refused the connection "
                f"({tried}); it is not reachable for uploads",
                fix="check that the index is running and UPLOAD_URL / INDEX_URL are right",
            )
        return PublishError(
            f"{step}: the index at {host_of(upload_url)} {fault.what_happened} ({tried})",
            fix="the index fails on its side: check its logs and health, then run publish "
            "again (files already uploaded are skipped)",
        )

    returncode, output = with_retries(
        step,
        host_of(upload_url),
        upload,
        give_up=give_up,
        timeout_fix=f"check that the index at {host_of(upload_url)} is up and answering, then "
        f"run publish again (files already uploaded are skipped); a slow link: give it longer "
        f"with {TIMEOUT_SETTING}",
        limit_s=network.transfer_limit(wheel.record.size, child_process=True),
        long=True,
        network=network,
    )
    return returncode, output


def _upload_failure(
    output: str,
    wheel: LocalWheel,
    upload_url: str,
    credentials: Credentials,
    network: NetworkPolicy,
    index_url: str,
) -> PublishError:
    """The error that says why twine did not upload ``wheel``, read from its output."""
    tail = "\n".join(line.rstrip() for line in output.splitlines()[-12:])
    lowered = output.lower()
    refused = "connection" in lowered and ("refused" in lowered or "error" in lowered)
    if credentials.source == "none" and not refused:
        # twine --non-interactive stops without asking; say where credentials come from.
        return CredentialsRejected(
            f"no credentials to upload {wheel.record.name} to {scrub(upload_url)}: neither "
            f"TWINE_USERNAME/TWINE_PASSWORD are set nor does keyring hold a password:\n{tail}",
            fix="export TWINE_USERNAME=<user> TWINE_PASSWORD=<password> and run publish "
            f"again, or store the password once with `keyring set {scrub(upload_url)} <user>` "
            "and export TWINE_USERNAME=<user>",
        )
    if re.search(r"HTTPError: 40[13]\b", output) or "forbidden" in lowered:
        return CredentialsRejected(
            f"the index at {scrub(upload_url)} rejected the upload of {wheel.record.name} "
            f"(credentials from: {credentials.source}):\n{tail}",
            fix="check TWINE_USERNAME / TWINE_PASSWORD (or the keyring entry for this URL) "
            "and that the account may upload",
        )
    if refused:
        return IndexUnreachable(
            f"the index at {scrub(upload_url)} is not reachable for uploads:\n{tail}",
            fix="check that the index is running and UPLOAD_URL / INDEX_URL are right",
        )
    if re.search(r"HTTPError: (400|409)\b", output) and (
        raced := _uploaded_meanwhile(wheel, index_url, credentials, network)
    ):
        return raced
    return PublishError(
        f"twine could not upload {wheel.record.name} to {scrub(upload_url)}:\n{tail}",
        fix="twine's message above names the cause; after fixing it, run publish again "
        "(files already on the index with the same sha256 are skipped)",
    )


def publish_remote(
    wheels: list[LocalWheel],
    index_url: str,
    upload_url: str | None,
    *,
    network: NetworkPolicy,
    dry_run: bool = False,
) -> PublishResult:
    reject_userinfo(index_url, "INDEX_URL")
    upload = upload_url or upload_url_for(index_url)
    reject_userinfo(upload, "UPLOAD_URL")
    credentials = credentials_for(upload)
    log.info(f"index {index_url} (uploads to {upload}; credentials: {credentials.source})")
    with log.section("publish: compare with the index"):
        check_reachable(index_url, credentials, network=network)
        to_upload, outcomes = _plan(wheels, index_url, credentials, network)
        for outcome in outcomes:
            log.info(f"  skip {outcome.filename}: on the index with the same sha256")
    if dry_run:
        # Reading the index is all a dry run does: it shows what a real run would upload.
        outcomes += [Outcome(w.record.name, "would-upload", w.sha256) for w in to_upload]
        to_upload = []
    for wheel in to_upload:
        with log.section(f"publish: upload {wheel.record.name} ({wheel.record.size} bytes)"):
            _twine_upload(wheel, upload, credentials, network, index_url)
            listed = project_files(index_url, wheel.name.normalized, credentials, network=network)
            entry = listed.get(wheel.record.name)
            if entry is None:
                raise PublishError(
                    f"twine reported success but the index does not list {wheel.record.name}",
                    fix="check that INDEX_URL is the simple page of the index UPLOAD_URL "
                    "uploads to",
                )
            remote = remote_sha256(entry, credentials, size=wheel.record.size, network=network)
            if remote != wheel.sha256:
                raise HashMismatch(
                    f"after upload the index serves {wheel.record.name} with sha256 {remote}, "
                    f"not the locked {wheel.sha256}",
                    fix="the index altered or mixed up the file: investigate before use",
                )
            outcomes.append(Outcome(wheel.record.name, "uploaded", wheel.sha256))
    order = {w.record.name: i for i, w in enumerate(wheels)}
    return PublishResult(index_url, sorted(outcomes, key=lambda o: order[o.filename]))


def publish(
    lock: Lock, bundle_name: str, directory: Path, index_url: str | None,
    upload_url: str | None = None, *, network: NetworkPolicy, dry_run: bool = False,
) -> PublishResult:  # fmt: skip
    """Upload (or index) the locked wheels; ``dry_run``: the same checks, nothing written."""
    with log.section(f"publish: check dist/{bundle_name} against wheels.lock"):
        wheels = locked_wheels(lock, bundle_name, directory)
        for wheel in wheels:
            log.info(f"  {wheel.record.name} sha256:{wheel.sha256}")
    if not index_url:
        if not dry_run:
            with log.section(f"publish: static PEP 503 index in {directory}"):
                write_static_index(directory, [w.record for w in wheels])
        url = (directory / INDEX_DIRNAME).resolve().as_uri() + "/"
        action = "would-index" if dry_run else "indexed"
        return PublishResult(url, [Outcome(w.record.name, action, w.sha256) for w in wheels])
    return publish_remote(wheels, index_url, upload_url, network=network, dry_run=dry_run)
