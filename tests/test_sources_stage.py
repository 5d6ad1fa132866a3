"""Sources stage: real git fetches into a per-machine cache, one fresh worktree per build."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.gitrepos import Upstream, git, make_project, make_upstream
from xla_host.errors import SourceError
from xla_wheels.bundle import load_bundle
from xla_wheels.sources import (
    SourceCache,
    absolute_submodule_url,
    effective_remote,
    fetch_sources,
    remote_path,
)


def test_each_component_is_checked_out_at_its_full_pinned_commit(tmp_path, upstreams) -> None:
    project = make_project(tmp_path, upstreams)
    bundle = load_bundle(project, "test-1")
    cache = SourceCache(tmp_path / "cache", mirror=None)
    sources = fetch_sources(bundle, cache, tmp_path / "out" / "src")
    for name, upstream in upstreams.items():
        assert sources[name].commit == upstream.commits[-1]
        assert git(sources[name].worktree, "rev-parse", "HEAD") == upstream.commits[-1]
        assert (sources[name].worktree / "src" / "runtime.cc").is_file()


def test_a_short_sha_resolves_to_the_full_sha(tmp_path, upstreams) -> None:
    short = upstreams["torch_xla"].commits[1][:9]
    project = make_project(tmp_path, upstreams, commits={"torch_xla": short})
    cache = SourceCache(tmp_path / "cache", mirror=None)
    sources = fetch_sources(load_bundle(project, "test-1"), cache, tmp_path / "src")
    assert sources["torch_xla"].commit == upstreams["torch_xla"].commits[1]
    assert not (sources["torch_xla"].worktree / "src" / "runtime.h").exists()  # older commit


def test_the_cache_is_reused_without_the_remote(tmp_path, upstreams) -> None:
    project = make_project(tmp_path, upstreams)
    bundle = load_bundle(project, "test-1")
    cache = SourceCache(tmp_path / "cache", mirror=None)
    fetch_sources(bundle, cache, tmp_path / "src-1")
    # The remotes vanish: a second build must still work from the cache alone.
    shutil.move(tmp_path / "remotes", tmp_path / "remotes-gone")
    sources = fetch_sources(bundle, cache, tmp_path / "src-2")
    assert sources["torch"].commit == upstreams["torch"].commits[-1]


def test_the_cache_is_bare_and_never_patched_in_place(tmp_path, upstreams) -> None:
    project = make_project(tmp_path, upstreams)
    cache = SourceCache(tmp_path / "cache", mirror=None)
    sources = fetch_sources(load_bundle(project, "test-1"), cache, tmp_path / "src")
    repo = cache.repo_for(load_bundle(project, "test-1").component("torch_xla"))
    assert git(repo, "rev-parse", "--is-bare-repository") == "true"
    assert sources["torch_xla"].worktree.resolve() != repo.resolve()


def test_an_unreachable_remote_is_a_clear_error_and_the_cache_stays_usable(
    tmp_path, upstreams
) -> None:
    project = make_project(tmp_path, upstreams)
    text = (project / "build/bundles/test-1.toml").read_text()
    broken = text.replace(upstreams["openxla"].url, str(tmp_path / "nowhere" / "openxla"))
    (project / "build/bundles/test-1.toml").write_text(broken)
    cache = SourceCache(tmp_path / "cache", mirror=None)
    with pytest.raises(SourceError) as caught:
        fetch_sources(load_bundle(project, "test-1"), cache, tmp_path / "src")
    assert "cannot fetch openxla" in caught.value.message
    assert "--mirror" in (caught.value.fix or "")
    # Fixing the manifest is enough: the half-tried cache entry does not poison the next run.
    (project / "build/bundles/test-1.toml").write_text(text)
    sources = fetch_sources(load_bundle(project, "test-1"), cache, tmp_path / "src")
    assert sources["openxla"].commit == upstreams["openxla"].commits[-1]


def test_an_unknown_commit_is_named(tmp_path, upstreams) -> None:
    project = make_project(tmp_path, upstreams, commits={"torch": "deadbeef" * 5})
    cache = SourceCache(tmp_path / "cache", mirror=None)
    with pytest.raises(SourceError) as caught:
        fetch_sources(load_bundle(project, "test-1"), cache, tmp_path / "src")
    assert f"torch commit {'deadbeef' * 5}" in caught.value.message
    assert "does not exist" in caught.value.message


def test_a_damaged_cache_is_reported_with_the_fix(tmp_path, upstreams) -> None:
    project = make_project(tmp_path, upstreams)
    bundle = load_bundle(project, "test-1")
    cache = SourceCache(tmp_path / "cache", mirror=None)
    fetch_sources(bundle, cache, tmp_path / "src")
    repo = cache.repo_for(bundle.component("torch"))
    (repo / "packed-refs.lock").write_text("")
    with pytest.raises(SourceError) as caught:
        fetch_sources(bundle, cache, tmp_path / "src")
    assert "stale packed-refs.lock" in caught.value.message
    (repo / "packed-refs.lock").unlink()
    shutil.rmtree(repo / "objects")
    with pytest.raises(SourceError) as caught:
        fetch_sources(bundle, cache, tmp_path / "src")
    assert "not a bare git repository" in caught.value.message
    assert f"rm -rf {repo}" in (caught.value.fix or "")


def test_a_worktree_with_foreign_changes_is_not_thrown_away(tmp_path, upstreams) -> None:
    project = make_project(tmp_path, upstreams)
    bundle = load_bundle(project, "test-1")
    cache = SourceCache(tmp_path / "cache", mirror=None)
    sources = fetch_sources(bundle, cache, tmp_path / "src")
    edited = sources["torch"].worktree / "README"
    edited.write_text("someone's debugging notes\n")
    with pytest.raises(SourceError) as caught:
        fetch_sources(bundle, cache, tmp_path / "src")
    assert "holds work the pipeline did not make" in caught.value.message
    assert " M README" in caught.value.message
    assert edited.read_text() == "someone's debugging notes\n"


def test_a_mirror_directory_of_bare_repositories_replaces_the_remotes(tmp_path, upstreams) -> None:
    mirror = tmp_path / "mirror"
    for name, upstream in upstreams.items():
        github_style = f"https://github.com/example/{name}.git"
        git(
            tmp_path,
            "clone",
            "-q",
            "--mirror",
            upstream.url,
            str(mirror / remote_path(github_style)),
        )
    project = make_project(tmp_path, upstreams)
    manifest = project / "build/bundles/test-1.toml"
    text = manifest.read_text()
    for name, upstream in upstreams.items():
        text = text.replace(f'"{upstream.url}"', f'"https://github.com/example/{name}.git"')
    manifest.write_text(text)
    shutil.move(tmp_path / "remotes", tmp_path / "remotes-gone")  # only the mirror is left
    sources = fetch_sources(
        load_bundle(project, "test-1"),
        SourceCache(tmp_path / "cache", str(mirror)),
        tmp_path / "src",
    )
    assert sources["torch_xla"].commit == upstreams["torch_xla"].commits[-1]


def test_a_mirror_without_the_repository_says_how_to_create_it(tmp_path) -> None:
    (tmp_path / "mirror").mkdir()
    with pytest.raises(SourceError) as caught:
        effective_remote("https://github.com/pytorch/xla.git", str(tmp_path / "mirror"))
    assert "git clone --mirror https://github.com/pytorch/xla.git" in (caught.value.fix or "")


def test_a_url_prefix_mirror_maps_owner_and_name() -> None:
    assert (
        effective_remote("https://github.com/pytorch/xla.git", "https://git.corp/mirrors/")
        == "https://git.corp/mirrors/pytorch/xla.git"
    )
    assert (
        effective_remote("git@github.com:openxla/xla", "https://git.corp/m")
        == "https://git.corp/m/openxla/xla.git"
    )


def _torch_with_nested_submodules(tmp_path: Path, upstreams) -> Upstream:
    """torch -> third_party/lib (absolute URL) -> deps/leaf (relative URL ../leaf)."""
    remotes = tmp_path / "remotes"
    leaf = make_upstream(remotes, "leaf")
    lib = make_upstream(remotes, "third_party_lib")
    git(lib.path, "submodule", "add", "-q", "../leaf", "deps/leaf")
    git(lib.path, "commit", "-q", "-m", "add nested submodule")
    torch = upstreams["torch"]
    git(torch.path, "submodule", "add", "-q", lib.url, "third_party/lib")
    git(torch.path, "commit", "-q", "-m", "add submodule")
    torch.commits.append(git(torch.path, "rev-parse", "HEAD"))
    assert leaf.path.is_dir()
    return torch


def _with_submodules(project: Path) -> None:
    manifest = project / "build/bundles/test-1.toml"
    manifest.write_text(manifest.read_text().replace("submodules = false", "submodules = true", 1))


def test_nested_submodules_are_checked_out_at_their_recorded_commits(tmp_path, upstreams) -> None:
    _torch_with_nested_submodules(tmp_path, upstreams)
    project = make_project(tmp_path, upstreams)
    _with_submodules(project)
    sources = fetch_sources(
        load_bundle(project, "test-1"), SourceCache(tmp_path / "cache", None), tmp_path / "src"
    )
    lib = sources["torch"].worktree / "third_party" / "lib"
    assert (lib / "src" / "runtime.cc").is_file()
    assert (lib / "deps" / "leaf" / "src" / "runtime.h").is_file()
    assert git(sources["torch"].worktree, "status", "--porcelain") == ""


def test_submodules_come_from_the_cache_on_the_next_build(tmp_path, upstreams) -> None:
    _torch_with_nested_submodules(tmp_path, upstreams)
    project = make_project(tmp_path, upstreams)
    _with_submodules(project)
    bundle = load_bundle(project, "test-1")
    cache = SourceCache(tmp_path / "cache", None)
    fetch_sources(bundle, cache, tmp_path / "src-1")
    # Every remote, the submodules' included, disappears: a rebuild needs none of them.
    shutil.move(tmp_path / "remotes", tmp_path / "remotes-gone")
    sources = fetch_sources(bundle, cache, tmp_path / "src-2")
    assert (sources["torch"].worktree / "third_party/lib/deps/leaf/README").is_file()


def test_a_missing_submodule_remote_is_named(tmp_path, upstreams) -> None:
    _torch_with_nested_submodules(tmp_path, upstreams)
    shutil.move(tmp_path / "remotes" / "leaf", tmp_path / "leaf-gone")
    project = make_project(tmp_path, upstreams)
    _with_submodules(project)
    with pytest.raises(SourceError) as caught:
        fetch_sources(
            load_bundle(project, "test-1"),
            SourceCache(tmp_path / "cache", None),
            tmp_path / "src",
        )
    assert "cannot fetch torch/third_party/lib/deps/leaf" in caught.value.message


def test_relative_submodule_urls_resolve_against_the_parent_remote() -> None:
    assert (
        absolute_submodule_url("../cpuinfo.git", "https://github.com/pytorch/pytorch.git")
        == "https://github.com/pytorch/cpuinfo.git"
    )
    assert absolute_submodule_url("./sub", "/srv/git/top.git") == "/srv/git/top.git/sub"
    assert absolute_submodule_url("https://x.org/a.git", "/srv/top") == "https://x.org/a.git"


def test_an_unpinned_component_refuses_to_build(tmp_path, upstreams) -> None:
    project = make_project(tmp_path, upstreams)
    manifest = project / "build/bundles/test-1.toml"
    text = manifest.read_text().replace(
        f'commit = "{upstreams["openxla"].commits[-1]}"', 'unpinned = "receipt names none"'
    )
    manifest.write_text(text)
    with pytest.raises(SourceError) as caught:
        fetch_sources(
            load_bundle(project, "test-1"), SourceCache(tmp_path / "cache", None), tmp_path / "src"
        )
    assert "openxla: no commit pinned (receipt names none)" in caught.value.message
