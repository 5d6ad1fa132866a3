"""No value a user gives ever reaches a command line as an option.

A remote, a mirror, a path, a revision or an index URL is checked for what it is where it
enters (a manifest, a setting), and every git command puts such values after ``--`` (or
``--end-of-options``), where git reads them as operands whatever they hold. Either layer
alone would stop ``remote = "--upload-pack=touch FILE"``; the tests hold each of them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT
from tests.gitrepos import git, make_project, make_upstream
from xla_host.errors import ManifestError, SourceError
from xla_host.gate import upstream_tests
from xla_host.net import DEFAULT_NETWORK
from xla_host.runner import END_OF_OPTIONS, OptionLikeArgument, after_options
from xla_host.values import check_remote
from xla_wheels import gitutil, sources
from xla_wheels.builder.config import BuildConfig
from xla_wheels.bundle import load_bundle
from xla_wheels.options import PipelineOptions
from xla_wheels.pipeline import plan
from xla_wheels.plan import PlannedCommand

HOSTILE = ("--upload-pack=touch PWNED", "-x", "--output=/tmp/x")


def _with_remote(project: Path, component_url: str, remote: str) -> None:
    manifest = project / "build" / "bundles" / "test-1.toml"
    manifest.write_text(manifest.read_text().replace(f'"{component_url}"', f'"{remote}"', 1))


# --- where values enter ------------------------------------------------------------------


def test_a_remote_that_is_an_option_is_refused_and_its_command_never_runs(
    tmp_path: Path, upstreams, run_cli
) -> None:
    marker = tmp_path / "PWNED"
    project = make_project(tmp_path, upstreams)
    _with_remote(project, upstreams["torch_xla"].url, f"--upload-pack=touch {marker}")
    result = run_cli("sources", "--bundle", "test-1", root=project)
    assert result.exit_code == 2, result.output
    assert "key 'components.torch_xla.remote'" in result.stderr
    assert "starts with '-'" in result.stderr
    assert "fix: write the git URL or path of torch_xla" in result.stderr
    assert "Traceback" not in result.output
    assert not marker.exists()
    assert not list(tmp_path.glob("PWNED*"))


@pytest.mark.parametrize(
    "remote",
    [
        "-x",
        "--upload-pack=touch PWNED",
        "ext::sh -c touch% PWNED",  # a transport that runs a program
        "fd::17",
        "ftp://example.com/xla.git",
        "https:///no-host.git",
        "ssh://-oProxyCommand=touch PWNED/x.git",
        "-oProxyCommand=x:repo.git",  # scp-like, its host an option of ssh
        "https://example.com/x.git\n--upload-pack=x",
        "   ",
    ],
)
def test_a_manifest_remote_must_be_a_url_or_a_path(tmp_path: Path, upstreams, remote) -> None:
    project = make_project(tmp_path, upstreams)
    _with_remote(project, upstreams["openxla"].url, remote.replace("\n", "\\n"))
    with pytest.raises(ManifestError) as raised:
        load_bundle(project, "test-1")
    assert "components.openxla.remote" in raised.value.message
    assert "https://github.com/openxla/xla.git" in (raised.value.fix or "")


@pytest.mark.parametrize(
    "remote",
    [
        "https://github.com/pytorch/xla.git",
        "http://127.0.0.1:8080/xla.git",
        "ssh://git@github.com/pytorch/xla.git",
        "git://mirror.example/xla.git",
        "file:///srv/mirrors/xla.git",
        "git@github.com:pytorch/xla.git",
        "/srv/some dir é/xla.git",
        "relative/xla.git",
    ],
)
def test_urls_scp_like_remotes_and_paths_are_remotes(remote: str) -> None:
    assert check_remote(remote) == remote


@pytest.mark.parametrize(
    ("setting", "value", "args"),
    [
        # Members of the class the manifest's remote is not: each reaches a command line.
        ("XLA_WHEELS_MIRROR", "--upload-pack=touch PWNED", ("sources", "--bundle", "v6e-2.9")),
        ("XLA_WHEELS_IMAGE", "--privileged", ("wheels", "--bundle", "v6e-2.9", "--dry-run")),
        ("XLA_WHEELS_INDEX_URL", "-x", ("publish", "--bundle", "v6e-2.9", "--dry-run")),
        ("XLA_WHEELS_UPLOAD_URL", "--config-file=x", ("publish", "--bundle", "v6e-2.9")),
        ("XLA_WHEELS_INDEX_URL", "ftp://h/simple/", ("verify-install", "--bundle", "v6e-2.9")),
    ],
)
def test_a_setting_that_reaches_a_command_line_is_checked_for_what_it_is(
    run_cli, setting: str, value: str, args: tuple[str, ...]
) -> None:
    result = run_cli(*args, env={setting: value})
    assert result.exit_code == 2, result.output
    assert f"{setting}" in result.stderr and "fix: give " in result.stderr
    assert "Traceback" not in result.output


# --- where values reach git ----------------------------------------------------------------


def _operands(command: PlannedCommand) -> list[str]:
    """What git reads as operands: everything after its first end of options."""
    for index, arg in enumerate(command.argv):
        if arg in END_OF_OPTIONS:
            return list(command.argv[index + 1 :])
    return []


def _assert_never_an_option(commands: list[PlannedCommand], values: list[str]) -> None:
    """Each argv element that holds one of ``values`` is an operand (after ``--``) or is
    joined to its option (``--git-dir=VALUE``, ``-c key=VALUE``), never an element alone
    before the end of options."""
    for command in commands:
        operands = _operands(command)
        for arg in command.argv:
            if any(value in arg for value in values) and arg not in operands:
                assert not any(arg.startswith(value) for value in values), command.render()


def test_every_planned_git_command_puts_the_users_values_after_the_end_of_options(
    tmp_path: Path, upstreams
) -> None:
    project = make_project(tmp_path, upstreams)
    bundle = load_bundle(project, "test-1")
    remote = str(tmp_path / "remote-MARK.git")
    commit = "abcdef1"  # short: the plan's fetch of every branch
    component = replace(bundle.component("torch"), remote=remote, commit=commit, submodules=True)
    cache = sources.SourceCache(tmp_path / "cache", mirror=None)
    worktree = tmp_path / "out dir é" / "torch"
    commands = sources.plan_commands(component, cache, worktree)
    values = [remote, commit, str(worktree)]
    _assert_never_an_option(commands, values)
    fetch = next(c for c in commands if "fetch" in c.argv)
    assert _operands(fetch)[0] == remote
    # And the composers the plan does not show: the preflight probe, a fetch by SHA.
    more = [
        sources.ls_remote_command(remote),
        sources.fetch_command(cache.root, remote, "a" * 40, full=True, network=DEFAULT_NETWORK),
        sources.worktree_remove_command(cache.root, worktree),
    ]
    _assert_never_an_option(more, [remote, str(worktree)])
    assert all(_operands(c) for c in more)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_git_command_refuses_a_value_that_could_be_read_as_an_option(
    tmp_path: Path, hostile: str
) -> None:
    repo = tmp_path / "cache.git"
    composers = [
        lambda: sources.fetch_command(repo, hostile, "a" * 40, full=True, network=DEFAULT_NETWORK),
        lambda: sources.fetch_branches_command(repo, hostile, DEFAULT_NETWORK),
        lambda: sources.ls_remote_command(hostile),
        lambda: sources.worktree_add_command(repo, tmp_path / "wt", hostile),
        lambda: sources.init_bare_command(Path(hostile)),
        lambda: sources.verify_command(repo, hostile),
        lambda: sources.has_commit_command(repo, hostile),
        lambda: sources.recorded_commit_command(tmp_path, hostile),
        lambda: gitutil.compose(
            ["rev-list"], operands=[f"{hostile}..HEAD"], end="--end-of-options"
        ),
    ]
    for compose in composers:
        with pytest.raises(OptionLikeArgument) as raised:
            compose()
        assert raised.value.exit_code == 2
        assert hostile in raised.value.message


def test_the_end_of_options_is_a_known_one() -> None:
    assert after_options("origin", "main") == ["--", "origin", "main"]
    with pytest.raises(ValueError):
        after_options("x", separator="-q")


def test_a_submodule_url_from_an_upstream_is_checked_like_a_remote(
    tmp_path: Path, upstreams
) -> None:
    # An upstream's .gitmodules is input like a manifest: its URLs are fetched.
    marker = tmp_path / "PWNED"
    lib = make_upstream(tmp_path / "remotes", "lib")
    torch = upstreams["torch"]
    git(torch.path, "submodule", "add", "-q", lib.url, "third_party/lib")
    hostile = f"--upload-pack=touch {marker}"
    git(torch.path, "config", "-f", ".gitmodules", "submodule.third_party/lib.url", hostile)
    git(torch.path, "commit", "-q", "-am", "a submodule whose URL is an option")
    torch.commits.append(git(torch.path, "rev-parse", "HEAD"))
    project = make_project(tmp_path, upstreams)
    manifest = project / "build/bundles/test-1.toml"
    manifest.write_text(manifest.read_text().replace("submodules = false", "submodules = true", 1))
    with pytest.raises(SourceError) as raised:
        sources.fetch_sources(
            load_bundle(project, "test-1"),
            sources.SourceCache(tmp_path / "cache", None),
            tmp_path / "src",
        )
    assert "submodule 'third_party/lib' has the URL" in raised.value.message
    assert "starts with '-'" in raised.value.message
    assert not marker.exists()


# --- where the pipeline writes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (("gate", "--out", ".git/gate"), {}, "--out"),
        (("bench-restart", "--out", "x/.git/objects/bench"), {}, "--out"),
        (("bundles", "--out-dir", ".git/out"), {}, "--out-dir"),
        (("bundles",), {"XLA_WHEELS_OUT": ".git/out"}, "XLA_WHEELS_OUT"),
        (("bundles",), {"XLA_WHEELS_CACHE": ".git/cache"}, "XLA_WHEELS_CACHE"),
    ],
)
def test_an_output_directory_inside_a_git_directory_is_refused(
    tmp_path: Path, run_cli, args: tuple[str, ...], env: dict[str, str], named: str
) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "build" / "bundles").mkdir(parents=True)  # a project checkout, no bundle
    result = run_cli(*args, env=env, cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert named in result.stderr and "inside a .git directory" in result.stderr
    assert "fix: " in result.stderr
    assert list((tmp_path / ".git").iterdir()) == []


@pytest.mark.parametrize("name", ["v6e-2.9", "v6e-2.11"])
def test_the_whole_plan_of_a_shipped_bundle_reads_no_value_as_an_option(
    tmp_path: Path, name: str
) -> None:
    # The plan is the objects the run executes (pipeline.plan): every git command of every
    # stage, for both shipped bundles, with the remotes and work paths a user could give.
    shipped = load_bundle(REPO_ROOT, name)
    remotes = {c: f"/srv/mirrors/MARK {c}.git" for c in shipped.components}
    bundle = replace(
        shipped,
        components={c: replace(v, remote=remotes[c]) for c, v in shipped.components.items()},
    )
    work = tmp_path / "work dir é"
    options = PipelineOptions(
        root=REPO_ROOT, cache_dir=work / "cache", out_dir=work / "out", mirror=None, dry_run=True
    )
    commands = [c for stage in plan(options, bundle, BuildConfig()) for c in stage.commands]
    git_commands = [c for c in commands if c.argv[:1] == ("git",)]
    assert any("fetch" in c.argv for c in git_commands)
    commits = [c.commit for c in bundle.components.values() if c.commit]
    _assert_never_an_option(git_commands, [*remotes.values(), *commits, str(work)])
    # The same plan with a remote that is an option: refused, never composed.
    hostile = replace(
        bundle,
        components={
            **bundle.components,
            "torch": replace(bundle.component("torch"), remote="--upload-pack=touch PWNED"),
        },
    )
    with pytest.raises(OptionLikeArgument):
        plan(options, hostile, BuildConfig())


def test_the_gates_upstream_test_file_is_read_at_a_revision_never_an_option(
    tmp_path: Path,
) -> None:
    # --upstream-tests DIR at a revision: `git show` gets the revision after
    # --end-of-options, and one that starts with '-' is refused.
    upstream = make_upstream(tmp_path, "xla")
    upstream.commit_file(upstream_tests.TEST_PATH, "x = 1\n", "the upstream test")
    assert upstream_tests.read_test_file(upstream.path / ".git", "HEAD") == "x = 1\n"
    with pytest.raises(OptionLikeArgument):
        upstream_tests.read_test_file(upstream.path / ".git", f"--output={tmp_path / 'x'}")
