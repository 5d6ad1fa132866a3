"""The cache commands on hostile or busy directories: a FIFO wherever a file is read is
refused (exit 2) and never waited on; ``cache prune --apply`` racing a ``cache fetch`` of
thousands of entries and a process writing entries loses none of them; prune touches only
what it recognises as entries of a persistent cache (never a git object); a damaged
install record keeps everything; ``--recent-days`` is checked by its settings row; a
killed fetch's staged files are removed by the next fetch, a live one's never.

Real parts: openssl ed25519 keys, signed packs, FIFOs (``os.mkfifo``), a real git
repository, ``python -m xla_host cache ...`` in fresh processes, SIGKILL.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult
from tests.test_cache_pack import cache_entry, host_python, keypair, manifest
from xla_host import cache_pack

__all__ = ["host_python"]  # the fixture, shared with test_cache_pack.py

HOST_SRC = REPO_ROOT / "host" / "src"
MONTH_AGO = time.time() - 30 * 86400


def host_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PERSISTENT")}
    env["PYTHONPATH"] = str(HOST_SRC)
    return env


def host_cli(*args: str) -> CliResult:
    """``python -m xla_host ARGS`` in a fresh process; a hang ends at the safety timeout
    (and fails the test through TimeoutExpired), it is never waited on."""
    done = subprocess.run(
        [sys.executable, "-m", "xla_host", *args],
        env=host_env(), text=True, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    return CliResult(done.returncode, done.stdout, done.stderr)


def start_host_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "xla_host", *args], env=host_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def signed_pack(tmp: Path, count: int, *, first: int = 1_000_000_000_000) -> dict[str, Path]:
    """A signed pack of ``count`` small entries (footer and all) and its public key."""
    cold = tmp / f"cold-{count}-{first}"
    cold.mkdir()
    for i in range(count):
        (cold / str(first + i)).write_bytes(cache_entry(f"executable {i}".encode() * 8))
    private, public = keypair(tmp, f"lane-{count}-{first}")
    pack, _ = cache_pack.write_pack(tmp / "packs", cold, private, manifest())
    return {"pack": pack, "pub": public, "cold": cold}


def fetch_args(made: dict[str, Path], python: Path, into: Path) -> list[str]:
    return ["cache", "fetch", "--pack", str(made["pack"]), "--into", str(into), "--key",
            str(made["pub"]), "--python", str(python), "--device", "CPU", "--topology",
            "cpu-1x1"]  # fmt: skip


def refused_as_fifo(done: CliResult, path: Path) -> None:
    assert done.exit_code == 2, done.output
    assert "FIFO" in done.stderr and str(path) in done.stderr, done.output
    assert "Traceback" not in done.stderr and "fix:" in done.stderr, done.output


# --- a FIFO wherever a path is read ------------------------------------------------------


@pytest.mark.slow
def test_a_fifo_anywhere_the_cache_commands_read_is_refused_never_waited_on(
    tmp_path: Path, host_python: Path
) -> None:
    made = signed_pack(tmp_path, 2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    into = tmp_path / "cache"
    into.mkdir()
    lane = tmp_path / "lane"
    (lane / "packs").mkdir(parents=True)
    index = lane / "packs" / "index.json"
    os.mkfifo(index)
    base = ["--into", str(into), "--key", str(made["pub"]), "--python", str(host_python),
            "--device", "CPU", "--topology", "cpu-1x1"]  # fmt: skip

    for source, named in (("--lane", str(lane)), index), (("--lane", lane.as_uri()), index), (
        ("--pack", fifo.as_uri()), fifo):  # fmt: skip
        refused_as_fifo(host_cli("cache", "fetch", *source, *base), named)
    refused_as_fifo(host_cli("cache", "prune", "--cache", str(into), "--keep-run", str(fifo)),
                    fifo)  # fmt: skip
    refused_as_fifo(host_cli("cache", "explain", "--run", str(fifo), "--cache", str(into)), fifo)
    key = host_cli("cache", "fetch", "--pack", str(made["pack"]), "--into", str(into),
                   "--key", str(fifo), *base[4:])  # fmt: skip
    assert key.exit_code == 2 and f"the key {fifo} is not a regular" in key.stderr, key.output
    assert os.listdir(into) == []  # nothing was installed anywhere

    # --out is checked before the workload runs (no child started, no runs/ directory).
    out = tmp_path / "record" / "keys.json"
    out.parent.mkdir()
    os.mkfifo(out)
    done = host_cli("cache", "record", "--out", str(out), "--python", "/bin/false",
                    "--device", "CPU")  # fmt: skip
    refused_as_fifo(done, out)
    assert not (out.parent / "runs").exists()


@pytest.mark.slow
def test_a_fifo_or_damaged_install_record_keeps_every_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / cache_pack.INSTALLED_DIR).mkdir(parents=True)
    for i in range(3):
        (cache / f"{5_000_000_000_000 + i}").write_bytes(cache_entry(b"old" * 100))
        os.utime(cache / f"{5_000_000_000_000 + i}", (MONTH_AGO, MONTH_AGO))
    before = sorted(p.name for p in cache.iterdir())
    records = cache / cache_pack.INSTALLED_DIR
    for make in (lambda p: os.mkfifo(p), lambda p: p.write_text(""),
                 lambda p: p.write_text('{"manifest": {"pack-ver')):  # fmt: skip
        record = records / "0123456789abcdef0123456789abcdef.json"
        make(record)
        size = host_cli("cache", "size", "--cache", str(cache), "--recent-days", "0")
        assert size.exit_code == 0, size.output
        assert f"install record {record}" in size.stdout and "every entry is kept" in size.stdout
        assert "unreferenced: 0" in size.stdout, size.stdout
        done = host_cli("cache", "prune", "--cache", str(cache), "--recent-days", "0", "--apply")
        assert done.exit_code == 0 and "removed 0 entr(ies)" in done.stdout, done.output
        assert sorted(p.name for p in cache.iterdir()) == before
        record.unlink()
    done = host_cli("cache", "prune", "--cache", str(cache), "--recent-days", "0", "--apply")
    assert "removed 3 entr(ies)" in done.stdout, done.output  # once the record is repaired


# --- what prune recognises ---------------------------------------------------------------


@pytest.mark.slow
def test_prune_never_takes_a_git_objects_directory_or_an_unrecognised_file(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "file.txt").write_text("content\n")
    subprocess.run([*git, "add", "file.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    objects = next(p for p in (repo / ".git" / "objects").iterdir() if len(p.name) == 2)
    held = {p.name: p.read_bytes() for p in objects.iterdir()}
    for path in objects.iterdir():
        os.utime(path, (MONTH_AGO, MONTH_AGO))
    done = host_cli("cache", "prune", "--cache", str(objects), "--recent-days", "0", "--apply")
    assert done.exit_code == 2, done.output
    assert "does not look like a torch_xla persistent cache" in done.stderr, done.output
    assert {p.name: p.read_bytes() for p in objects.iterdir()} == held
    subprocess.run([*git, "fsck", "--strict"], check=True, capture_output=True)

    # In a real cache: the old entry goes, an entry-named file without the footer (a
    # stock build's entry, anything else) stays and is listed.
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "1111111111111111").write_bytes(cache_entry(b"old executable"))
    (cache / "2222222222222222").write_bytes(b"no footer: not recognised" * 4)
    # A damaged checksum is torch_xla's to judge (it rewrites the entry): magic and length
    # make it an entry, so age can take it.
    (cache / "3333333333333333").write_bytes(cache_entry(b"x")[:-1] + b"\0")
    for path in cache.iterdir():
        os.utime(path, (MONTH_AGO, MONTH_AGO))
    done = host_cli("cache", "prune", "--cache", str(cache), "--recent-days", "0", "--apply")
    assert done.exit_code == 0, done.output
    assert "removed 2 entr(ies)" in done.stdout, done.output
    assert "not cache entries (never removed): 1: 2222222222222222" in done.stdout
    # (--apply keeps its install lock in .xla-packs/, a hidden name torch_xla never loads)
    assert sorted(p.name for p in cache.iterdir()) == [".xla-packs", "2222222222222222"]


@pytest.mark.slow
def test_recent_days_is_checked_by_its_settings_row(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "4444444444444444").write_bytes(cache_entry(b"written seconds ago"))
    for value in ("nan", "-1", "-inf", "inf", "1e9", "seven"):
        for action in ("prune", "size"):
            done = host_cli("cache", action, "--cache", str(cache), f"--recent-days={value}",
                            *(("--apply",) if action == "prune" else ()))  # fmt: skip
            assert done.exit_code == 2, (value, done.output)
            assert "--recent-days" in done.stderr and "fix:" in done.stderr, done.output
            assert "Traceback" not in done.stderr
    assert (cache / "4444444444444444").exists()
    done = host_cli("cache", "prune", "--cache", str(cache), "--recent-days=0.5", "--apply")
    assert done.exit_code == 0 and "removed 0 entr(ies)" in done.stdout, done.output


# --- prune racing a fetch and a writer ----------------------------------------------------

_WRITER = """
import os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from tests.test_cache_pack import cache_entry
cache, names = Path(sys.argv[1]), sys.argv[2:]
for name in names:  # as patch 0004 writes: a temporary file, then the rename into place
    temporary = cache / f"{{name}}.tmp.host.{{os.getpid():016x}}"
    temporary.write_bytes(cache_entry(name.encode() * 64))
    os.rename(temporary, cache / name)
"""

_PRUNER = """
import sys
from pathlib import Path
from xla_host.cli import main
stop, argv = Path(sys.argv[1]), sys.argv[2:]
runs = 0
while not stop.exists() or runs == 0:
    if main(argv) != 0:
        sys.exit(1)
    runs += 1
print(f"pruned {{runs}} times", file=sys.stderr)
"""


@pytest.mark.slow
def test_prune_racing_a_fetch_of_thousands_of_entries_and_a_writer_loses_none(
    tmp_path: Path, host_python: Path
) -> None:
    made = signed_pack(tmp_path, 2000)
    cache = tmp_path / "cache"
    cache.mkdir()
    old = [f"{6_000_000_000_000 + i}" for i in range(300)]  # earlier runs': prune takes them
    for name in old:
        (cache / name).write_bytes(cache_entry(b"old"))
        os.utime(cache / name, (MONTH_AGO, MONTH_AGO))
    written = [f"{7_000_000_000_000 + i}" for i in range(1500)]
    # The writer's run: its key record names the entries it writes (as a gate's keys.json).
    run = tmp_path / "run-keys.json"
    run.write_text(json.dumps({"key-record": 1, "graphs": [{"entries": written}]}))
    stop = tmp_path / "stop"
    pruner = subprocess.Popen(
        [sys.executable, "-c", _PRUNER.format(), str(stop), "cache", "prune", "--cache",
         str(cache), "--recent-days", "0", "--keep-run", str(run), "--apply"],
        env=host_env(), text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER.format(tests=str(REPO_ROOT)), str(cache), *written],
        env=host_env(),
    )  # fmt: skip
    fetcher = start_host_cli(*fetch_args(made, host_python, cache))
    fetched_out, fetched_err = fetcher.communicate(timeout=600)
    assert writer.wait(timeout=600) == 0
    stop.touch()
    _, pruned_err = pruner.communicate(timeout=600)
    assert fetcher.returncode == 0, fetched_err
    assert pruner.returncode == 0, pruned_err
    assert "2000 entr(ies) written" in fetched_out, fetched_out

    present = {p.name for p in cache.iterdir()}
    installed = {p.name for p in made["cold"].iterdir()}
    assert installed <= present, f"{len(installed - present)} installed entries lost"
    assert set(written) <= present, f"{len(set(written) - present)} written entries lost"
    assert not set(old) & present  # the prune did run, and took what it may
    for name in installed:
        assert (cache / name).read_bytes() == (made["cold"] / name).read_bytes()


# --- a killed fetch's leftovers ------------------------------------------------------------


def _staged_runs(cache: Path) -> dict[str, int]:
    """Each run's token -> how many staged files it has in ``cache``."""
    runs = {p.name[len(".xlapack-") : -len(".lock")]: 0 for p in cache.glob(".xlapack-*.lock")}
    for path in cache.glob(".xlapack-*-*"):
        token = path.name[len(".xlapack-") :].split("-", 1)[0]
        runs[token] = runs.get(token, 0) + 1
    return runs


def _wait_for_a_staged_run(
    cache: Path, process: subprocess.Popen[str], known: set[str], count: int
) -> str:
    """The token of a new run whose ``count`` files are all staged (it then waits for the
    install lock the test holds); bounded by the process: it must still be running."""
    while True:
        assert process.poll() is None, process.communicate()
        ready = [t for t, n in _staged_runs(cache).items() if t not in known and n == count]
        if ready:
            return ready[0]
        time.sleep(0.02)


@pytest.mark.slow
def test_the_next_fetch_removes_what_a_killed_one_staged_and_never_a_live_ones(
    tmp_path: Path, host_python: Path
) -> None:
    made = signed_pack(tmp_path, 200)
    cache = tmp_path / "cache"
    (cache / cache_pack.INSTALLED_DIR).mkdir(parents=True)
    (cache / ".xlapack-notes").write_text("not a fetch's: no run lock names it")
    # Each fetch stages every entry, then waits for the install lock, held here as a
    # prune holds it: three runs are seen mid-install, one of them killed there.
    with cache_pack.install_lock(cache, exclusive=True):
        killed = start_host_cli(*fetch_args(made, host_python, cache))
        dead = _wait_for_a_staged_run(cache, killed, set(), 200)
        live = start_host_cli(*fetch_args(made, host_python, cache))
        alive = _wait_for_a_staged_run(cache, live, {dead}, 200)
        assert _staged_runs(cache)[dead] == 200  # still running then: left alone
        # Waiting for the lock a prune holds: no record written, no entry linked yet.
        assert not list((cache / cache_pack.INSTALLED_DIR).glob("*.json"))
        assert not {p.name for p in made["cold"].iterdir()} & {p.name for p in cache.iterdir()}
        killed.send_signal(signal.SIGKILL)
        killed.communicate()
        assert _staged_runs(cache)[dead] == 200  # SIGKILL: its files stay behind
        third = start_host_cli(*fetch_args(made, host_python, cache))
        _wait_for_a_staged_run(cache, third, {dead, alive}, 200)
        runs = _staged_runs(cache)
        assert dead not in runs  # the killed run's files and lock: gone
        assert runs[alive] == 200  # the live run's: all there
    for process in (live, third):
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
    assert _staged_runs(cache) == {}
    assert (cache / ".xlapack-notes").read_text() == "not a fetch's: no run lock names it"
    assert {p.name for p in made["cold"].iterdir()} <= {p.name for p in cache.iterdir()}


# --- the guard: the cache modules open user-given paths only through checked helpers ------

CACHE_MODULES = ("cache_command", "cache_prune", "cache_pack", "cache_explain",
                 "cache_contract", "cache_keys", "lane_packs")  # fmt: skip
#: Calls that open a path and why each is allowed (module, function, call).
ALLOWED = {
    # A temporary directory of its own (tempfile), holding openssl's input, never a user's.
    ("cache_pack", "verify_envelope", "write_bytes"),
    # The gate's own run directory: keys.json is written there, never read.
    ("cache_pack", "pack_gate_run", "write_text"),
}
OPENING = {"open", "read_text", "read_bytes", "write_text", "write_bytes"}


def _opening_calls(module: str) -> Iterator[tuple[ast.FunctionDef, str, ast.Call]]:
    """(function, what it calls, the call) for each call of these modules that opens a
    path: ``open(...)``, ``<path>.open/read_text/read_bytes/write_*``, ``os.open``."""
    tree = ast.parse((HOST_SRC / "xla_host" / f"{module}.py").read_text())
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        for call in ast.walk(function):
            if not isinstance(call, ast.Call):
                continue
            target = call.func
            if isinstance(target, ast.Name) and target.id == "open":
                yield function, "open", call
            elif isinstance(target, ast.Attribute) and target.attr in OPENING:
                owner = ast.unparse(target.value)
                if owner == "tarfile":
                    continue  # tarfile.open(fileobj=...) reads a stream opened as checked
                yield function, f"{owner}.{target.attr}" if owner == "os" else (
                    target.attr), call  # fmt: skip


def test_the_cache_modules_open_no_path_except_through_the_checked_helpers() -> None:
    found = []
    for module in CACHE_MODULES:
        for function, called, call in _opening_calls(module):
            if called == "os.open":
                # Opened without blocking (checked once open) or created new (O_EXCL).
                source = ast.unparse(function)
                if "O_NONBLOCK" in source or "O_EXCL" in source:
                    continue
            if (module, function.name, called) not in ALLOWED:
                found.append(f"{module}.{function.name}: {called} (line {call.lineno})")
    assert not found, (
        "open these through xla_host.filemode (read_shared, open_shared, file_sha256, "
        "write_by_rename), or add them to ALLOWED with the reason: " + "; ".join(found)
    )


# --- nothing written outside the cache ---------------------------------------------------


def refused_as_link(done: CliResult, path: Path) -> None:
    assert done.exit_code == 2, done.output
    assert f"{path} is a symbolic link" in done.stderr, done.output
    assert f"rm {path}" in done.stderr, done.output  # the fix removes the link, nothing else
    assert "Traceback" not in done.stderr, done.output


def test_a_symlinked_control_path_of_the_cache_is_refused_and_nothing_is_written_through_it(
    tmp_path: Path, host_python: Path
) -> None:
    made = signed_pack(tmp_path, 2)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    into = tmp_path / "cache"
    into.mkdir()
    records = into / cache_pack.INSTALLED_DIR

    # The records' directory a link to another directory: the fetch and the prune refuse.
    records.symlink_to(elsewhere, target_is_directory=True)
    refused_as_link(host_cli(*fetch_args(made, host_python, into)), records)
    refused_as_link(host_cli("cache", "prune", "--cache", str(into), "--apply"), records)
    assert os.listdir(elsewhere) == []  # no record, no lock written there
    assert sorted(os.listdir(into)) == [cache_pack.INSTALLED_DIR]  # no entry linked either
    records.unlink()

    # The install lock a link (to a file outside): refused where it is opened.
    records.mkdir()
    outside = elsewhere / "lock"
    outside.write_text("theirs\n")
    lock = records / cache_pack.INSTALL_LOCK
    lock.symlink_to(outside)
    refused_as_link(host_cli(*fetch_args(made, host_python, into)), lock)
    refused_as_link(host_cli("cache", "prune", "--cache", str(into), "--apply"), lock)
    assert outside.read_text() == "theirs\n"
    assert sorted(os.listdir(records)) == [cache_pack.INSTALL_LOCK]  # no record either
    lock.unlink()

    # A staged run's lock a link: the next fetch's clean-up refuses it, never follows it.
    staged = into / f"{cache_pack.STAGED_PREFIX}0123456789ab.lock"
    staged.symlink_to(outside)
    refused_as_link(host_cli(*fetch_args(made, host_python, into)), staged)
    assert outside.read_text() == "theirs\n"
    staged.unlink()

    done = host_cli(*fetch_args(made, host_python, into))  # once the links are gone
    assert done.exit_code == 0, done.output
    assert os.listdir(elsewhere) == ["lock"]


def test_into_a_symbolic_link_loop_is_named_as_one(tmp_path: Path, host_python: Path) -> None:
    made = signed_pack(tmp_path, 1)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for into in (loop, loop / "cache"):
        done = host_cli(*fetch_args(made, host_python, into))
        assert done.exit_code == 2, done.output
        assert f"{into} is a symbolic link loop" in done.stderr, done.output
        assert "is a file" not in done.stderr and "Traceback" not in done.stderr, done.output


def test_a_python_that_is_not_there_is_bad_input(tmp_path: Path) -> None:
    made = signed_pack(tmp_path, 1)
    done = host_cli(*fetch_args(made, tmp_path / "nowhere" / "python", tmp_path / "cache"))
    assert done.exit_code == 2, done.output
    assert "cannot run the interpreter" in done.stderr and "fix: pass --python" in done.stderr
    assert not (tmp_path / "cache").exists()
