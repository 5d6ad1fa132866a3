"""Builders share the torch_xla half's compile cache: a real Bazel against real servers.

The settings are the project's own: each builder here has a ``build/builders.toml`` and
credentials in its environment, read by ``remote_cache.load_remote_cache``; its
``.bazelrc.user`` lines and its private rc file of ``--remote_header`` lines are what
``remote_cache.bazelrc_lines`` and ``remote_cache.bazel_auth_rc`` compose for the torch_xla
recipe, filled and written as the recipe does (``fill_template``, ``write_private_file``).
The workspace's ``.bazelrc`` ends as torch_xla's does (upstream's
``--noremote_upload_local_results``, then ``try-import %workspace%/.bazelrc.user``), so the
writer's upload setting must win over upstream's.

Bazel is Debian's 4.2.3 (bazel-bootstrap); the builder image uses 7.4.1, whose flags
differ as docs/building.md "Several builders" says. Servers: BuildGrid 0.4.4 (gRPC, REAPI action
cache and CAS) and nginx (HTTP, WebDAV PUT, requiring a bearer token), on loopback.
Each builder has its own checkout path and an empty output base, as a second machine
would. Remote execution needs a worker that neither PyPI nor Debian ships: its flags are
shown to reach the server only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import bazel_cache_support as support
from tests import servers
from tests.bazel_cache_support import BazelRun, Server
from tests.missing_tools import skipif_missing
from xla_wheels.builder import remote_cache
from xla_wheels.builder.recipes import Step

TOKEN = "tok-7c1e90d2b4"
HEADER_ENV = {"XLA_WHEELS_BAZEL_REMOTE_HEADER": f"Authorization=Bearer {TOKEN}"}
# The status code as a word of its own: Bazel's output also carries invocation ids, whose
# hex groups can hold "401" (one run failed on "...-bdde-401c-...").
UNAUTHORIZED = re.compile(r"(?<![\w-])401(?![\w-])")
VARIANT = "int greet() { return 42; }\nint unused() { return 7; }\n"  # a new object, a new link

pytestmark = [
    skipif_missing(support.missing_tools()),
    pytest.mark.slow,
]


@dataclass
class Area:
    """What the builders of this module share: the rule repositories and Bazel's install base."""

    base: Path
    rules: tuple[Path, Path]
    user_root: Path
    output_bases: list[tuple[Path, Path]]


@pytest.fixture(scope="module")
def area(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Area]:
    base = tmp_path_factory.mktemp("bazel-remote")
    shared = Area(base, support.write_rules(base / "rules"), base / "bazel", [])
    yield shared
    support.bazel_shutdown(shared.user_root, shared.output_bases)


@pytest.fixture(scope="module")
def buildgrid(area: Area) -> Iterator[Server]:
    directory = area.base / "buildgrid"
    directory.mkdir()
    server = support.start_buildgrid(directory)
    yield server
    servers.stop(server.process)


@pytest.fixture(scope="module")
def webdav(area: Area) -> Iterator[Server]:
    directory = area.base / "nginx"
    directory.mkdir()
    server = support.start_nginx(directory, TOKEN)
    yield server
    servers.stop(server.process)


@dataclass
class Builder:
    """One builder: its project root, its checkout of the workspace, its output base."""

    area: Area
    workspace: Path
    output_base: Path
    settings: remote_cache.RemoteCacheSettings
    rc_user: str
    """``.bazelrc.user`` as written."""
    plan: str
    """What the plan prints for it: the remote-cache line and the two file steps."""

    def build(self, *extra: str) -> BazelRun:
        run = support.bazel_build(self.workspace, self.area.user_root, self.output_base, *extra)
        print(f"{self.workspace.parent.name}: {run.seconds:.1f}s", run.output[-600:])
        return run

    def edit(self, greet: str) -> None:
        (self.workspace / "greet.cc").write_text('#include "greet.h"\n' + greet)


def make_builder(
    area: Area, name: str, toml: str, environ: dict[str, str] | None = None
) -> Builder:
    root = area.base / name
    (root / "build").mkdir(parents=True)
    workspace = support.write_workspace(root / "xla", area.rules)
    output_base = root / "output-base"
    area.output_bases.append((workspace, output_base))
    builder = Builder(area, workspace, output_base, remote_cache.RemoteCacheSettings(), "", "")
    configure(builder, toml, environ)
    return builder


def configure(builder: Builder, toml: str, environ: dict[str, str] | None = None) -> None:
    """The builder's settings, as the torch_xla recipe composes and writes them."""
    root = builder.workspace.parent
    (root / "build" / "builders.toml").write_text(toml)
    cache = remote_cache.load_remote_cache(root, environ or {})
    auth_rc = root / "private" / "bazel-remote-auth.bazelrc"
    rc_user = "\n".join(remote_cache.bazelrc_lines(cache.settings, str(auth_rc))) + "\n"
    (builder.workspace / ".bazelrc.user").write_text(rc_user)
    template = remote_cache.bazel_auth_rc(cache.settings)
    rc_path = str(builder.workspace / ".bazelrc.user")
    rc_step = Step("write .bazelrc.user", action="write-file", args=(rc_path, rc_user))
    steps = [rc_step]
    if template:
        filled = remote_cache.fill_template(template, cache.secret_values())
        remote_cache.write_private_file(auth_rc, filled)
        private = Step("credentials", action="write-private-file", args=(str(auth_rc), template))
        steps.append(private)
    builder.settings, builder.rc_user = cache.settings, rc_user
    builder.plan = "\n".join([remote_cache.describe(cache.settings), *(s.render() for s in steps)])


def toml(url: str, role: str, extra: str = "") -> str:
    if url.startswith("grpc:"):
        extra += f'remote_instance_name = "{support.INSTANCE}"\n'
    return f'[builder]\nrole = "{role}"\n\n[bazel]\nremote_cache = "{url}"\n{extra}'


def test_grpc_cache_writer_fills_it_a_clean_reader_hits_every_action_and_uploads_nothing(
    area: Area, buildgrid: Server
) -> None:
    writer = make_builder(area, "grpc-writer", toml(buildgrid.url, "writer"))
    assert "build --remote_upload_local_results=true" in writer.rc_user
    # BuildGrid answers only for its instance: the composed name reaches it.
    assert f"build --remote_instance_name={support.INSTANCE}" in writer.rc_user
    first = writer.build()
    assert first.returncode == 0, first.output
    assert first.local == 3 and first.hits == 0

    # A second machine: another checkout path, an empty output base, a reader.
    reader = make_builder(area, "grpc-reader", toml(buildgrid.url, "reader"))
    assert "build --remote_upload_local_results=false" in reader.rc_user
    second = reader.build()
    assert second.returncode == 0, second.output
    assert second.processes() == {"remote cache hit": 3, "internal": 4}

    # The reader's own change compiles locally (two misses: greet.o and the link) ...
    reader.edit(VARIANT)
    third = reader.build()
    assert third.returncode == 0, third.output
    assert third.local == 2
    # ... and is not in the server's cache: a third clean builder still misses them.
    check = make_builder(area, "grpc-check", toml(buildgrid.url, "reader"))
    check.edit(VARIANT)
    fourth = check.build()
    assert fourth.returncode == 0, fourth.output
    assert (fourth.hits, fourth.local) == (1, 2), "the reader uploaded its local results"


def test_http_cache_needs_the_header_which_reaches_the_server_and_is_never_shown(
    area: Area, webdav: Server
) -> None:
    writer = make_builder(area, "http-writer", toml(webdav.url, "writer"), HEADER_ENV)
    first = writer.build()
    assert first.returncode == 0, first.output
    assert not UNAUTHORIZED.search(first.output), "the server refused the writer: no header sent"
    stored = webdav.stored_files()
    # Three action results (ac/) and their outputs and logs (cas/).
    assert stored >= 6, f"the writer stored {stored} files"

    reader = make_builder(area, "http-reader", toml(webdav.url, "reader"), HEADER_ENV)
    second = reader.build()
    assert second.returncode == 0, second.output
    assert second.processes() == {"remote cache hit": 3, "internal": 4}
    reader.edit(VARIANT)
    third = reader.build()
    assert third.returncode == 0 and third.local == 2, third.output
    assert webdav.stored_files() == stored, "the reader uploaded its local results"

    # The token went to nginx only through the private rc file; nothing printed has it.
    for builder, runs in ((writer, [first]), (reader, [second, third])):
        assert 'build --remote_header=Authorization="<redacted>"' in builder.plan
        assert "headers Authorization (<redacted>)" in builder.plan
        shown = [builder.plan, builder.rc_user, *(run.output for run in runs)]
        assert not any(TOKEN in text for text in shown), "the credential was shown"
    assert TOKEN not in (webdav.store.parent / "access.log").read_text()  # type: ignore[union-attr]

    # Without the header the same server refuses every request: no hit, a local build.
    bare = make_builder(area, "http-bare", toml(webdav.url, "reader"))
    assert "try-import" not in bare.rc_user
    refused = bare.build()
    assert refused.returncode == 0, refused.output
    assert (refused.hits, refused.local) == (0, 3)
    assert UNAUTHORIZED.search(refused.output), refused.output


def test_a_cache_that_is_down_costs_seconds_and_says_so(area: Area) -> None:
    closed = f"127.0.0.1:{servers.free_port()}"
    builder = make_builder(area, "down", toml(f"http://{closed}", "writer"))
    # HTTP: every lookup fails at once (refused, never waited on until a timeout); Bazel
    # warns and builds locally.
    http = builder.build()
    assert http.returncode == 0, http.output
    assert (http.hits, http.local) == (0, 3)
    assert "WARNING" in http.output and "Connection refused" in http.output
    assert "timed out" not in http.output.lower()
    # gRPC: Bazel 4.2.3 asks the server's capabilities first and stops the build (exit 34)
    # when it cannot: no local fallback for a cache, but a message within seconds.
    configure(builder, toml(f"grpc://{closed}", "writer"))
    grpc = builder.build()
    assert grpc.returncode == 34, grpc.output
    assert "Failed to query remote execution capabilities" in grpc.output
    assert "DEADLINE_EXCEEDED" not in grpc.output  # refused, not waited on


def test_executor_flags_are_accepted_and_reach_the_server(area: Area, buildgrid: Server) -> None:
    executor = buildgrid.url
    builder = make_builder(
        area,
        "executor",
        toml(buildgrid.url, "reader", f'remote_executor = "{executor}"\n'),
    )
    assert f"build --remote_executor={executor}" in builder.rc_user
    run = builder.build()
    # Bazel 4.2.3 takes every composed flag and asks the server to execute; this server
    # has no execution service (BuildGrid's needs PostgreSQL and a worker), and says so.
    assert run.returncode == 34, run.output
    assert "Remote execution is not supported by the remote server" in run.output
    assert "Unrecognized option" not in run.output
