"""Bundle manifests: the real ones load, and every kind of bad manifest gets one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gitrepos import REPO_ROOT
from xla_host.errors import ManifestError, UsageError
from xla_wheels.bundle import available_bundles, diff, load_bundle, parse_manifest

VALID = """\
[bundle]
name = "demo"
python = "3.13"

[components.torch]
remote = "https://github.com/pytorch/pytorch.git"
commit = "21fec65781bebe867faf209f89bb687ffd236ca4"
version = "2.9.0a0"

[components.torch_xla]
remote = "https://github.com/pytorch/xla.git"
commit = "c04e61c"
version = "2.9.0"
patches = ["torch_xla/0001-fix.patch"]

[components.openxla]
remote = "https://github.com/openxla/xla.git"
unpinned = "nobody knows yet"

[runtime.libtpu]
minimum = "0.0.24"
preferred = "0.0.36"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "build" / "bundles").mkdir(parents=True)
    (tmp_path / "patches" / "torch_xla").mkdir(parents=True)
    (tmp_path / "patches" / "torch_xla" / "0001-fix.patch").write_text("diff --git a/x b/x\n")
    (tmp_path / "build" / "bundles" / "demo.toml").write_text(VALID)
    return tmp_path


def write(project: Path, text: str) -> None:
    (project / "build" / "bundles" / "demo.toml").write_text(text)


def error_for(project: Path, text: str) -> str:
    write(project, text)
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "demo")
    return str(caught.value)


def test_the_shipped_bundles_load_with_the_receipts_pins() -> None:
    assert available_bundles(REPO_ROOT) == ["v6e-2.11", "v6e-2.9"]
    v29 = load_bundle(REPO_ROOT, "v6e-2.9")
    assert v29.component("torch").commit == "21fec65781bebe867faf209f89bb687ffd236ca4"
    assert v29.component("torch_xla").commit == "c04e61c3424142c0eebcc9e59984b9d8fced18c0"
    # torch_xla c04e61c's own WORKSPACE pin (xla_hash), not the receipt's a76a9a858.
    assert v29.component("openxla").commit == "9a9aa0e11e4fcda8d6a9c3267dca6776ddbdb0ca"
    assert v29.python == "3.13"
    assert v29.runtime["libtpu"].specifier == ">=0.0.24"
    assert v29.runtime["libtpu"].install_version == "0.0.36"
    assert [p.relpath for p in v29.component("torch_xla").patches] == [
        "torch_xla/0001-load-serialized-executables.patch",
        "torch_xla/0002-runtime-memory-info-binding.patch",
        "torch_xla/0003-cache-key-covers-compile-options.patch",
        "torch_xla/0004-persistent-cache-atomic-write.patch",
        "torch_xla/0005-custom-call-hash-covers-attributes.patch",
    ]
    v211 = load_bundle(REPO_ROOT, "v6e-2.11")
    assert v211.component("torch_xla").patches == v29.component("torch_xla").patches
    assert v211.component("openxla").commit == "9a9aa0e11e4fcda8d6a9c3267dca6776ddbdb0ca"
    assert v211.component("torch").commit == "7afdbae"  # short, as the receipt gives it
    assert v211.unresolved_pins() == []
    assert v211.runtime["libtpu"].specifier == "==0.0.37"
    assert v211.runtime["jax"].specifier == "==0.9.0"


def test_a_valid_manifest_loads_with_short_and_unpinned_commits(project: Path) -> None:
    bundle = load_bundle(project, "demo")
    assert not bundle.component("torch_xla").is_full_sha
    assert bundle.component("torch").is_full_sha
    assert bundle.component("torch").submodules  # torch needs its submodules by default
    assert len(bundle.manifest_sha256) == 64


def test_unknown_bundle_name_lists_the_valid_names(project: Path) -> None:
    with pytest.raises(UsageError) as caught:
        load_bundle(project, "v6e-9.9")
    assert "unknown bundle 'v6e-9.9'" in str(caught.value)
    assert "demo" in str(caught.value)


def test_unknown_key_is_named_with_its_table(project: Path) -> None:
    message = error_for(
        project, VALID.replace('version = "2.9.0"\n', 'version = "2.9.0"\npatchs = []\n')
    )
    assert "demo.toml" in message
    assert "'components.torch_xla.patchs': unknown key" in message
    assert "patches" in message  # the fix lists the valid keys


def test_missing_key_is_named(project: Path) -> None:
    message = error_for(project, VALID.replace('python = "3.13"\n', ""))
    assert "'bundle.python': missing" in message


def test_missing_component_is_named(project: Path) -> None:
    text = (
        VALID.split("[components.openxla]")[0] + VALID.split('unpinned = "nobody knows yet"\n')[1]
    )
    message = error_for(project, text)
    assert "'components.openxla': missing table" in message


def test_commit_that_is_not_hex_is_refused(project: Path) -> None:
    message = error_for(project, VALID.replace('commit = "c04e61c"', 'commit = "c04e61z"'))
    assert "'components.torch_xla.commit': 'c04e61z' is not a git commit SHA" in message


def test_commit_too_short_to_be_safe_is_refused(project: Path) -> None:
    message = error_for(project, VALID.replace('commit = "c04e61c"', 'commit = "c04e"'))
    assert "is not a git commit SHA" in message


def test_missing_patch_file_is_named(project: Path) -> None:
    message = error_for(project, VALID.replace("0001-fix.patch", "0002-gone.patch"))
    assert "patches/torch_xla/0002-gone.patch does not exist" in message


def test_same_patch_twice_is_refused(project: Path) -> None:
    message = error_for(
        project,
        VALID.replace(
            '["torch_xla/0001-fix.patch"]',
            '["torch_xla/0001-fix.patch", "torch_xla/0001-fix.patch"]',
        ),
    )
    assert "listed twice" in message


def test_a_patch_listed_under_another_component_is_refused(project: Path) -> None:
    text = VALID.replace(
        'version = "2.9.0a0"\n', 'version = "2.9.0a0"\npatches = ["torch_xla/0001-fix.patch"]\n'
    )
    assert "is not in patches/torch/, the directory of the torch series" in error_for(project, text)


def test_name_must_match_the_file(project: Path) -> None:
    message = error_for(project, VALID.replace('name = "demo"', 'name = "other"'))
    assert "is 'other' but the file is demo.toml" in message


def test_commit_and_unpinned_together_are_refused(project: Path) -> None:
    text = VALID.replace('unpinned = "nobody knows yet"', 'unpinned = "x"\ncommit = "abcdef0"')
    assert "given together with 'commit'" in error_for(project, text)


def test_neither_commit_nor_unpinned_is_refused(project: Path) -> None:
    message = error_for(project, VALID.replace('unpinned = "nobody knows yet"\n', ""))
    assert "'components.openxla.commit': missing" in message


def test_wrong_type_is_named(project: Path) -> None:
    message = error_for(project, VALID.replace('python = "3.13"', "python = 3.13"))
    assert "'bundle.python': expected str" in message


def test_invalid_toml_names_the_file(project: Path) -> None:
    message = error_for(project, VALID + "this is not toml\n")
    assert "demo.toml: not valid TOML" in message


def test_diff_names_every_pin_that_differs() -> None:
    rows = {
        field: (a, b)
        for field, a, b in diff(
            load_bundle(REPO_ROOT, "v6e-2.9"), load_bundle(REPO_ROOT, "v6e-2.11")
        )
    }
    assert rows["torch.commit"] == ("21fec65781bebe867faf209f89bb687ffd236ca4", "7afdbae")
    assert "openxla.commit" not in rows  # both pin torch_xla c04e61c's own OpenXLA
    assert rows["runtime.libtpu"] == (">=0.0.24 (preferred 0.0.36)", "==0.0.37")
    assert "torch_xla.commit" not in rows


CHILD = """\
[bundle]
name = "child"
extends = "demo"
description = "demo with another OpenXLA and an exact libtpu"

[components.openxla]
commit = "a76a9a858"

[runtime.libtpu]
version = "0.0.37"
"""


def write_named(project: Path, name: str, text: str) -> None:
    (project / "build" / "bundles" / f"{name}.toml").write_text(text)


def test_a_child_bundle_overrides_only_what_it_names(project: Path) -> None:
    write_named(project, "child", CHILD)
    parent, child = load_bundle(project, "demo"), load_bundle(project, "child")
    assert child.extends == "demo" and parent.extends is None
    # The override: commit replaces the parent's `unpinned`; the runtime table is whole.
    assert child.component("openxla").commit == "a76a9a858"
    assert child.component("openxla").unpinned_reason is None
    assert child.runtime["libtpu"].specifier == "==0.0.37"
    assert child.runtime["libtpu"].preferred is None
    # Everything else is the parent's.
    assert child.python == parent.python == "3.13"
    assert child.component("torch_xla") == parent.component("torch_xla")
    assert child.component("torch") == parent.component("torch")
    assert child.description.startswith("demo with another")
    assert diff(parent, child) == [
        ("openxla.commit", "unpinned", "a76a9a858"),
        ("runtime.libtpu", ">=0.0.24 (preferred 0.0.36)", "==0.0.37"),
    ]


def test_editing_the_parent_changes_the_childs_digest(project: Path) -> None:
    write_named(project, "child", CHILD)
    before = load_bundle(project, "child").manifest_sha256
    write(project, VALID.replace('preferred = "0.0.36"', 'preferred = "0.0.35"'))
    assert load_bundle(project, "child").manifest_sha256 != before


def test_a_grandchild_resolves_through_the_chain(project: Path) -> None:
    write_named(project, "child", CHILD)
    grandchild_text = '[bundle]\nname = "grandchild"\nextends = "child"\n\n[components.torch_xla]\n'
    write_named(project, "grandchild", grandchild_text + "patches = []\n")
    # An empty list adds nothing: the series is the one inherited through the chain.
    [inherited] = load_bundle(project, "grandchild").component("torch_xla").patches
    assert (inherited.relpath, inherited.bundle) == ("torch_xla/0001-fix.patch", "demo")
    # Leaving it out takes its name.
    write_named(
        project, "grandchild", grandchild_text + 'drop_patches = ["torch_xla/0001-fix.patch"]\n'
    )
    grandchild = load_bundle(project, "grandchild")
    assert grandchild.component("openxla").commit == "a76a9a858"
    assert grandchild.component("torch_xla").patches == ()
    assert grandchild.component("torch_xla").dropped == (
        ("torch_xla/0001-fix.patch", "grandchild"),
    )
    assert grandchild.component("torch_xla").commit == "c04e61c"


def test_an_unknown_parent_is_named_with_the_valid_ones(project: Path) -> None:
    write_named(project, "child", CHILD.replace('extends = "demo"', 'extends = "dmeo"'))
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "child")
    assert caught.value.exit_code == 2
    assert "child.toml: key 'bundle.extends': unknown parent bundle 'dmeo'" in caught.value.message
    assert caught.value.fix == "extend one of: demo"


def test_bundles_that_extend_each_other_in_a_loop_are_refused(project: Path) -> None:
    write_named(project, "a", '[bundle]\nname = "a"\nextends = "b"\n')
    write_named(project, "b", '[bundle]\nname = "b"\nextends = "a"\n')
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "a")
    assert "extend each other in a loop: a -> b -> a" in caught.value.message
    write_named(project, "a", '[bundle]\nname = "a"\nextends = "a"\n')
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "a")
    assert "in a loop: a -> a" in caught.value.message


def test_a_childs_typo_is_named_in_the_childs_file(project: Path) -> None:
    write_named(project, "child", CHILD.replace('commit = "a76a9a858"', 'comit = "a76a9a858"'))
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "child")
    assert "child.toml: key 'components.openxla.comit': unknown key" in caught.value.message


def test_a_broken_parent_is_named_in_the_parents_file(project: Path) -> None:
    write_named(project, "child", CHILD)
    write(project, VALID.replace('python = "3.13"', 'python = "3"'))
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "child")
    assert "demo.toml: key 'bundle.python'" in caught.value.message


def test_the_receipt_variant_example_extends_the_shipped_bundle() -> None:
    example = REPO_ROOT / "build" / "bundles" / "examples" / "v6e-2.9-receipt-openxla.toml"
    child = parse_manifest(
        example, REPO_ROOT / "patches", bundles_root=REPO_ROOT / "build" / "bundles"
    )
    rows = {field: (a, b) for field, a, b in diff(load_bundle(REPO_ROOT, "v6e-2.9"), child)}
    assert rows == {"openxla.commit": ("9a9aa0e11e4fcda8d6a9c3267dca6776ddbdb0ca", "a76a9a858")}


def test_make_diff_of_a_child_alone_shows_what_it_changes(project: Path, run_cli) -> None:
    write_named(project, "child", CHILD)
    result = run_cli("diff", "child", root=project)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["demo", "->", "child"]
    assert lines[1].split() == ["openxla.commit", "unpinned", "->", "a76a9a858"]
    assert len(lines) == 3 and lines[2].startswith("runtime.libtpu")
    alone = run_cli("diff", "demo", root=project)
    assert alone.exit_code == 2 and "bundle demo extends no other bundle" in alone.stderr


def test_the_lock_records_a_childs_resolved_pins(project: Path) -> None:
    from xla_wheels.wheels_lock import RuntimePin, inputs_entry

    write_named(project, "child", CHILD)
    child = load_bundle(project, "child")
    entry = inputs_entry(child, {}, project)
    assert entry.manifest == "build/bundles/child.toml"
    assert entry.manifest_sha256 == child.manifest_sha256
    assert entry.components["openxla"].commit == "a76a9a858"  # the override
    assert entry.components["torch_xla"].patches[0].path == (
        "patches/torch_xla/0001-fix.patch"  # inherited
    )
    assert entry.runtime["libtpu"] == RuntimePin(specifier="==0.0.37", version="0.0.37")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("/etc/passwd", "is not a path inside patches/"),
        ("../outside.patch", "is not a path inside patches/"),
        ("torch_xla/../torch_xla/0001-fix.patch", "is not a path inside patches/"),
        ("./torch_xla/0001-fix.patch", 'fix: write "torch_xla/0001-fix.patch"'),
        ("torch_xla//0001-fix.patch", 'fix: write "torch_xla/0001-fix.patch"'),
        ("0001-fix.patch", "is not in patches/torch_xla/"),
    ],
)
def test_a_patch_is_named_one_way_inside_its_component_directory(
    project: Path, entry: str, expected: str
) -> None:
    message = error_for(project, VALID.replace('"torch_xla/0001-fix.patch"', f'"{entry}"'))
    assert expected in message


def test_the_same_patch_twice_through_dot_slash_is_refused(project: Path) -> None:
    text = VALID.replace(
        '["torch_xla/0001-fix.patch"]',
        '["torch_xla/0001-fix.patch", "./torch_xla/0001-fix.patch"]',
    )
    assert "entry 1 './torch_xla/0001-fix.patch'" in error_for(project, text)


def test_an_empty_remote_is_refused(project: Path) -> None:
    text = VALID.replace('remote = "https://github.com/openxla/xla.git"', 'remote = " "')
    assert "'components.openxla.remote': is empty" in error_for(project, text)


@pytest.mark.parametrize("stray", [".hidden.toml", "my bundle.toml", "-rf.toml", ".#demo.toml"])
def test_the_choices_offered_for_an_unknown_bundle_are_only_valid_names(
    project: Path, stray: str
) -> None:
    # "use one of" once listed files that are no bundle one could ask for.
    target = project / "build" / "bundles" / stray
    target.write_text(VALID)
    with pytest.raises(UsageError) as caught:
        load_bundle(project, "v6e-9.9")
    assert caught.value.fix == "use one of: demo"
    assert available_bundles(project) == ["demo"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('version = "2.9.0"', 'version = "2.\u0669.0"'),
        ('python = "3.13"', 'python = "3.\u0661\u0663"'),
    ],
)
def test_a_manifest_number_in_another_script_is_refused(project: Path, old: str, new: str) -> None:
    # \d matched any script's digits: "2.٩.0" was a version.
    message = error_for(project, VALID.replace(old, new, 1))
    assert new.split('"')[1] in message
