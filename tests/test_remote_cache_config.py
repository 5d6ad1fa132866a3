"""Remote compile caches as configuration and composed data.

build/builders.toml plus XLA_WHEELS_* overrides become the Bazel flags of torch_xla's
.bazelrc.user and the ccache environment of the torch recipe; the DRY_RUN plan shows
them exactly, with the redaction marker where a credential goes. The Bazel half cannot
run here (no Bazel 7, no cache server reachable): these flags are proven as data only.
The ccache half runs for real in test_remote_cache_ccache.py.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.synthetic_upstream import Synthetic, bazelrc_words
from tests.test_error_contract import BUNDLE, assert_bad_input, project_copy
from tests.test_special_files import guarded_fifo
from xla_host.errors import UsageError
from xla_host.redact import REDACTED
from xla_host.tables import MAX_FILE_BYTES
from xla_wheels.builder import recipes, remote_cache
from xla_wheels.builder.build_and_collect import compose
from xla_wheels.builder.config import BuildConfig
from xla_wheels.builder.remote_cache import (
    RemoteCache,
    RemoteCacheConfigError,
    Secret,
    load_remote_cache,
)
from xla_wheels.builder.spec import BuildSpec
from xla_wheels.bundle import load_bundle
from xla_wheels.options import PipelineOptions

REPO = Path(__file__).resolve().parents[1]
TOKEN = "tok-7d1c0ffee0123"
PASSWORD = "pw-0b5e55ed42"


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "builders.toml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str = "", **environ: str) -> RemoteCache:
    path = write_config(tmp_path, text)
    return load_remote_cache(tmp_path, {"XLA_WHEELS_BUILDERS_CONFIG": str(path), **environ})


FULL = """
[builder]
role = "reader"

[bazel]
remote_cache = "grpcs://cache.example.com:443"
remote_executor = "grpcs://rbe.example.com"
remote_instance_name = "projects/p/instances/default"

[ccache]
remote_storage = "http://ccache.example.com:8080/cache|layout=subdirs"
remote_username = "builder"
"""


def spec_with(remote: RemoteCache) -> BuildSpec:
    base = Path("/w/out/b")
    return BuildSpec(
        bundle="b", python="python3", torch_src=str(base / "src/torch"),
        torch_xla_worktree=str(base / "src/torch_xla"), torch_xla_tree=str(base / "src/torch/xla"),
        openxla_src=str(base / "src/openxla"), openxla_revision="0" * 40,
        buildenv=str(base / "buildenv"),
        logs=str(base / "logs"), torch_version="2.9.0a0", torch_xla_version="2.9.0",
        torch_stage="/c/stages/torch-x", torch_xla_stage="/c/stages/torch_xla-x", jobs=2,
        knobs={"bundle_libtpu": False, "tpuvm_mode": True, "build_cpp_tests": False, "cxx_abi": 1},
        bazel_disk_cache="/c/bazel-disk", bazel_output_root="/c/bazel-root",
        ccache_dir="/c/ccache", pip_cache_dir="/c/pip", pip_args=[], compiler_env={},
        extra_env={}, ship_env=str(base / "ship-env"), ship_out=str(base / "ship-check"),
        ship_check="true", ship_pip_args=[], pipeline_src=["/src"],
        remote_cache=remote.settings.to_dict(), private_dir=str(base / "private"),
    )  # fmt: skip


def bazel_remote_lines(spec: BuildSpec) -> list[str]:
    lines = recipes.bazelrc_user(spec).splitlines()
    return lines[lines.index("build --incompatible_strict_action_env") :]


def test_reader_gets_no_upload_and_the_header_through_a_private_rc(tmp_path: Path) -> None:
    remote = load(
        tmp_path, FULL,
        XLA_WHEELS_BAZEL_REMOTE_HEADER=f"x-buildbuddy-api-key={TOKEN}",
        XLA_WHEELS_CCACHE_REMOTE_PASSWORD=PASSWORD,
    )  # fmt: skip
    spec = spec_with(remote)
    assert bazel_remote_lines(spec) == [
        "build --incompatible_strict_action_env",
        "build --remote_cache=grpcs://cache.example.com:443",
        "build --remote_executor=grpcs://rbe.example.com",
        "build --remote_instance_name=projects/p/instances/default",
        "build --remote_upload_local_results=false",
        "try-import /w/out/b/private/bazel-remote-auth.bazelrc",
    ]
    steps = {step.title: step for step in recipes.torch_xla_steps(spec)}
    auth = steps["Bazel remote credentials (try-imported by .bazelrc.user)"]
    assert auth.action == "write-private-file"
    assert auth.render() == (
        "[write-private-file] /w/out/b/private/bazel-remote-auth.bazelrc (mode 0600): "
        f'build --remote_header=x-buildbuddy-api-key="{REDACTED}"'
    )
    torch_wheel = {step.title: step for step in recipes.torch_steps(spec)}["torch wheel"]
    env = dict(torch_wheel.env)
    assert env["CCACHE_BASEDIR"] == "/w/out/b" and env["CCACHE_NOHASHDIR"] == "1"
    assert "CCACHE_REMOTE_STORAGE" not in env  # it holds a credential: templated
    assert dict(torch_wheel.secret_env) == {
        "CCACHE_REMOTE_STORAGE": "http://builder:${ccache_remote_password}@ccache.example.com"
        ":8080/cache|layout=subdirs|read-only"
    }
    rendered = "\n".join(s.render() for s in recipes.torch_steps(spec))
    assert f"builder:{REDACTED}@ccache.example.com" in rendered
    assert TOKEN not in spec.to_json() and PASSWORD not in spec.to_json()
    assert PASSWORD not in repr(remote) and TOKEN not in f"{remote} {remote.secrets}"


def test_writer_uploads_and_no_credentials_means_no_auth_file(tmp_path: Path) -> None:
    remote = load(
        tmp_path,
        '[bazel]\nremote_cache = "http://bazel-remote.lan:9090"\n'
        '[ccache]\nremote_storage = "redis://ccache.lan"\n',
        XLA_WHEELS_BUILDER_ROLE="writer",
    )
    spec = spec_with(remote)
    assert bazel_remote_lines(spec) == [
        "build --incompatible_strict_action_env",
        "build --remote_cache=http://bazel-remote.lan:9090",
        "build --remote_upload_local_results=true",
    ]
    assert [s.action for s in recipes.torch_xla_steps(spec)].count("write-private-file") == 0
    torch_wheel = {step.title: step for step in recipes.torch_steps(spec)}["torch wheel"]
    assert dict(torch_wheel.env)["CCACHE_REMOTE_STORAGE"] == "redis://ccache.lan"
    assert torch_wheel.secret_env == ()


def test_no_remote_configured_keeps_local_caches_only(tmp_path: Path) -> None:
    remote = load_remote_cache(tmp_path, {})  # no build/builders.toml at all
    assert remote == RemoteCache()
    spec = spec_with(remote)
    assert bazel_remote_lines(spec) == ["build --incompatible_strict_action_env"]
    assert "CCACHE_REMOTE_STORAGE" not in recipes.torch_env(spec)


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    remote = load(
        tmp_path, FULL,
        XLA_WHEELS_BAZEL_REMOTE_CACHE="grpc://127.0.0.1:9092",
        XLA_WHEELS_CCACHE_REMOTE_STORAGE="redis://10.0.0.5:6379/2",
        XLA_WHEELS_CCACHE_REMOTE_USERNAME="ci",
    )  # fmt: skip
    assert remote.settings.bazel.cache == "grpc://127.0.0.1:9092"
    assert remote.settings.bazel.executor == "grpcs://rbe.example.com"  # from the file
    assert remote.settings.ccache.storage == "redis://10.0.0.5:6379/2"
    assert remote.settings.ccache.username == "ci"


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ('[bazel]\nremote_cahce = "grpc://x"\n', {}, "key 'bazel.remote_cahce': unknown key"),
        ("[builder]\nrole = 'owner'\n", {}, "role 'owner' is not one of reader, writer"),
        ('[bazel]\nremote_cache = "ftp://x"\n', {}, "is not a URL of a Bazel remote cache"),
        ('[bazel]\nremote_executor = "https://x"\n', {}, "not a URL of a Bazel remote executor"),
        ('[bazel]\nremote_instance_name = "i"\n', {}, "an instance name without a remote cache"),
        ('[ccache]\nremote_storage = "https://x"\n', {}, "not a ccache remote storage URL"),
        ('[ccache]\nremote_storage = "redis://x|read-only"\n', {}, "set by the pipeline"),
        ("[ccache]\nremote_storage = 6379\n", {}, "expected str, got int"),
        ("", {"XLA_WHEELS_CCACHE_REMOTE_PASSWORD": PASSWORD}, "but no remote storage"),
        ("", {"XLA_WHEELS_BAZEL_REMOTE_HEADER": f"A={TOKEN}"}, "but no remote cache"),
        (
            '[ccache]\nremote_storage = "http://x/c"\n',
            {"XLA_WHEELS_CCACHE_REMOTE_PASSWORD": PASSWORD},
            "basic authentication needs a user name",
        ),
        (
            '[ccache]\nremote_storage = "redis://x"\n',
            {"XLA_WHEELS_CCACHE_REMOTE_PASSWORD": f"{PASSWORD}@evil"},
            "which ccache's URL syntax cannot carry",
        ),
        (
            '[bazel]\nremote_cache = "grpc://x"\n',
            {"XLA_WHEELS_BAZEL_REMOTE_HEADER": TOKEN},
            "must be Name=Value",
        ),
        (
            '[bazel]\nremote_cache = "grpc://x"\n',
            {"XLA_WHEELS_BAZEL_REMOTE_HEADER": f'Authorization=Bearer "{TOKEN}"'},
            'the value without ", \\ or a control character',
        ),
        (
            # A line break would be a line of its own in the rc file: a Bazel flag.
            '[bazel]\nremote_cache = "grpc://x"\n',
            {"XLA_WHEELS_BAZEL_REMOTE_HEADER": f"A={TOKEN}\nbuild --run_under=/bin/evil"},
            "a control character such as a line break",
        ),
        (
            '[bazel]\nremote_cache = "grpc://x"\n',
            {"XLA_WHEELS_BAZEL_REMOTE_HEADER": f"A={TOKEN}\rbuild --run_under=/bin/evil"},
            "a control character such as a line break",
        ),
    ],
)
def test_bad_settings_stop_with_a_clear_error_and_no_secret(
    tmp_path: Path, text: str, environ: dict[str, str], expected: str
) -> None:
    with pytest.raises(RemoteCacheConfigError) as caught:
        load(tmp_path, text, **environ)
    assert caught.value.exit_code == 2
    assert expected in str(caught.value)
    assert caught.value.fix
    assert PASSWORD not in str(caught.value) and TOKEN not in str(caught.value)


def test_credentials_in_a_url_are_refused_without_echoing_them(tmp_path: Path) -> None:
    for text in (
        f'[bazel]\nremote_cache = "https://user:{TOKEN}@cache.example.com"\n',
        f'[ccache]\nremote_storage = "redis://{PASSWORD}@ccache.example.com"\n',
    ):
        with pytest.raises(RemoteCacheConfigError) as caught:
            load(tmp_path, text)
        assert "carries credentials" in str(caught.value)
        assert TOKEN not in str(caught.value) and PASSWORD not in str(caught.value)


def test_header_file_must_be_private(tmp_path: Path) -> None:
    header_file = tmp_path / "bazel-headers"
    header_file.write_text(f"# BuildBuddy\nx-buildbuddy-api-key={TOKEN}\n\nX-Team=xla\n")
    header_file.chmod(0o644)
    config = '[bazel]\nremote_cache = "grpcs://remote.buildbuddy.io"\n'
    with pytest.raises(RemoteCacheConfigError) as caught:
        load(tmp_path, config, XLA_WHEELS_BAZEL_REMOTE_HEADER_FILE=str(header_file))
    assert "other users can read it (mode 0644)" in str(caught.value)
    assert caught.value.fix == f"chmod 600 {header_file}"
    header_file.chmod(0o600)
    remote = load(tmp_path, config, XLA_WHEELS_BAZEL_REMOTE_HEADER_FILE=str(header_file))
    assert remote.settings.bazel.header_names == ("x-buildbuddy-api-key", "X-Team")
    assert remote.secret_values() == {
        "bazel_remote_header_0": TOKEN,
        "bazel_remote_header_1": "xla",
    }
    assert str(Secret(TOKEN, "x")) == REDACTED


def test_stage_keys_ignore_the_remote_caches_and_their_credentials(
    tmp_path: Path, syn: Synthetic
) -> None:
    options = PipelineOptions(syn.root, syn.cache, syn.root / "out", None, False)
    bundle = load_bundle(syn.root, "syn")
    local = BuildConfig(mode="host")
    remote = replace(
        local,
        remote_cache=load(
            tmp_path, FULL,
            XLA_WHEELS_BUILDER_ROLE="writer",
            XLA_WHEELS_BAZEL_REMOTE_HEADER=f"Authorization={TOKEN}",
            XLA_WHEELS_CCACHE_REMOTE_PASSWORD=PASSWORD,
        ),
    )  # fmt: skip
    _, local_keys = compose(options, bundle, local, syn.commits)
    spec, remote_keys = compose(options, bundle, remote, syn.commits)
    assert local_keys is not None and remote_keys == local_keys
    assert TOKEN not in spec.to_json() and PASSWORD not in spec.to_json()


def test_cli_reports_a_bad_builders_file_with_exit_2(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[bazel]\nremote_cache = "grpc//missing-colon"\n')
    result = run_cli(
        "wheels", "--bundle", "v6e-2.9", "--dry-run", "--engine", "docker", root=REPO,
        env={"HOME": str(tmp_path),
             "XLA_WHEELS_BUILDERS_CONFIG": str(config), "XLA_WHEELS_CACHE": str(tmp_path / "c")},
        timeout=120,
    )  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert f"{config}: key 'bazel.remote_cache'" in result.stderr
    assert "Traceback" not in result.stderr


def test_dry_run_shows_the_exact_flags_for_v6e_2_9(tmp_path: Path) -> None:
    config = write_config(tmp_path, FULL)
    header_file = tmp_path / "headers"
    header_file.write_text(f"Authorization=Bearer {TOKEN}\n")
    header_file.chmod(0o600)
    result = run_cli(
        "wheels", "--bundle", "v6e-2.9", "--dry-run", "--engine", "docker", root=REPO,
        timeout=120,
        env={"HOME": str(tmp_path),
             "XLA_WHEELS_CACHE": str(tmp_path / "c"), "XLA_WHEELS_BUILDERS_CONFIG": str(config),
             "XLA_WHEELS_BAZEL_REMOTE_HEADER_FILE": str(header_file),
             "XLA_WHEELS_CCACHE_REMOTE_PASSWORD": PASSWORD},
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    plan = result.stdout
    rc = " | ".join(
        [
            "build --incompatible_strict_action_env",
            "build --remote_cache=grpcs://cache.example.com:443",
            "build --remote_executor=grpcs://rbe.example.com",
            "build --remote_instance_name=projects/p/instances/default",
            "build --remote_upload_local_results=false",
            f"try-import {REPO}/out/v6e-2.9/private/bazel-remote-auth.bazelrc",
        ]
    )
    assert rc in plan
    assert f'build --remote_header=Authorization="{REDACTED}"' in plan
    assert (
        f"CCACHE_REMOTE_STORAGE='http://{REDACTED}@ccache.example.com:8080/cache"
        "|layout=subdirs|read-only'"
    ) in plan
    assert "remote caches: role reader" in plan
    assert f"--env XLA_WHEELS_SECRETS_FILE={REPO}/out/v6e-2.9/private/secrets.json" in plan
    assert TOKEN not in plan + result.stderr and PASSWORD not in plan + result.stderr


def test_a_step_gets_the_credential_and_its_log_only_the_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xla_wheels.builder import run_recipe

    monkeypatch.setenv("XLA_WHEELS_SECRETS_FILE", str(tmp_path / "secrets.json"))
    child = (
        "import os; v = os.environ['STORE']; print('store', v, len(v)); "
        "print('secrets file', os.environ.get('XLA_WHEELS_SECRETS_FILE'))"
    )
    step = recipes.Step(
        "echo", (sys.executable, "-c", child),
        secret_env=(("STORE", "redis://${ccache_remote_password}@h"),),
    )  # fmt: skip
    spec = spec_with(RemoteCache())
    log_path = tmp_path / "step.log"
    with log_path.open("w") as log_file:
        run_recipe.run_step(step, spec, log_file, log_path, {"ccache_remote_password": PASSWORD})
    text = log_path.read_text()
    # The child saw the value (its length), the log shows only the marker.
    assert f"store redis://{REDACTED}@h {len(f'redis://{PASSWORD}@h')}" in text
    assert f"STORE='redis://{REDACTED}@h'" in text  # the printed command
    assert "secrets file None" in text  # the build never learns where the file is
    assert PASSWORD not in text

    with log_path.open("w") as log_file, pytest.raises(run_recipe.StepFailed) as caught:
        run_recipe.run_step(step, spec, log_file, log_path, {})
    assert "credential 'ccache_remote_password' did not reach the builder" in str(caught.value)


@pytest.mark.parametrize(
    "value",
    ["/srv/out/openxla", "/srv/some dir é/openxla", '/a"quote', "/a\\backslash", "/x#y", "it's"],
)
def test_a_value_in_bazelrc_user_is_one_word_as_bazel_reads_it(value: str) -> None:
    line = f"build --override_repository=xla={remote_cache.rc_word(value)}"
    assert bazelrc_words(line) == ["build", f"--override_repository=xla={value}"]


def test_a_line_break_cannot_reach_bazelrc_user() -> None:
    with pytest.raises(UsageError, match="line break"):
        remote_cache.rc_word("/srv/a\nbuild --remote_executor=grpc://elsewhere")


def test_a_remote_timeout_is_written_for_bazel_and_the_flag_beats_the_environment(
    tmp_path: Path,
) -> None:
    # Bazel waits 60 s per remote call by default: a cache that stopped answering costs a
    # minute per action. BAZEL_REMOTE_TIMEOUT (one row of the settings table) shortens it.
    config = '[bazel]\nremote_cache = "grpc://cache.lan:9092"\n'
    remote = load(tmp_path, config, XLA_WHEELS_BAZEL_REMOTE_TIMEOUT="10")
    assert bazel_remote_lines(spec_with(remote)) == [
        "build --incompatible_strict_action_env",
        "build --remote_cache=grpc://cache.lan:9092",
        "build --remote_timeout=10",
        "build --remote_upload_local_results=false",
    ]
    path = write_config(tmp_path, config)
    environ = {"XLA_WHEELS_BUILDERS_CONFIG": str(path), "XLA_WHEELS_BAZEL_REMOTE_TIMEOUT": "10"}
    flag = load_remote_cache(tmp_path, environ, {"bazel_remote_timeout": 5})
    assert "build --remote_timeout=5" in bazel_remote_lines(spec_with(flag))
    # Unset: no line, Bazel's own default.
    unset = bazel_remote_lines(spec_with(load(tmp_path, config)))
    assert not any("remote_timeout" in line for line in unset)
    with pytest.raises(RemoteCacheConfigError, match="XLA_WHEELS_BAZEL_REMOTE_TIMEOUT='0'"):
        load(tmp_path, config, XLA_WHEELS_BAZEL_REMOTE_TIMEOUT="0")


def test_make_passes_the_remote_timeout_to_the_builds_only() -> None:
    import subprocess

    def dry(*argv: str) -> str:
        """The CLI command `make -n` would run (without the make context before it)."""
        out = subprocess.run(
            ["make", "-n", "--no-print-directory", *argv, "BAZEL_REMOTE_TIMEOUT=7"], cwd=REPO,
            text=True, capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"},
        ).stdout  # fmt: skip
        line = out.strip().splitlines()[-1]
        return line[line.find("-m xla_wheels") :]

    assert "--bazel-remote-timeout='7'" in dry("wheels", "BUNDLE=b")
    assert "--bazel-remote-timeout='7'" in dry("rebuild-check", "BUNDLE=b")
    assert "--bazel-remote-timeout" not in dry("lock", "BUNDLE=b")


@pytest.mark.parametrize("variable", ["HEADER_FILE", "PASSWORD_FILE"])
def test_a_credential_file_that_is_a_fifo_or_too_large_is_refused_unopened(
    tmp_path: Path, variable: str
) -> None:
    # Judged from stat: a FIFO waited for a writer forever (`wheels --dry-run` hung), and
    # /dev/zero was read until the OOM killer fired.
    config = (
        '[bazel]\nremote_cache = "grpcs://x"\n'
        if variable == "HEADER_FILE"
        else '[ccache]\nremote_storage = "redis://x"\n'
    )
    name = (
        "XLA_WHEELS_BAZEL_REMOTE_HEADER_FILE"
        if variable == "HEADER_FILE"
        else "XLA_WHEELS_CCACHE_REMOTE_PASSWORD_FILE"
    )
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(RemoteCacheConfigError, match="is a FIFO") as caught:
        load(tmp_path, config, **{name: str(fifo)})
    assert caught.value.exit_code == 2 and f"{name}={fifo}" in caught.value.message
    huge = tmp_path / "huge"
    with huge.open("wb") as handle:  # sparse: the size is there, the bytes are not
        handle.truncate(MAX_FILE_BYTES + 1)
    huge.chmod(0o600)
    with pytest.raises(RemoteCacheConfigError, match="more than a credential file may be"):
        load(tmp_path, config, **{name: str(huge)})


def test_wheels_dry_run_with_a_fifo_as_the_header_file_is_bad_input_not_a_hang(
    tmp_path: Path,
) -> None:
    # The case through the real command: `wheels --dry-run` waited on the FIFO.
    root = project_copy(tmp_path)
    with guarded_fifo(tmp_path / "headers") as guard:
        os.chmod(guard.fifo, 0o600)
        result = run_cli(
            "wheels", "--bundle", BUNDLE, "--dry-run", root=root, timeout=60,
            env={
                "XLA_WHEELS_BAZEL_REMOTE_HEADER_FILE": str(guard.fifo),
                "XLA_WHEELS_BAZEL_REMOTE_CACHE": "grpcs://cache.example.com",
            },
        )  # fmt: skip
        assert_bad_input(result, "XLA_WHEELS_BAZEL_REMOTE_HEADER_FILE=", "is a FIFO")
    assert guard.readers == 0
