"""The dry-run plan of the sources stage and of preflight is what they execute."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.gitrepos import Upstream, git, make_project, make_upstream
from xla_wheels.builder.config import BuildConfig
from xla_wheels.builder.preflight import checks, run_checks
from xla_wheels.bundle import load_bundle
from xla_wheels.gitutil import run_git
from xla_wheels.options import PipelineOptions
from xla_wheels.pipeline import plan, run_sources
from xla_wheels.plan import PlannedCommand
from xla_wheels.sources import SourceCache

Recorded = tuple[tuple[str, ...], str | None, dict[str, str]]


class Recorder:
    """Wraps the real git executor and keeps every command it is given, in order."""

    def __init__(self) -> None:
        self.commands: list[PlannedCommand] = []

    def __call__(
        self,
        command: PlannedCommand,
        *,
        check: bool = True,
        echo: bool = False,
        input_text: str | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        return run_git(command, check=check, echo=echo, input_text=input_text, timeout=timeout)


def _torch_with_a_submodule(tmp_path: Path, upstreams: dict[str, Upstream]) -> Upstream:
    lib = make_upstream(tmp_path / "remotes", "lib")
    torch = upstreams["torch"]
    git(torch.path, "submodule", "add", "-q", lib.url, "third_party/lib")
    git(torch.path, "commit", "-q", "-m", "add submodule")
    torch.commits.append(git(torch.path, "rev-parse", "HEAD"))
    return lib


def _comparable(command: PlannedCommand) -> Recorded:
    # The note is commentary for the reader; argv, directory and environment are the command.
    return (command.argv, command.cwd, dict(command.env))


def test_the_sources_stage_executes_exactly_the_commands_the_plan_prints(
    tmp_path, upstreams
) -> None:
    lib = _torch_with_a_submodule(tmp_path, upstreams)
    project = make_project(tmp_path, upstreams)
    manifest = project / "build/bundles/test-1.toml"
    manifest.write_text(manifest.read_text().replace("submodules = false", "submodules = true", 1))
    options = PipelineOptions(
        root=project, cache_dir=tmp_path / "cache", out_dir=project / "out", mirror=None,
        dry_run=False,
    )  # fmt: skip
    bundle = load_bundle(project, "test-1")
    stages = {stage.name: stage for stage in plan(options, bundle)}
    planned = stages["sources"].commands

    recorder = Recorder()
    run_sources(options, bundle, recorder)

    # The plan's placeholders stand for what the run discovers: the submodule (from
    # .gitmodules and the tree) and the random suffix of each temporary init directory.
    lib_commit = git(lib.path, "rev-parse", "HEAD")
    cache_repo = tmp_path / "cache/sources/modules"
    module_repo = next(cache_repo.glob("*.git"))
    discovered = {
        "<module cache>": module_repo.name.removesuffix(".git"),
        "<name>": "third_party/lib",
        "<path>": "third_party/lib",
        "<url>": lib.url,
        "<commit>": lib_commit,
    }

    def concrete(command: PlannedCommand) -> Recorded:
        argv = []
        for arg in command.argv:
            for placeholder, value in discovered.items():
                arg = arg.replace(placeholder, value)
            argv.append(arg)
        return (tuple(argv), command.cwd, dict(command.env))

    def without_random_suffix(command: PlannedCommand) -> Recorded:
        argv = tuple(re.sub(r"(\.git\.)[A-Za-z0-9_]{8}$", r"\1XXXXXXXX", a) for a in command.argv)
        return (argv, command.cwd, dict(command.env))

    executed = [without_random_suffix(command) for command in recorder.commands]
    expected = [concrete(command) for command in planned]
    assert executed == expected
    # The plan names every component's worktree command; the run really produced them.
    assert len([c for c in executed if c[0][2:4] == ("worktree", "add")]) == 3
    assert (project / "out/test-1/src/torch/third_party/lib/src/runtime.cc").is_file()
    assert "<" not in " ".join(arg for command in executed for arg in command[0])


def test_preflight_comes_first_and_runs_the_checks_and_commands_the_plan_lists(
    tmp_path, upstreams
) -> None:
    project = make_project(tmp_path, upstreams)
    options = PipelineOptions(
        root=project, cache_dir=tmp_path / "cache", out_dir=project / "out", mirror=None,
        dry_run=False,
    )  # fmt: skip
    bundle = load_bundle(project, "test-1")
    config = BuildConfig(mode="host", host_tools=("git", "no-such-tool-here"), min_disk_gib=0)
    stages = plan(options, bundle, config)
    # The run order: preflight (before anything is fetched), resolve, sources, patches...
    assert [stage.name for stage in stages[:4]] == ["preflight", "resolve", "sources", "patches"]
    listed = [fact.strip().split(":")[0] for fact in stages[0].facts if fact.startswith("  ")]

    recorder = Recorder()
    found = checks(options, bundle, config, cache=SourceCache(options.source_cache, None, recorder))
    blockers = run_checks(found)
    assert listed == [check.name for check in found]
    assert "host mode: `no-such-tool-here` is not on PATH; install it" in blockers
    # Cold cache: each remote is asked, with exactly the command the plan printed (the
    # checks run in parallel threads, so the order they finish in is not the plan's).
    assert sorted(map(_comparable, recorder.commands), key=repr) == sorted(
        map(_comparable, stages[0].commands), key=repr
    )
    assert len(recorder.commands) == 3
