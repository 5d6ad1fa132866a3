"""The cache commands within their bounds: a lane's unsigned index is read at most one
byte past its limit; a pack's download takes no more bytes than its signed manifest
allows and ends within that manifest's deadline (before the manifest has arrived: within
the idle timeout's); a full disk under the download is the disk-fault code naming where.

Real parts: HTTP servers on loopback (a pack served fast, then dripped a byte at a time;
an index that never ends), openssl ed25519 keys, signed packs, a small tmpfs (mounting
needs root, else that test skips, saying so), ``python -m xla_host cache fetch`` in fresh
processes. No assertion is about the wall clock: the limits are made small through the
network settings (``--net-timeout``, ``--net-retries``) and the tests assert the exit
code, the message and the attempts the server saw.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.clirunner import CliResult
from tests.disk_support import MountTmpfs
from tests.servers import serving
from tests.test_cache_hardening import fetch_args, host_cli, host_env, signed_pack
from tests.test_cache_pack import cache_entry, host_python
from xla_host import cache_pack, lane_packs

__all__ = ["host_python"]  # fixtures


@dataclass
class Served:
    """What the server answers at one path: ``body`` (its first ``fast`` bytes at once,
    the rest one byte every ``drip_s`` seconds), then ``junk`` more bytes of zeros; no
    Content-Length, so only the connection's end ends the answer."""

    body: bytes
    fast: int | None = None
    drip_s: float = 0.2
    junk: int = 0
    requests: int = 0


@dataclass
class Loopback:
    port: int
    paths: dict[str, Served] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def loopback() -> Iterator[Loopback]:
    served: dict[str, Served] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            plan = served.get(self.path)
            if plan is None:
                self.send_error(404)
                return
            plan.requests += 1
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            fast = len(plan.body) if plan.fast is None else plan.fast
            try:
                self.wfile.write(plan.body[:fast])
                self.wfile.flush()
                for byte in plan.body[fast:]:
                    time.sleep(plan.drip_s)
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                left = plan.junk
                while left > 0:
                    self.wfile.write(bytes(min(left, 1 << 20)))
                    left -= 1 << 20
            except OSError:
                return  # the client hung up: what it should do past its limit

        def log_message(self, format: str, *args: object) -> None:
            return

    with serving(Handler) as server:
        yield Loopback(server.port, served)


def _manifest_end(pack: Path) -> int:
    """Where a pack's manifest member ends (its first header, then its data)."""
    import tarfile

    with tarfile.open(pack, mode="r|") as tar:
        first = tar.next()
        assert first is not None
        return first.offset_data + first.size


FAST_NET = ("--net-timeout", "1", "--net-retries", "1")


def host_cli_with_peak_memory(*args: str) -> tuple[CliResult, int]:
    """``python -m xla_host ARGS`` in a fresh process, and its peak resident memory (KiB,
    the kernel's own count for that process, from ``wait4``)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "xla_host", *args], env=host_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    # The answers are short: nothing fills a pipe before the process ends.
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.stdout is not None and process.stderr is not None
    return CliResult(process.returncode, process.stdout.read(), process.stderr.read()), int(
        usage.ru_maxrss
    )


# --- memory and disk bounds --------------------------------------------------------------


@pytest.mark.slow
def test_a_lane_index_past_its_limit_is_refused_without_reading_it_whole(
    tmp_path: Path, loopback: Loopback, host_python: Path
) -> None:
    # 256 MiB of an index: refused by its length once the reader is one byte past the
    # limit, never held whole (before, all of it was read, then its length judged).
    loopback.paths["/lane/packs/index.json"] = Served(b"", junk=256 << 20)
    made = signed_pack(tmp_path, 1)
    done, peak_kib = host_cli_with_peak_memory(
        "cache", "fetch", "--lane", loopback.url("/lane/"), "--into", str(tmp_path / "c"),
        "--key", str(made["pub"]), "--python", str(host_python), "--device", "CPU",
        "--topology", "cpu-1x1", "--net-timeout", "20", "--net-retries", "0",
    )  # fmt: skip
    assert done.exit_code == 2, done.output
    assert peak_kib < 128 * 1024, f"the fetch held {peak_kib >> 10} MiB at its peak"
    assert f"is larger than {lane_packs.MAX_INDEX_BYTES} bytes" in done.stderr, done.output
    assert "fix:" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_a_pack_download_takes_no_byte_past_what_its_signed_manifest_allows(
    tmp_path: Path, loopback: Loopback, host_python: Path
) -> None:
    made = signed_pack(tmp_path, 3)
    # The real pack, then 64 MiB more: a tar reader would stop at the pack's end blocks
    # and install it, after the spool had taken every byte the server sent.
    loopback.paths["/pack.tar"] = Served(made["pack"].read_bytes(), junk=64 << 20)
    into = tmp_path / "cache"
    base = fetch_args(made, host_python, into)
    done = host_cli(*base[:2], "--pack", loopback.url("/pack.tar"), *base[4:])
    assert done.exit_code == 1, done.output
    assert "is larger than its signed manifest allows" in done.stderr, done.output
    assert "Traceback" not in done.stderr
    assert not into.exists()  # nothing installed, no directory made


@pytest.mark.slow
def test_a_full_disk_under_a_pack_download_is_the_disk_fault_naming_the_directory(
    tmp_path: Path, loopback: Loopback, host_python: Path, tmpfs: MountTmpfs
) -> None:
    small = tmpfs("cachefs", 1 << 20)
    cold = tmp_path / "cold"
    cold.mkdir()
    for i in range(3):  # 3 MiB of entries: more than the filesystem holds
        (cold / f"{9_000_000_000_000 + i}").write_bytes(os.urandom(1 << 20))
    private, public = _keypair(tmp_path)
    from tests.test_cache_pack import manifest

    pack, _ = cache_pack.write_pack(tmp_path / "packs", cold, private, manifest())
    loopback.paths["/big.tar"] = Served(pack.read_bytes())
    into = small.path / "cache"
    done = host_cli("cache", "fetch", "--pack", loopback.url("/big.tar"), "--into", str(into),
                    "--key", str(public), "--python", str(host_python), "--device", "CPU",
                    "--topology", "cpu-1x1")  # fmt: skip
    assert done.exit_code == 10, done.output
    assert f"cannot write the pack's download in {small.path}" in done.stderr, done.output
    assert "No space left on device" in done.stderr and "--into" in done.stderr
    assert "check the pack's URL" not in done.stderr and "Traceback" not in done.stderr
    assert os.listdir(small.path) == []  # the anonymous spool went with the process


def _keypair(tmp_path: Path) -> tuple[Path, Path]:
    from tests.test_cache_pack import keypair

    return keypair(tmp_path, "big")


# --- deadlines ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fast", ["nothing", "the manifest"])
def test_a_dripping_pack_ends_at_the_deadline_its_manifest_or_the_idle_timeout_sets(
    tmp_path: Path, loopback: Loopback, host_python: Path, fast: str
) -> None:
    made = signed_pack(tmp_path, 3)
    body = made["pack"].read_bytes()
    # One byte every 0.2 s never outwaits the 1 s idle timeout; before, the deadline
    # allowed for 2 GiB at the slowest rate: hours per attempt.
    first = 0 if fast == "nothing" else _manifest_end(made["pack"])
    loopback.paths["/drip.tar"] = Served(body, fast=first, drip_s=0.2)
    into = tmp_path / "cache"
    base = fetch_args(made, host_python, into)
    done = host_cli(*base[:2], "--pack", loopback.url("/drip.tar"), *base[4:], *FAST_NET)
    assert done.exit_code == 8, done.output
    assert "the whole-transfer deadline (2 attempts)" in done.stderr, done.output
    assert f"127.0.0.1:{loopback.port} did not finish within" in done.stderr
    assert "Traceback" not in done.stderr and "fix:" in done.stderr
    assert loopback.paths["/drip.tar"].requests == 2  # the first attempt and one retry
    assert not into.exists()


# --- tracebacks: untrusted JSON, numbers out of range, a truncated pack, an immutable cache


def _tar_with_first_member(path: Path, data: bytes) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(cache_pack.MANIFEST_MEMBER)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def refused_as_bad_input(done: CliResult, *words: str) -> None:
    assert done.exit_code == 2, done.output
    assert "Traceback" not in done.stderr and "fix:" in done.stderr, done.output
    for word in words:
        assert word in done.stderr, done.output


@pytest.mark.slow
def test_deep_json_and_numbers_out_of_range_are_bad_input_never_a_traceback(
    tmp_path: Path, host_python: Path
) -> None:
    from xla_host import receipt_signing

    made = signed_pack(tmp_path, 1)
    deep = b"[" * 100_000 + b"]" * 100_000
    base = ["--key", str(made["pub"]), "--python", str(host_python), "--device", "CPU",
            "--topology", "cpu-1x1"]  # fmt: skip
    into = tmp_path / "cache"
    # A pack's first member, read before its signature is checked.
    pack = _tar_with_first_member(tmp_path / "deep.xlapack.tar", deep)
    done = host_cli("cache", "fetch", "--pack", str(pack), "--into", str(into), *base)
    refused_as_bad_input(done, "nested more than 32 levels")
    # A lane's index: deep, or a pack's size of 1e400 (an OverflowError in int()).
    lane = tmp_path / "lane"
    (lane / "packs").mkdir(parents=True)
    index = lane / "packs" / "index.json"
    for text, words in ((deep, "nested more than"), (
        b'{"index-version": 1, "packs": [{"size": 1e400}]}', "out of range")):  # fmt: skip
        index.write_bytes(text)
        done = host_cli("cache", "fetch", "--lane", str(lane), "--into", str(into), *base)
        refused_as_bad_input(done, str(index), words)
    # A signed manifest whose entry's size is 1e400.
    private = made["pub"].with_name(made["pub"].name.replace(".pub.pem", ".pem"))
    payload = json_bytes(manifest_rows(size="1e400"))
    envelope = receipt_signing.sign(payload, private, payload_type=cache_pack.PAYLOAD_TYPE)
    pack = _tar_with_first_member(tmp_path / "huge.xlapack.tar", envelope)
    done = host_cli("cache", "fetch", "--pack", str(pack), "--into", str(into), *base)
    refused_as_bad_input(done, "its manifest is not JSON")
    # --keep-run and --run files.
    record = tmp_path / "run.json"
    cache = tmp_path / "existing"
    cache.mkdir()
    huge = b'{"key-record": 1, "graphs": [{"step": 1, "module": "m", "misses": 1e400}]}'
    for text in (deep, b'{"key-record": 1, "graphs": [1]}', huge):
        record.write_bytes(text)
        refused_as_bad_input(host_cli("cache", "prune", "--cache", str(cache), "--keep-run",
                                      str(record)), str(record))  # fmt: skip
        refused_as_bad_input(host_cli("cache", "explain", "--run", str(record), "--cache",
                                      str(cache)), str(record))  # fmt: skip
    assert not into.exists()


def json_bytes(data: object) -> bytes:
    import json

    return json.dumps(data).encode().replace(b'"1e400"', b"1e400")


def manifest_rows(*, size: str) -> dict[str, object]:
    from tests.test_cache_pack import manifest

    rows = manifest().to_json()
    rows["entries"] = [{"name": "1234567890123", "size": size, "sha256": "0" * 64}]
    return rows


@pytest.mark.slow
def test_a_pack_cut_inside_its_manifest_is_refused_as_truncated(
    tmp_path: Path, host_python: Path
) -> None:
    made = signed_pack(tmp_path, 2)
    cut = tmp_path / "cut.xlapack.tar"
    cut.write_bytes(made["pack"].read_bytes()[: _manifest_end(made["pack"]) - 10])
    into = tmp_path / "cache"
    base = fetch_args(made, host_python, into)
    done = host_cli(*base[:2], "--pack", str(cut), *base[4:])
    assert done.exit_code == 1, done.output
    assert "ends inside its manifest: the pack is truncated" in done.stderr, done.output
    assert "Traceback" not in done.stderr and not into.exists()


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Path]:
    """A cache directory made immutable (``chattr +i``: no file made or removed there,
    even by root); made mutable again at the end."""
    import shutil

    cache = tmp_path / "immutable"
    cache.mkdir()
    (cache / "1111111111111111").write_bytes(cache_entry(b"old"))
    os.utime(cache / "1111111111111111", (1, 1))
    if shutil.which("chattr") is None:
        pytest.skip("chattr (e2fsprogs) is not installed")
    done = subprocess.run(["chattr", "+i", str(cache)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this filesystem takes no immutable flag: {done.stderr.strip()}")
    try:
        yield cache
    finally:
        subprocess.run(["chattr", "-i", str(cache)], check=True)


@pytest.mark.slow
def test_an_immutable_cache_directory_is_a_disk_fault_naming_it(
    tmp_path: Path, host_python: Path, immutable: Path
) -> None:
    made = signed_pack(tmp_path, 2)
    done = host_cli(*fetch_args(made, host_python, immutable))
    assert done.exit_code == 10, done.output
    assert f"cannot write {immutable}/" in done.stderr, done.output
    assert "Operation not permitted" in done.stderr and f"lsattr -d {immutable}" in done.stderr
    assert "--out" not in done.stderr and "Traceback" not in done.stderr
    done = host_cli("cache", "prune", "--cache", str(immutable), "--recent-days", "0", "--apply")
    assert done.exit_code == 10, done.output
    assert f"cannot write {immutable}/" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in immutable.iterdir()) == ["1111111111111111"]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"torch-xla": None}, "its manifest's torch-xla is null, not a non-empty string"),
        ({"device": 7}, "its manifest's device is 7, not a non-empty string"),
        (
            {"entries": [{"name": "1234567890123", "size": 1, "sha256": "0" * 64}] * 2},
            "its manifest lists entries twice: ['1234567890123']",
        ),
    ],
)
def test_a_manifest_field_of_the_wrong_kind_or_an_entry_listed_twice_is_named(
    change: dict[str, object], said: str
) -> None:
    rows = {**manifest_rows(size="1"), **change}
    with pytest.raises(cache_pack.PackFormatError) as refused:
        cache_pack.parse_manifest(json.dumps(rows).encode(), "the pack")
    assert said in refused.value.message, refused.value.message
    assert "None" not in refused.value.message and "[]" not in refused.value.message
