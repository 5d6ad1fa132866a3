"""Who writes the persistent cache: one rule (``xla_host.cache_role``), one answer from
every command that decides it.

The rule first, as a function; then every command that uses it, run as a user runs it
(the host's ``xla-host``, the builder's ``xla-wheels``, the runtime image's entrypoint:
real processes, on a publish project of stand-in wheels and its bundle document), on
worker 3 with no flags and under each override, each asked through its cheapest
observable of the role: doctor's stamp (``--json``), the launch files' ``env.json``,
``cache fetch``'s and ``cache prune --apply``'s refusal or go-ahead, the entrypoint's
stamp. The gate's role is read from the run the gate's own argument reader composes
(both command lines' parsers), since a run of it starts torch_xla children.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    make_publish_project,
)
from xla_host import bundle_document as doc
from xla_host import cache_role
from xla_host.cache_role import READ_ONLY, ROLE_VARIABLE, WORKER, decide
from xla_host.errors import ExitCode, UsageError

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST_SRC = REPO_ROOT / "host" / "src"


# --- the rule ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "env", "role", "reason"),
    [
        (None, {WORKER: "3"}, "reader", "TPU_WORKER_ID=3"),
        (None, {WORKER: "0"}, "writer", "TPU_WORKER_ID=0"),
        (None, {}, "writer", "one process alone writes its own cache"),
        ("writer", {WORKER: "3"}, "writer", "--role writer"),
        (None, {ROLE_VARIABLE: "writer", WORKER: "3"}, "writer", "XLA_WHEELS_ROLE=writer"),
        ("reader", {ROLE_VARIABLE: "writer"}, "reader", "--role reader"),
        (None, {READ_ONLY: "1", WORKER: "0"}, "reader", "XLA_PERSISTENT_CACHE_READ_ONLY=1"),
        (None, {ROLE_VARIABLE: "reader", READ_ONLY: "1"}, "reader", "XLA_WHEELS_ROLE=reader"),
        # The switch off decides nothing: the worker number does.
        (None, {READ_ONLY: "0", WORKER: "0"}, "writer", "TPU_WORKER_ID=0"),
    ],
)
def test_the_first_line_of_the_rule_that_is_set_decides(
    flag: str | None, env: dict[str, str], role: str, reason: str
) -> None:
    decided = decide(flag, env)
    assert decided.describe() == f"{role} ({reason})"


def test_a_role_the_read_only_switch_contradicts_wins_but_is_warned() -> None:
    writer = decide("writer", {READ_ONLY: "1"})
    assert writer.role == "writer"
    assert writer.warning is not None and "XLA_PERSISTENT_CACHE_READ_ONLY=1" in writer.warning
    reader = decide(None, {WORKER: "3", READ_ONLY: "0"})
    assert reader.role == "reader"
    assert reader.warning is not None and "XLA_PERSISTENT_CACHE_READ_ONLY=0" in reader.warning
    assert decide(None, {WORKER: "3", READ_ONLY: "1"}).warning is None


@pytest.mark.parametrize(
    ("flag", "env", "named", "fix"),
    [
        ("boss", {}, "--role: 'boss'", "--role writer"),
        (
            None,
            {ROLE_VARIABLE: "x"},
            "XLA_WHEELS_ROLE (from XLA_WHEELS_ROLE): 'x'",
            "set XLA_WHEELS_ROLE=writer",
        ),
        (None, {WORKER: "abc"}, "TPU_WORKER_ID='abc'", "export TPU_WORKER_ID=N"),
        (None, {READ_ONLY: "yes"}, "XLA_PERSISTENT_CACHE_READ_ONLY='yes'", "=1"),
        # A switch of another spelling is refused even where the flag decides.
        ("writer", {READ_ONLY: "true"}, "XLA_PERSISTENT_CACHE_READ_ONLY='true'", "unset"),
    ],
)
def test_a_value_the_rule_cannot_read_is_refused_naming_it_and_a_fix(
    flag: str | None, env: dict[str, str], named: str, fix: str
) -> None:
    with pytest.raises(UsageError) as refused:
        decide(flag, env)
    assert named in refused.value.message
    assert refused.value.fix is not None and fix in refused.value.fix


def test_the_docs_state_the_rule_once_as_the_module_writes_it() -> None:
    page = (REPO_ROOT / "docs" / "on-a-tpu-host.md").read_text()
    assert cache_role.rule_markdown() in page
    elsewhere = [
        p.name
        for p in (REPO_ROOT / "docs").glob("*.md")
        if p.name != "on-a-tpu-host.md" and "reader for any other" in p.read_text()
    ]
    assert elsewhere == []


# --- every command, one answer ----------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    flag: str | None
    env: dict[str, str]
    role: str
    reason: str
    slice_refuses: bool = False
    """A gate slice refuses an explicit role its worker number contradicts."""

    @property
    def described(self) -> str:
        return f"{self.role} ({self.reason})"


SCENARIOS = [
    Scenario("worker 3, no flags", None, {WORKER: "3"}, "reader", "TPU_WORKER_ID=3"),
    Scenario("the flag", "writer", {WORKER: "3"}, "writer", "--role writer", True),
    Scenario(
        "XLA_WHEELS_ROLE",
        None,
        {WORKER: "3", ROLE_VARIABLE: "writer"},
        "writer",
        "XLA_WHEELS_ROLE=writer",
        True,
    ),  # fmt: skip
    Scenario(
        "the read-only switch on worker 0",
        None,
        {WORKER: "0", READ_ONLY: "1"},
        "reader",
        "XLA_PERSISTENT_CACHE_READ_ONLY=1",
        True,
    ),  # fmt: skip
    Scenario(
        "the read-only switch on worker 3",
        None,
        {WORKER: "3", READ_ONLY: "1"},
        "reader",
        "XLA_PERSISTENT_CACHE_READ_ONLY=1",
    ),  # fmt: skip
]


@dataclass(frozen=True)
class Project:
    root: Path
    document: Path
    sha256: str
    tmp: Path

    def host(self, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """The host's command line (or ``-m xla_host.entrypoint``), from the host sources
        only, in ``env`` and nothing of this shell."""
        module = ["-m", "xla_host"] if args[0] != "entrypoint" else ["-m", "xla_host.entrypoint"]
        rest = args if args[0] != "entrypoint" else args[1:]
        return subprocess.run(
            [sys.executable, *module, *rest], cwd=self.tmp, capture_output=True, text=True,
            timeout=300, check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": str(self.tmp), "PYTHONPATH": str(HOST_SRC),
                 **env},
        )  # fmt: skip


@pytest.fixture
def project(tmp_path: Path, fake_wheels: FakeWheels) -> Project:
    from xla_wheels.release import host_document
    from xla_wheels.release.lanes import load_config
    from xla_wheels.wheels_lock import read_lock

    root = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(
        manifest.read_text() + '\n[profiles.train.device]\nPJRT_DEVICE = "CPU"\n'
        '[profiles.train.cache]\nXLA_PERSISTENT_CACHE_PATH = "/mnt/xla-cache/{build}"\n'
    )
    (root / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n'
    )
    (root / "scripts").mkdir()  # launch-env copies its helper beside the files
    helper = Path("scripts") / "xla_launch_profile.py"
    shutil.copyfile(REPO_ROOT / helper, root / helper)
    lane = load_config(root).lane("validation")
    document = host_document.compose(root, read_lock(root / "wheels.lock"), BUNDLE, lane)
    path = tmp_path / "document.json"
    path.write_bytes(doc.dumps(document))
    return Project(root, path, doc.sha256_of(path.read_bytes()), tmp_path)


def _flag(scenario: Scenario) -> list[str]:
    return ["--role", scenario.flag] if scenario.flag else []


def _doctor_roles(project: Project, scenario: Scenario) -> dict[str, str]:
    """Both doctors' stamps (``--json``), and the reason their findings name."""
    cache = project.tmp / "cache"
    cache.mkdir(exist_ok=True)
    env = {**scenario.env, "XLA_PERSISTENT_CACHE_PATH": str(cache)}
    host = project.host(
        "doctor", "--bundle-document", str(project.document), "--bundle-sha256",
        project.sha256, "--python", sys.executable, "--json", *_flag(scenario), env=env,
    )  # fmt: skip
    builder = run_cli(
        "doctor", "--bundle", BUNDLE, "--python", sys.executable, "--json", *_flag(scenario),
        root=project.root, env=env,
    )  # fmt: skip
    roles = {}
    for name, stdout, stderr in (
        ("xla-host doctor", host.stdout, host.stderr),
        ("xla-wheels doctor", builder.stdout, builder.stderr),
    ):
        assert stdout.strip(), stderr
        assert scenario.described in stderr, stderr  # its cache role finding names how
        roles[name] = json.loads(stdout)["role"]
    return roles


def _launch_env_roles(project: Project, scenario: Scenario) -> dict[str, str]:
    out = project.tmp / "launch"
    host = project.host(
        "launch-env", "--bundle-document", str(project.document), "--bundle-sha256",
        project.sha256, "--profile", "train", "--out", str(out / "host"), *_flag(scenario),
        env=scenario.env,
    )  # fmt: skip
    builder = run_cli(
        "launch-env", "--bundle", BUNDLE, "--profile", "train", "--out", str(out / "builder"),
        *_flag(scenario), root=project.root, env=scenario.env,
    )  # fmt: skip
    roles = {}
    for name, result, code, written in (
        ("xla-host launch-env", host.stdout + host.stderr, host.returncode, out / "host"),
        ("xla-wheels launch-env", builder.output, builder.exit_code, out / "builder"),
    ):
        assert code == 0, result
        assert f"role {scenario.described}" in result, result
        document = json.loads((written / "env.json").read_text())
        expected_switch = "1" if document["role"] == "reader" else "0"
        assert document["environment"][READ_ONLY] == expected_switch
        roles[name] = document["role"]
    return roles


def _cache_roles(project: Project, scenario: Scenario) -> dict[str, str]:
    """``cache fetch`` (a reader refuses before anything is read; a writer says it writes,
    then stops at the pack that is not there) and ``cache prune --apply``."""
    into = project.tmp / "into"
    into.mkdir(exist_ok=True)
    fetch = project.host(
        "cache", "fetch", "--pack", str(project.tmp / "none.xlapack.tar"), "--into",
        str(into), "--key", str(project.tmp / "none.pem"), "--bundle", BUNDLE,
        *_flag(scenario), env=scenario.env,
    )  # fmt: skip
    prune = project.host(
        "cache", "prune", "--cache", str(into), "--apply", *_flag(scenario), env=scenario.env
    )
    roles = {}
    if "this host is a reader (" in fetch.stderr:
        assert fetch.returncode == ExitCode.BAD_INPUT
        roles["xla-host cache fetch"] = "reader"
    elif "this host is the writer (" in fetch.stderr:
        roles["xla-host cache fetch"] = "writer"
    if "this host is a reader (" in prune.stderr:
        assert prune.returncode == ExitCode.BAD_INPUT
        roles["xla-host cache prune"] = "reader"
    elif prune.returncode == 0 and "removed 0 entr(ies)" in prune.stdout:
        roles["xla-host cache prune"] = "writer"
    assert len(roles) == 2, fetch.stderr + prune.stdout + prune.stderr
    assert f"{scenario.described} of {into}" in fetch.stderr, fetch.stderr
    return roles


def _facts(project: Project) -> Path:
    """A runtime image's facts: no wheels of ours, a profile that sets the cache path."""
    facts = project.tmp / "image.json"
    facts.write_text(json.dumps({
        "bundle": BUNDLE, "lane": "validation", "wheels": [], "wheel-dir": str(project.tmp),
        "environment": {"XLA_PERSISTENT_CACHE_PATH": str(project.tmp / "cache")},
    }))  # fmt: skip
    return facts


def _entrypoint_role(project: Project, scenario: Scenario) -> dict[str, str]:
    if scenario.flag:
        return {}  # the entrypoint has no flag: XLA_WHEELS_ROLE is how a launcher says it
    ran = project.host("entrypoint", "--facts", str(_facts(project)), env=scenario.env)
    assert f"xla-wheels: cache role {scenario.described}" in ran.stderr, ran.stderr
    stamp = ran.stderr.split("xla-wheels stamp:\n", 1)[1]
    found = json.loads(stamp[: stamp.index("\n}\n") + 2])
    return {"entrypoint": found["role"]}


def _gate_role(
    parse: Callable[[list[str]], object], scenario: Scenario, tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> str:  # fmt: skip
    """The role of the run the gate's own argument reader composes, on worker N of a
    four-host slice as the TPU VM's environment names it; ``refused`` for a usage error."""
    from xla_host.gate import arguments as gate_arguments

    for name in (WORKER, ROLE_VARIABLE, READ_ONLY):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "h0,h1,h2,h3")
    for name, value in scenario.env.items():
        monkeypatch.setenv(name, value)
    args = parse([
        "gate", "--xla-cache-dir", str(tmp / "shared-cache"), "--slice-dir",
        str(tmp / "slice"), *_flag(scenario),
    ])  # fmt: skip
    try:
        config = gate_arguments.gate_config(args, Path(sys.executable), None)  # type: ignore[arg-type]
    except UsageError as refused:
        assert scenario.described in refused.message, refused.message
        return "refused"
    assert config.cache_role is not None
    assert config.cache_role.describe() == scenario.described
    return config.cache_role.role


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_command_gives_the_one_rules_answer(
    project: Project, scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xla_host.cli import build_parser as host_parser
    from xla_wheels.cli import build_parser as builder_parser

    roles = {
        **_doctor_roles(project, scenario),
        **_launch_env_roles(project, scenario),
        **_cache_roles(project, scenario),
        **_entrypoint_role(project, scenario),
    }
    assert roles == dict.fromkeys(roles, scenario.role), roles
    expected_gate = "refused" if scenario.slice_refuses else scenario.role
    for name, parse in (
        ("xla-host gate", host_parser().parse_args),
        ("xla-wheels gate", builder_parser("gate").parse_args),
    ):
        assert _gate_role(parse, scenario, project.tmp, monkeypatch) == expected_gate, name


def test_the_gate_of_one_host_takes_an_explicit_role_and_a_reader_needs_the_cache_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xla_host.cli import build_parser
    from xla_host.gate import arguments as gate_arguments

    for name in (WORKER, ROLE_VARIABLE, READ_ONLY, "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ROLE_VARIABLE, "reader")
    shared = ["--xla-cache-dir", str(tmp_path / "shared")]
    config = gate_arguments.gate_config(
        build_parser().parse_args(["gate", *shared]), Path(sys.executable), None
    )
    assert config.slice is None and config.cache_role is not None
    assert config.cache_role.describe() == "reader (XLA_WHEELS_ROLE=reader)"
    with pytest.raises(UsageError) as refused:
        gate_arguments.gate_config(build_parser().parse_args(["gate"]), Path(sys.executable), None)
    assert "reader (XLA_WHEELS_ROLE=reader)" in refused.value.message
    assert refused.value.fix is not None and "--xla-cache-dir" in refused.value.fix


def test_a_bad_role_value_is_a_usage_error_at_each_command_line(project: Project) -> None:
    for args, env, named in (
        (("launch-env", "--role", "boss"), {}, "--role: 'boss'"),
        (("doctor",), {ROLE_VARIABLE: "x"}, "XLA_WHEELS_ROLE"),
        (("doctor",), {WORKER: "abc"}, "TPU_WORKER_ID='abc'"),
        (("launch-env",), {READ_ONLY: "yes"}, "XLA_PERSISTENT_CACHE_READ_ONLY='yes'"),
    ):
        ran = project.host(
            *args, "--bundle-document", str(project.document), "--bundle-sha256",
            project.sha256, *(["--profile", "train"] if args[0] == "launch-env" else []),
            env=env,
        )  # fmt: skip
        assert ran.returncode == ExitCode.BAD_INPUT, ran.stderr
        assert named in ran.stderr and "fix:" in ran.stderr, ran.stderr
        assert "Traceback" not in ran.stderr
    entry = project.host("entrypoint", "--facts", str(_facts(project)), env={WORKER: "abc"})
    assert entry.returncode == ExitCode.BAD_INPUT, entry.stderr
    assert "TPU_WORKER_ID='abc'" in entry.stderr and "Traceback" not in entry.stderr
