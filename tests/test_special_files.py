"""A file the pipeline reads must be a regular file of sane size and depth, and a directory
it makes must be a directory: anything else is refused with `error:`/`fix:` and exit 2
before it is opened, never a hang, a traceback or a misleading "does not exist".

Real FIFOs (``os.mkfifo``) and real files through the real CLI (a fresh process, with a
timeout: before the stat check, opening a FIFO waited for a writer forever).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult, run_cli
from tests.gitrepos import Upstream, make_project
from tests.test_error_contract import BUNDLE, assert_bad_input, project_copy
from xla_host import filemode
from xla_host.errors import ManifestError, SourceError, UsageError
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.restart import load_baseline
from xla_host.net import DEFAULT_NETWORK
from xla_host.receipt_store import DirectoryStore
from xla_host.slice import WRITER_LEASE, claim_writer
from xla_host.stamp import Stamp, write_stamp
from xla_host.tables import MAX_DEPTH, MAX_FILE_BYTES, loads_json, loads_toml, read_utf8
from xla_wheels.builder.spec import STAGE_RECORD, built_wheel
from xla_wheels.bundle import load_bundle
from xla_wheels.publish.index import Credentials, project_files
from xla_wheels.sources import SourceCache, fetch_sources

#: Well under the suite's limits, well over what a refused file takes (< 1 s).
TIMEOUT_S = 30.0


def run(root: Path, *args: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli(
        *args,
        root=root,
        env={"XLA_WHEELS_OUT": str(root / "out"), "HOME": str(root), **(env or {})},
        timeout=TIMEOUT_S,
    )


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


# --- special files where a file is read ------------------------------------------------

# (name, the file made a FIFO, the command that reads it, words of its error line).
# The first two are the cases; the others are the same class in other readers.
FIFO_READERS: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    ("manifest", f"build/bundles/{BUNDLE}.toml", ("bundles",), ("FIFO", f"{BUNDLE}.toml")),
    (
        "patch",
        "patches/torch_xla/0002-runtime-memory-info-binding.patch",
        ("bundles",),
        ("FIFO", "0002-runtime-memory-info-binding.patch"),
    ),
    ("wheels.lock", "wheels.lock", ("lock-check",), ("FIFO", "wheels.lock")),
    ("lanes.toml", "build/lanes.toml", ("lanes",), ("FIFO", "lanes.toml")),
    (
        "signing key",
        "keys/team.pem",
        ("attest", "--bundle", BUNDLE),
        ("FIFO", "team.pem", "signing key"),
    ),
]


@pytest.mark.parametrize(
    ("relpath", "command", "words"),
    [entry[1:] for entry in FIFO_READERS],
    ids=[entry[0] for entry in FIFO_READERS],
)
def test_a_fifo_where_a_file_is_read_is_refused_before_it_is_opened(
    tmp_path: Path, relpath: str, command: tuple[str, ...], words: tuple[str, ...]
) -> None:
    root = project_copy(tmp_path)
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    _fifo(path)
    result = run(root, *command, env={"XLA_WHEELS_SIGNING_KEY": str(root / "keys/team.pem")})
    assert_bad_input(result, *words)
    assert "does not exist" not in result.stderr
    assert "regular" in result.stderr  # the fix says what belongs there


def test_a_manifest_that_is_a_link_to_a_device_is_refused_from_its_stat(tmp_path: Path) -> None:
    # /dev/zero never ends: reading it whole would fill memory.
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.unlink()
    manifest.symlink_to("/dev/zero")
    assert_bad_input(run(root, "bundles"), f"{BUNDLE}.toml", "character device")


def test_a_fifo_given_to_doctor_as_the_launch_environment_is_refused(
    tmp_path: Path,
) -> None:
    root = project_copy(tmp_path)
    env_file = tmp_path / "env.sh"
    os.mkfifo(env_file)
    result = run(root, "doctor", "--bundle", BUNDLE, "--env-file", str(env_file))
    assert_bad_input(result, "env.sh", "FIFO")


# --- size and depth -----------------------------------------------------------------------


def test_a_manifest_nested_100000_arrays_deep_is_bad_input_not_a_recursion_error(
    tmp_path: Path,
) -> None:
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(manifest.read_text() + "\n[extra]\nx = " + "[" * 100_000 + "]" * 100_000)
    result = run(root, "bundles")
    assert_bad_input(result, f"{BUNDLE}.toml", f"nested more than {MAX_DEPTH} levels")
    assert "RecursionError" not in result.output


def test_a_wheels_lock_nested_too_deep_is_bad_input_for_its_reader(tmp_path: Path) -> None:
    # Deep enough for the limit, not for Python's stack: the limit is the file's, not luck.
    root = project_copy(tmp_path)
    lock = root / "wheels.lock"
    lock.write_text(lock.read_text() + "\nx = " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    assert_bad_input(run(root, "lock-check"), "wheels.lock", "nested more than")


def test_a_manifest_larger_than_the_limit_is_refused_without_being_read(tmp_path: Path) -> None:
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    with manifest.open("r+b") as handle:  # sparse: the size is there, the bytes are not
        handle.truncate(MAX_FILE_BYTES + 1)
    assert_bad_input(run(root, "bundles"), f"{BUNDLE}.toml", "more than a bundle manifest may be")


def _toml(depth: int) -> None:
    # The top table is level 1: `x = []` is two levels.
    loads_toml("x = " + "[" * (depth - 1) + "]" * (depth - 1), source="f", error=ManifestError)


def _json(depth: int) -> None:
    loads_json("[" * depth + "]" * depth, source="f", error=ManifestError)


@pytest.mark.parametrize("loads", [_toml, _json], ids=["toml", "json"])
def test_the_depth_limit_is_exact_in_both_formats(loads: Callable[[int], None]) -> None:
    loads(MAX_DEPTH)
    with pytest.raises(ManifestError, match=f"more than {MAX_DEPTH} levels"):
        loads(MAX_DEPTH + 1)


def test_a_fifo_is_refused_by_the_one_reader_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "table.toml"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError, match="is a FIFO"):
        read_utf8(fifo, ManifestError, what="bundle manifest")


# --- a file where a directory is made ----------------------------------------------------


@pytest.mark.parametrize("variable", ["XLA_WHEELS_OUT", "XLA_WHEELS_CACHE"])
@pytest.mark.parametrize("below", [False, True], ids=["the file", "below the file"])
def test_a_work_directory_setting_naming_a_file_is_bad_input(
    tmp_path: Path, variable: str, below: bool
) -> None:
    root = project_copy(tmp_path)
    file = tmp_path / "a-file"
    file.write_text("not a directory\n")
    value = file / "sub" if below else file
    result = run(root, "lock", "--bundle", BUNDLE, env={variable: str(value)})
    assert_bad_input(result, variable, str(file), "not a directory")
    assert "NotADirectoryError" not in result.output
    assert file.read_text() == "not a directory\n"


# --- launch-env in a root without its helper -------------------------------------------


def test_launch_env_in_a_root_without_scripts_is_bad_input_and_writes_nothing(
    tmp_path: Path,
) -> None:
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    # A profile that needs no build, so that the run gets as far as writing.
    manifest.write_text(manifest.read_text() + '\n[profiles.plain.device]\nPJRT_DEVICE = "TPU"\n')
    (root / "scripts" / "xla_launch_profile.py").unlink()
    out = tmp_path / "launch"
    result = run(
        root, "launch-env", "--bundle", BUNDLE, "--profile", "plain", "--role", "reader",
        "--out", str(out),
    )  # fmt: skip
    assert_bad_input(result, "xla_launch_profile.py", "does not exist")
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())


# --- a special file where a file is written -------------------------------------------
# Writing by rename (xla_host.filemode, the one writer of files others read) replaces
# what is at the path: before the check, `doctor --stamp /dev/zero` as root turned the
# device into a JSON file. Device nodes are made in tmp_path (os.mknod, root only), so a
# regression destroys nothing of the machine's.


def _device(path: Path) -> bool:
    """A character device node like /dev/null at ``path``; False where that needs root."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        return False
    return True


def _special_outputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Outputs that are no file, each with what its error line says it is."""
    outputs: dict[str, tuple[Path, str]] = {}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outputs["fifo"] = (fifo, "FIFO")
    if _device(tmp_path / "device"):
        outputs["device"] = (tmp_path / "device", "character device")
        (tmp_path / "to-device").symlink_to(tmp_path / "device")
        outputs["link to a device"] = (tmp_path / "to-device", "which is a character device")
    (tmp_path / "directory").mkdir()
    outputs["directory"] = (tmp_path / "directory", "a directory")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    outputs["dangling link"] = (tmp_path / "dangling", "does not exist")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    outputs["link loop"] = (tmp_path / "loop", "symbolic link loop")
    return outputs


def _as_it_was(path: Path) -> tuple[int, int, str | None]:
    status = os.lstat(path)
    return status.st_mode, status.st_rdev, os.readlink(path) if path.is_symlink() else None


def test_writing_by_rename_leaves_every_output_that_is_no_file_as_it_was(tmp_path: Path) -> None:
    for name, (path, words) in _special_outputs(tmp_path).items():
        before = _as_it_was(path)
        with pytest.raises(filemode.NotARegularFile, match=words) as refused:
            filemode.write_by_rename(path, "{}\n")
        assert str(path) in refused.value.message and "nothing was written" in refused.value.message
        assert "ls -l" in refused.value.fix, name
        assert _as_it_was(path) == before, name
        # The set of files written together refuses it before anything changes.
        kept = tmp_path / f"kept-{name.replace(' ', '-')}"
        kept.write_text("old\n")
        with pytest.raises(filemode.NotARegularFile):
            filemode.write_all([(kept, "new\n"), (path, "{}\n")])
        assert kept.read_text() == "old\n" and _as_it_was(path) == before, name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_link_to_a_regular_file_is_written_through_and_kept(tmp_path: Path) -> None:
    # What a user who linked an output meant: the file it names gets the new content.
    target = tmp_path / "shared" / "stamp.json"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "stamp.json"
    link.symlink_to(target)
    filemode.write_by_rename(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"


def test_a_stamp_to_a_device_or_fifo_is_bad_input_for_doctor_and_the_entrypoint(
    tmp_path: Path,
) -> None:
    # write_stamp is what `doctor --stamp`, STAMP= and the image's XLA_WHEELS_STAMP write
    # through; the entrypoint has no CLI edge, so the error is its own.
    stamp = Stamp(
        created="2026-01-02T03:04:05Z", host="h", bundle="b", lane=None, wheels=(),
        receipt_digest=None, profile=None, profile_sha256=None, cache_path=None, role=None,
        verdict="ok",
    )  # fmt: skip
    for name, (path, words) in _special_outputs(tmp_path).items():
        before = _as_it_was(path)
        with pytest.raises(UsageError, match=words) as refused:
            write_stamp(path, stamp)
        assert "XLA_WHEELS_STAMP=" in (refused.value.fix or ""), name
        assert _as_it_was(path) == before, name


def test_doctor_leaves_a_device_or_a_link_to_one_given_as_its_stamp_as_it_was(
    tmp_path: Path,
) -> None:
    # The case through the real command: `doctor --stamp /dev/zero` as root turned
    # the device into a JSON file; XLA_WHEELS_STAMP (what the image's entrypoint reads) and
    # STAMP= (make's) went the same way. A node in tmp_path stands for /dev/zero.
    root = project_copy(tmp_path)
    device = tmp_path / "device"
    if not _device(device):
        _fifo(device)  # not root: the FIFO is the same class
    link = tmp_path / "stamp.json"
    link.symlink_to(device)
    before = (_as_it_was(device), _as_it_was(link))
    doctor = ("doctor", "--bundle", BUNDLE, "--python", sys.executable)
    for given, env in ((device, {}), (link, {"XLA_WHEELS_STAMP": str(link)})):
        args = (*doctor, "--stamp", str(given)) if not env else doctor
        result = run(root, *args, env=env)
        assert_bad_input(result, str(given), "nothing was written")
        assert (_as_it_was(device), _as_it_was(link)) == before


def test_launch_env_into_a_directory_holding_a_fifo_as_env_sh_is_bad_input(
    tmp_path: Path,
) -> None:
    # A member through the real CLI: launch-env writes its files by rename into --out.
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(manifest.read_text() + '\n[profiles.plain.device]\nPJRT_DEVICE = "TPU"\n')
    out = tmp_path / "launch"
    out.mkdir()
    _fifo(out / "env.sh")
    result = run(
        root, "launch-env", "--bundle", BUNDLE, "--profile", "plain", "--role", "reader",
        "--out", str(out),
    )  # fmt: skip
    assert_bad_input(result, "env.sh", "FIFO", "nothing was written")
    assert stat.S_ISFIFO(os.lstat(out / "env.sh").st_mode)
    assert sorted(p.name for p in out.iterdir()) == ["env.sh"]


# --- a FIFO in a cache, lane, store or shared directory ------------------------------
# Anyone with access to a shared directory can leave a FIFO where a file is expected. Each
# read there goes through the checks the manifests get (filemode.read_shared,
# filemode.file_sha256): refused from its stat, never opened. The guard proves no reader
# ever waited on it: should one (a regression), it is let go with an empty read instead of
# hanging the suite, and the test fails.


class FifoGuard:
    """Lets go of any reader blocked on ``fifo`` (opening it for writing succeeds only
    while someone has it open for reading) and records that it had to."""

    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        self.readers = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(0.05):
            try:
                descriptor = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: nobody reading; ENOENT: gone
                continue
            self.readers += 1
            os.close(descriptor)  # the reader reads an empty file and goes on

    def __enter__(self) -> FifoGuard:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


IS_A_FIFO = r"is a FIFO \(named pipe\), not a "


def guarded_fifo(path: Path) -> FifoGuard:
    path.parent.mkdir(parents=True, exist_ok=True)
    _fifo(path)
    return FifoGuard(path)


def test_a_fifo_as_a_stage_record_in_the_stage_cache_is_refused(tmp_path: Path) -> None:
    stage = tmp_path / "stages" / "torch-0123"
    with (
        guarded_fifo(stage / STAGE_RECORD) as guard,
        pytest.raises(filemode.NotARegularFile, match="is a FIFO"),
    ):
        built_wheel(stage)
    assert guard.readers == 0


def test_a_fifo_in_a_static_lane_is_refused_when_hashed_or_fetched(tmp_path: Path) -> None:
    # `status` and `publish-lane` hash the lane's wheels; lane reads fetch file:// pages.
    lane = tmp_path / "lanes" / "validation"
    wheel = lane / "torch" / "torch-2.9.0-cp311-cp311-linux_x86_64.whl"
    page = lane / "torch" / "index.html"
    with guarded_fifo(wheel) as guard, guarded_fifo(page) as page_guard:
        with pytest.raises(filemode.NotARegularFile, match="is a FIFO"):
            filemode.file_sha256(wheel)
        with pytest.raises(filemode.NotARegularFile, match=IS_A_FIFO + "lane file"):
            project_files(
                lane.as_uri(), "torch", Credentials(None, None, "none"), network=DEFAULT_NETWORK
            )
    assert guard.readers == page_guard.readers == 0


def test_a_fifo_as_the_writer_lease_is_refused_by_the_claim(tmp_path: Path) -> None:
    cache = tmp_path / "xla-cache"
    with (
        guarded_fifo(cache / WRITER_LEASE) as guard,
        pytest.raises(filemode.NotARegularFile, match=IS_A_FIFO + "writer lease"),
    ):
        claim_writer(cache, "job-1")
    assert guard.readers == 0


def test_a_fifo_as_a_receipt_in_a_directory_store_is_refused(tmp_path: Path) -> None:
    # A member the issue did not list: the receipt store is a shared directory too.
    store = DirectoryStore(tmp_path / "store")
    with (
        guarded_fifo(tmp_path / "store" / "v6e-2.9" / "receipt.json") as guard,
        pytest.raises(filemode.NotARegularFile, match=IS_A_FIFO + "receipt"),
    ):
        store.get("v6e-2.9/receipt.json")
    assert guard.readers == 0


def test_a_fifo_as_a_recorded_gate_baseline_is_refused(tmp_path: Path) -> None:
    # A member the issue did not list: the restart check's baselines may be shared too.
    with (
        guarded_fifo(tmp_path / "baselines" / "2.9.0__CPU__small.json") as guard,
        pytest.raises(GateEnvironmentError, match=IS_A_FIFO + "baseline"),
    ):
        load_baseline(guard.fifo)
    assert guard.readers == 0


def test_a_fifo_as_the_head_of_a_cached_bare_repository_is_refused_before_git_runs(
    tmp_path: Path, upstreams: dict[str, Upstream]
) -> None:
    project = make_project(tmp_path, upstreams)
    bundle = load_bundle(project, "test-1")
    cache = SourceCache(tmp_path / "cache", mirror=None)
    fetch_sources(bundle, cache, tmp_path / "src")
    repo = cache.repo_for(bundle.component("torch"))
    with (
        guarded_fifo(repo / "HEAD") as guard,
        pytest.raises(SourceError, match="HEAD is a FIFO") as refused,
    ):
        fetch_sources(bundle, cache, tmp_path / "src")
    assert guard.readers == 0
    assert f"rm -rf {repo}" in (refused.value.fix or "")


# --- a symbolic link loop where a path is given ------------------------------------------


def _loop(path: Path) -> Path:
    path.symlink_to(path.name)  # a link to itself
    return path


@pytest.mark.parametrize("variable", ["XLA_WHEELS_OUT", "XLA_WHEELS_CACHE"])
def test_a_work_directory_setting_naming_a_symlink_loop_is_bad_input(
    tmp_path: Path, variable: str
) -> None:
    root = project_copy(tmp_path)
    loop = _loop(tmp_path / "loop")
    result = run(root, "lock", "--bundle", BUNDLE, env={variable: str(loop / "sub")})
    assert_bad_input(result, str(loop), "symbolic link loop")
    assert "RuntimeError" not in result.output


def test_launch_env_out_naming_a_symlink_loop_is_bad_input(tmp_path: Path) -> None:
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(manifest.read_text() + '\n[profiles.plain.device]\nPJRT_DEVICE = "TPU"\n')
    loop = _loop(tmp_path / "loop")
    result = run(
        root, "launch-env", "--bundle", BUNDLE, "--profile", "plain", "--role", "reader",
        "--out", str(loop),
    )  # fmt: skip
    assert_bad_input(result, str(loop), "symbolic link loop")
    assert loop.is_symlink()


def _demo(directory: Path, tmp_path: Path) -> CliResult:
    done = subprocess.run(
        [sys.executable, "-m", "xla_wheels.demo", "--dir", str(directory)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
    )  # fmt: skip
    return CliResult(done.returncode, done.stdout, done.stderr)


def test_a_demo_dir_that_is_a_symlink_loop_is_bad_input(tmp_path: Path) -> None:
    loop = _loop(tmp_path / "demo")
    assert_bad_input(_demo(loop, tmp_path), "symbolic link loop")
    assert loop.is_symlink()


@pytest.mark.parametrize(
    ("name", "shown"),
    [('a"b', "'\"'"), ("a\tb", "'\\t'"), ("a\nb", "'\\n'"), ("a\\b", "'\\\\'")],
    ids=["double quote", "tab", "newline", "backslash"],
)
def test_a_demo_dir_the_demo_cannot_write_into_its_files_is_refused_up_front(
    tmp_path: Path, name: str, shown: str
) -> None:
    # `make demo DEMO_DIR='a"b'` wrote an invalid manifest; a tab or a newline failed late
    # with a fix about a file, not the path.
    result = _demo(tmp_path / name, tmp_path)
    assert_bad_input(result, "DEMO_DIR", shown, "cannot write")
    assert "no double quote, backslash, tab or line break" in result.stderr
    assert not (tmp_path / name).exists()


# --- a file where a directory is made by a given option -----------------------------------


def _gate(tmp_path: Path, *args: str) -> CliResult:
    done = subprocess.run(
        [sys.executable, "-m", "xla_host", "gate", "--device", "CPU", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
             "PYTHONPATH": str(REPO_ROOT / "host" / "src")},
    )  # fmt: skip
    return CliResult(done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("option", ["--out", "--slice-dir"])
def test_a_gate_directory_option_naming_a_file_is_bad_input(tmp_path: Path, option: str) -> None:
    file = tmp_path / "a-file"
    file.write_text("mine\n")
    cache = tmp_path / "xla-cache"
    cache.mkdir()
    slice_args = ("--worker-id", "0", "--workers", "2", "--xla-cache-dir", str(cache))
    extra = ("--out", str(tmp_path / "out"), *slice_args) if option == "--slice-dir" else ()
    result = _gate(tmp_path, option, str(file), *extra)
    assert_bad_input(result, str(file), "is a file, not a directory")
    assert file.read_text() == "mine\n"


def test_launch_env_out_naming_a_file_is_bad_input(tmp_path: Path) -> None:
    # A member the issue did not list: the same edge tells every command's directory.
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(manifest.read_text() + '\n[profiles.plain.device]\nPJRT_DEVICE = "TPU"\n')
    file = tmp_path / "a-file"
    file.write_text("mine\n")
    result = run(
        root, "launch-env", "--bundle", BUNDLE, "--profile", "plain", "--role", "reader",
        "--out", str(file),
    )  # fmt: skip
    assert_bad_input(result, str(file), "is a file, not a directory")
    assert file.read_text() == "mine\n"
