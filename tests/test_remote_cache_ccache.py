"""Builders share the torch half's compile cache through a real remote store.

A real redis-server (Debian's) on 127.0.0.1 with a password, real ccache (Debian's
4.7), real gcc compiling the synthetic torch's C extension through the torch recipe's
compiler launcher, the real CLI in BUILD_MODE=host. Two clean builder directories with
their own local ccache directories: the first (the writer) fills the remote store, the
second (a reader) gets the object from it. A reader's miss writes nothing remotely.
The credentials reach ccache and appear nowhere in the plan, the logs or the errors.

The Bazel half (remote cache/executor for torch_xla): test_remote_cache_bazel.py runs the
composed flags through a real Bazel 4.2.3 against real BuildGrid and nginx caches.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import servers
from tests.clirunner import CliResult, run_cli
from tests.missing_tools import skipif_missing
from tests.synthetic_upstream import TORCH_C_EXTENSION, Synthetic, cli_args, make_patch
from tests.synthetic_upstream import make_synthetic as make_synthetic_upstream

PASSWORD = "Redis-pw-4f1d2c9a"
HEADER_TOKEN = "tok-9b7e55aa01"
SECRETS = (PASSWORD, HEADER_TOKEN)
HOST = ("--mode", "host", "--host-python", sys.executable)


def _missing_tools() -> str | None:
    for tool in ("redis-server", "redis-cli", "ccache", "cc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (`make container-tools` installs it as root)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "the Python headers (Python.h) are missing: no C extension can be built"
    return None


pytestmark = skipif_missing(_missing_tools())


@dataclass
class Redis:
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        # REDISCLI_AUTH keeps the password off redis-cli's command line.
        return subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            env={**os.environ, "REDISCLI_AUTH": PASSWORD},
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()

    def key_count(self) -> int:
        return int(self.cli("DBSIZE"))


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    port = servers.free_port()
    argv = [
        "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--requirepass", PASSWORD,
        "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
    ]  # fmt: skip
    server = Redis(port)

    def answers_ping() -> bool:
        try:
            return server.cli("PING") == "PONG"
        except subprocess.CalledProcessError:
            return False

    process = servers.start(
        "redis-server", argv, log=tmp_path / "redis.log", ready=answers_ping, timeout_s=10
    )
    try:
        yield server
    finally:
        servers.stop(process)


def _builder(base: Path, redis: Redis) -> Synthetic:
    """A clean builder directory: its own project root, cache (local ccache) and sources."""
    syn = make_synthetic_upstream(base, c_extension=True)
    (syn.root / "build" / "builders.toml").write_text(
        f'[ccache]\nremote_storage = "{redis.url}"\n\n'
        '[bazel]\nremote_cache = "grpcs://bazel-cache.invalid"\n'
    )
    return syn


def _run(syn: Synthetic, role: str, *extra: str, bundle: str = "syn") -> CliResult:
    return run_cli(
        *cli_args(syn, *HOST, *extra, bundle=bundle),
        timeout=600,
        env={
            "HOME": str(syn.root.parent),
            "XLA_WHEELS_BUILDER_ROLE": role,
            "XLA_WHEELS_CCACHE_REMOTE_PASSWORD": PASSWORD,
            # A value with a space, as bearer tokens are given.
            "XLA_WHEELS_BAZEL_REMOTE_HEADER": f"Authorization=Bearer {HEADER_TOKEN}",
        },
    )


def ccache_stats(syn: Synthetic) -> dict[str, int]:
    out = subprocess.run(
        ["ccache", "--print-stats"],
        env={**os.environ, "CCACHE_DIR": str(syn.cache / "ccache")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {key: int(value) for key, value in (line.split("\t") for line in out.splitlines())}


def _everything_written(syn: Synthetic) -> str:
    """Every text file the pipeline wrote for this builder (logs, spec, rc files, stage
    records, the lock), wheels and objects aside."""
    texts = []
    for top in (syn.root / "out", syn.root / "wheels.lock", syn.cache / "stages"):
        if not top.exists():
            continue
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix in (".o", ".so", ".whl", ".pyc"):
                continue
            texts.append(f"== {path}\n" + path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a credential leaked into {where}"


@pytest.mark.slow
def test_second_clean_builder_hits_the_writers_remote_ccache(tmp_path: Path, redis: Redis) -> None:
    writer = _builder(tmp_path / "builder-a", redis)
    first = _run(writer, "writer")
    assert first.exit_code == 0, first.stderr
    written = ccache_stats(writer)
    print("writer:", {k: v for k, v in written.items() if k.startswith("remote_storage")})
    assert written["remote_storage_miss"] == 1 and written["remote_storage_write"] >= 1
    assert written["remote_storage_error"] == 0, "ccache could not reach redis"
    keys_after_writer = redis.key_count()
    assert keys_after_writer >= 1

    reader = _builder(tmp_path / "builder-b", redis)
    second = _run(reader, "reader")
    assert second.exit_code == 0, second.stderr
    stats = ccache_stats(reader)
    print("reader:", {k: v for k, v in stats.items() if k.startswith("remote_storage")})
    # The object came from the remote store: nothing was in this builder's local cache.
    assert stats["remote_storage_hit"] == 1
    assert stats["remote_storage_miss"] == 0
    assert stats["local_storage_miss"] == 1 and stats["cache_miss"] == 0
    assert stats["remote_storage_error"] == 0

    # The credentials reached the build (the hit needed the redis password; the torch_xla
    # setup.py read the header from its 0600 rc file) and no text the pipeline wrote or
    # printed holds them.
    torch_log = (reader.root / "out" / "syn" / "logs" / "torch.log").read_text()
    assert f"ccache remote storage redis://<redacted>@127.0.0.1:{redis.port}|read-only" in (
        torch_log
    )
    xla_log = (reader.root / "out" / "syn" / "logs" / "torch_xla.log").read_text()
    assert 'announce_rc build --remote_header=Authorization="<redacted>"' in xla_log
    for builder, run in ((writer, first), (reader, second)):
        assert_no_secret(run.stdout + run.stderr, "the CLI's output")
        assert_no_secret(_everything_written(builder), "a file under out/")
        # The credential files lived only during the build.
        assert not list((builder.root / "out" / "syn" / "private").iterdir())

    # A reader's miss (a torch patch changes the C source) compiles locally and writes
    # nothing to the remote store.
    variant = TORCH_C_EXTENSION.replace("42", "43")
    make_patch(
        reader.upstream / "torch",
        reader.commits["torch"],
        "torch",
        "a different C extension",
        {"csrc/synthetic.c": variant.lstrip("\n")},
        reader.root / "patches" / "torch" / "0001-variant.patch",
    )
    reader.write_bundle("variant", torch_patches=("torch/0001-variant.patch",))
    third = _run(reader, "reader", bundle="variant")
    assert third.exit_code == 0, third.stderr
    after = ccache_stats(reader)
    print("reader after its miss:", {k: v for k, v in after.items() if k.startswith("remote")})
    print("redis keys after the writer:", keys_after_writer, "now:", redis.key_count())
    assert after["remote_storage_miss"] == 1 and after["remote_storage_write"] == 0
    assert redis.key_count() == keys_after_writer


def test_plan_and_errors_never_show_the_credentials(tmp_path: Path, redis: Redis) -> None:
    syn = _builder(tmp_path, redis)
    plan = _run(syn, "reader", "--dry-run")
    assert plan.exit_code == 0, plan.stderr
    assert f"CCACHE_REMOTE_STORAGE='redis://<redacted>@127.0.0.1:{redis.port}|read-only'" in (
        plan.stdout
    )
    assert 'build --remote_header=Authorization="<redacted>"' in plan.stdout
    assert_no_secret(plan.stdout + plan.stderr, "the plan")

    # An induced build failure next to the credentials: the log tail printed on stderr
    # and the log file are redacted.
    make_patch(
        syn.upstream / "torch",
        syn.commits["torch"],
        "torch",
        "break the build after the setup is echoed",
        {"setup.py": (syn.upstream / "torch" / "setup.py").read_text().replace(
            "ext_modules = []", "raise SystemExit('synthetic torch failure')", 1)},
        syn.root / "patches" / "torch" / "0001-break.patch",
    )  # fmt: skip
    syn.write_bundle("broken", torch_patches=("torch/0001-break.patch",))
    failed = _run(syn, "reader", bundle="broken")
    assert failed.exit_code == 1
    assert "synthetic torch failure" in failed.stderr
    assert "redis://<redacted>@" in failed.stderr  # the tail was shown, redacted
    assert_no_secret(failed.stdout + failed.stderr, "a failed build's output")
    assert_no_secret(_everything_written(syn), "a failed build's files")
    assert not (syn.root / "out" / "broken" / "private" / "secrets.json").exists()
