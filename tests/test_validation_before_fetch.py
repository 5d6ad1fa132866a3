"""Input problems are found before anything is fetched: offline, nothing written.

Each case runs the CLI (`patch`, and `wheels` in host mode) on the synthetic upstream
served through a mirror, with a source cache that does not exist yet: a run that fetched
anything would create it. The mirror is a real git server on loopback that counts what
it is asked (tests/git_http.py): a refused run asked it nothing, so the refusal came
before any fetch started, whatever the machine's load. A commit the mirror lacks is
found by asking a mirror directory for it (a server only says which refs it has), and
that refusal too leaves no fetch behind. The upstream repositories are moved away before
the run, so any other access would fail differently.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.git_http import git_http_server
from tests.gitrepos import git
from tests.synthetic_upstream import Synthetic, cli_args
from tests.test_worktree_and_lock_safety import lock_check, make_mirror

HOST = ("--mode", "host", "--host-python", sys.executable)


@pytest.fixture
def syn(syn: Synthetic) -> Synthetic:
    synthetic = syn
    make_mirror(synthetic)
    assert cli(synthetic, "lock").exit_code == 0
    # `lock` held the bundle's run lock (out/syn/.lock, gone with it); the cases start from a
    # checkout with no out/ at all, so that any directory a refused run made shows.
    shutil.rmtree(synthetic.root / "out", ignore_errors=True)
    return synthetic


def mirror_directory(syn: Synthetic) -> Path:
    return syn.root.parent / "mirror"


def cli(syn: Synthetic, stage: str, *extra: str, mirror_at: str | None = None) -> CliResult:
    """``stage`` through the mirror at ``mirror_at`` (a URL), else the mirror directory."""
    mirror = ("--mirror", mirror_at or str(mirror_directory(syn)))
    if stage == "wheels":
        args = cli_args(syn, *HOST, *mirror, *extra)
    else:
        args = [
            stage, "--bundle", "syn", "--root", str(syn.root), "--cache-dir", str(syn.cache),
            *mirror, *extra,
        ]  # fmt: skip
    return run_cli(*args, env={"HOME": str(syn.root.parent)}, timeout=120)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    if not root.exists():
        return {}
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
    }


def refused(
    syn: Synthetic, stage: str, code: int, error: str, fix: str, *, served: bool = True
) -> str:
    """Run ``stage``; assert it stops with ``error``/``fix`` before it asked the mirror
    anything (``served``: the mirror is the counting git server; else the mirror directory,
    which the run may read) and writes nothing."""
    shutil.move(syn.upstream, syn.upstream.with_name("upstream-gone"))  # the mirror only
    before = snapshot(syn.root), snapshot(syn.cache)
    with git_http_server(mirror_directory(syn)) as server:
        result = cli(syn, stage, mirror_at=server.base if served else None)
    assert result.exit_code == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    error_line = next(line for line in lines if line.startswith("error: "))
    assert error in result.stderr[result.stderr.index(error_line) :], result.stderr
    fix_line = next(line for line in lines if line.startswith("  fix: "))
    assert fix in fix_line, fix_line
    assert server.fetches == 0, server.requests  # no fetch started
    assert server.requests == [], server.requests  # nor anything else asked first
    assert (snapshot(syn.root), snapshot(syn.cache)) == before
    assert not (syn.root / "out").exists()
    assert not (syn.cache / "sources").exists()  # nothing fetched
    return result.stderr


def set_xla_patches(syn: Synthetic, *entries: str) -> None:
    syn.write_bundle(xla_patches=entries)


@pytest.mark.parametrize("stage", ["patch", "wheels"])
def test_a_bad_patch_header(syn: Synthetic, stage: str) -> None:
    patch = syn.root / "patches" / "torch_xla" / "0002-comment.patch"
    header, rest = patch.read_text().split("\n\n", 1)
    kept = [line for line in header.splitlines() if not line.startswith("Why:")]
    assert len(kept) < len(header.splitlines())  # the header had a Why line to remove
    patch.write_text("\n".join(kept) + "\n\n" + rest)
    refused(syn, stage, 2, "0002-comment.patch: header is missing Why", "every patch starts with")


@pytest.mark.parametrize(
    ("entry", "error", "fix"),
    [
        ("/etc/hosts", "entry 1 '/etc/hosts' is not a path inside patches/", "relative to"),
        ("../secrets.patch", "entry 1 '../secrets.patch' is not a path inside", "relative to"),
        ("./torch_xla/0001-load-cache.patch", "is not written the one way", 'write "torch_xla/'),
        ("openxla/0001-api.patch", "is not in patches/torch_xla/", "move the file"),
    ],
)
def test_a_bad_patch_path(syn: Synthetic, entry: str, error: str, fix: str) -> None:
    set_xla_patches(syn, "torch_xla/0001-load-cache.patch", entry)
    refused(syn, "patch", 2, error, fix)


def test_the_same_patch_twice_through_dot_slash(syn: Synthetic) -> None:
    set_xla_patches(syn, "torch_xla/0001-load-cache.patch", "./torch_xla/0001-load-cache.patch")
    refused(syn, "patch", 2, "'./torch_xla/0001-load-cache.patch'", "torch_xla/0001-load-cache")


def test_a_patch_whose_header_names_another_component(syn: Synthetic) -> None:
    patch = syn.root / "patches" / "torch_xla" / "0002-comment.patch"
    patch.write_text(patch.read_text().replace("Component: torch_xla", "Component: openxla"))
    refused(syn, "patch", 2, "header says Component: openxla", "move the file")


def test_an_empty_remote(syn: Synthetic) -> None:
    manifest = syn.bundle_path()
    text = manifest.read_text()
    manifest.write_text(text.replace(f'remote = "{syn.upstream / "openxla"}"', 'remote = ""'))
    assert manifest.read_text() != text
    refused(syn, "patch", 2, "'components.openxla.remote': is empty", "write the git URL")


def _pin_a_commit_the_mirror_lacks(syn: Synthetic) -> Path:
    """Upstream moves on, the mirror is not updated, and the bundle pins the new commit."""
    xla = syn.upstream / "xla"
    (xla / "NEWS").write_text("new\n")
    git(xla, "add", "NEWS")
    git(xla, "commit", "-q", "-m", "news")
    syn.commits["torch_xla"] = git(xla, "rev-parse", "HEAD")
    syn.write_bundle(xla_patches=())
    return xla


@pytest.mark.parametrize("stage", ["patch", "wheels"])
def test_a_commit_the_mirror_does_not_have(syn: Synthetic, stage: str) -> None:
    _pin_a_commit_the_mirror_lacks(syn)
    lacks = f"commit {syn.commits['torch_xla']} is not in the mirror"
    message = refused(syn, stage, 1, lacks, "", served=False)
    assert "remote update" in message


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"", "has lock-version None"),
        (b"\x00\xff\xfe binary \x80", "is not UTF-8 text"),
        (b"lock-version = \n", "is not valid TOML"),
        (b'lock-version = "2"\n', "has lock-version '2'"),
        (b'lock-version = "1"\n[bundles.syn]\nmanifest = 3\n', "bundles.syn.manifest"),
    ],
)
@pytest.mark.slow
def test_a_corrupt_lock_and_its_fix_that_works(syn: Synthetic, content: bytes, error: str) -> None:
    lock = syn.root / "wheels.lock"
    good = lock.read_bytes()
    lock.write_bytes(content)
    message = refused(syn, "patch", 2, error, "mv wheels.lock wheels.lock.broken")
    assert "`git checkout -- wheels.lock`" in message
    # The fix as written: move it away, then `make lock BUNDLE=<name>` for each bundle.
    shutil.move(lock, syn.root / "wheels.lock.broken")
    assert cli(syn, "lock").exit_code == 0
    assert lock.read_bytes() == good
    assert lock_check(syn).exit_code == 0


def test_git_checkout_restores_a_corrupt_lock(syn: Synthetic) -> None:
    lock = syn.root / "wheels.lock"
    git(syn.root, "init", "-q")
    git(syn.root, "add", "wheels.lock")
    git(syn.root, "commit", "-q", "-m", "lock")
    lock.write_bytes(b"\xff\xfe")
    broken = lock_check(syn)
    assert broken.exit_code == 2 and "git checkout -- wheels.lock" in broken.stderr
    git(syn.root, "checkout", "--", "wheels.lock")
    assert lock_check(syn).exit_code == 0, lock_check(syn).stderr


def test_preflight_asks_a_mirror_directory_for_the_pinned_commit(syn: Synthetic) -> None:
    """The preflight check list (which the plan prints) asks the mirror, not just pings it."""
    from xla_wheels.builder.config import BuildConfig
    from xla_wheels.builder.preflight import checks, run_checks
    from xla_wheels.bundle import load_bundle
    from xla_wheels.options import PipelineOptions

    xla = _pin_a_commit_the_mirror_lacks(syn)
    options = PipelineOptions(
        root=syn.root,
        cache_dir=syn.cache,
        out_dir=syn.root / "out",
        mirror=str(syn.root.parent / "mirror"),
        dry_run=False,
    )
    found = checks(options, load_bundle(syn.root, "syn"), BuildConfig())
    remotes = [check for check in found if check.name.startswith("remote ")]
    blockers = run_checks(remotes)
    assert blockers == [
        f"torch_xla: commit {syn.commits['torch_xla']} is not in the mirror "
        f"{syn.root.parent / 'mirror' / xla.relative_to('/')}.git (update the mirror: "
        f"`git --git-dir={syn.root.parent / 'mirror' / xla.relative_to('/')}.git remote "
        "update`, or pin a commit it has)"
    ]
