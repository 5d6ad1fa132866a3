"""Launch profiles: the environment a training process starts with, declared in the bundle.

A bundle pins what is built; its ``[profiles.<name>]`` tables pin how it is launched. A
profile is grouped by purpose, one TOML table per group, each key an environment
variable and each value a string (environment values are strings; a TOML ``true`` or
``1`` would have to be spelt some way, and the spelling is what torch_xla reads)::

    [profiles.train.device]     # which runtime, how many devices, SPMD enablement
    [profiles.train.cache]      # the persistent compile cache: where (the role says how)
    [profiles.train.compiler]   # what shapes the compiled program: XLA_FLAGS, LIBTPU_INIT_ARGS
    [profiles.train.debug]      # debug switches and dumps: a training profile keeps them off

Validated at load, like the rest of the manifest (every problem a ManifestError naming
the key and the fix): an unknown group; a variable torch_xla does not read, or one kept
in another group than its own; a value that is not a string; a malformed flag string
(``XLA_FLAGS``/``LIBTPU_INIT_ARGS`` are split on single spaces by torch_xla's cache key
and by XLA, so a tab, newline or quote silently makes one flag of two); a flag given
twice (which of the two wins is XLA's parser's business, not a reviewer's); a TPU flag in
``XLA_FLAGS`` (XLA aborts on a flag it does not know: "Unknown flag in XLA_FLAGS", measured
on stock 2.9.0, so TPU flags go to ``LIBTPU_INIT_ARGS``); and in a training profile (a
name that is ``train`` or starts with ``train-``) any debug switch that is on or any dump.

The cache group names the directory only: ``XLA_PERSISTENT_CACHE_PATH`` may use
``{bundle}``, ``{profile}`` and ``{build}``. ``{build}`` is the directory name doctor's
cache contract asks for (``publish.cache_contract.directory_name``: the bundle, the full
torch_xla version with the local label that names the patch series, and the libtpu
version): torch_xla's own key (patch 0003) covers the series and libtpu's platform
version too, so this keeps stacks apart for deletion, not for correctness; it is
filled in at launch from the built wheel (``make launch-env``: wheels.lock; ``make
doctor``: the host's installed torch_xla).
Who writes is decided at launch, by the cache role rule (:mod:`xla_host.cache_role`): one
writer per cache, every other worker read-only (``XLA_PERSISTENT_CACHE_READ_ONLY=1``), so
the profile itself never sets ``XLA_PERSISTENT_CACHE_READ_ONLY``.

Inheritance (``extends``): profiles merge by name, and within a profile group by group;
a child's group replaces the parent's group as a whole, so a child can drop a setting by
restating the group without it, and never keeps half of a parent's flag set.

The digest of a profile (``sha256``) is over its resolved groups, canonical JSON: it is
what wheels.lock records, what a gate receipt records, and what promotion compares.

Standard library only, like the manifest reader that calls it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host.cache_role import READ_ONLY, ROLES
from xla_host.errors import ManifestError, UsageError
from xla_host.redact import mask_variable
from xla_host.tables import loads_json, read_regular

GROUPS = ("device", "cache", "compiler", "debug")
FLAG_STRINGS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
CACHE_PATH = "XLA_PERSISTENT_CACHE_PATH"
CACHE_READ_ONLY = READ_ONLY
#: What torch_xla c04e61c hashes into the persistent cache's key besides the graph
#: (runtime/env_hash.cpp): the ``--xla*`` tokens of the two flag strings (minus dump
#: flags) and these raw variables. A host that differs from the profile in one of these
#: compiles (or, on a build without patch 0003, may load) another program.
CACHE_KEY_VARIABLES = (
    "XLA_FLAGS",
    "LIBTPU_INIT_ARGS",
    "TPU_MEGACORE",
    "XLA_HLO_DEBUG",
    "XLA_IR_DEBUG",
)

#: Every variable a profile may set, with the group it belongs to. Each is read by torch_xla
#: (c04e61c), libtpu or XLA; a name not here is almost always a typo that would be ignored.
KNOWN_VARIABLES: Mapping[str, str] = {
    # device: which runtime and devices, and SPMD enablement
    "PJRT_DEVICE": "device",
    "XLA_USE_SPMD": "device",
    "XLA_AUTO_SPMD": "device",
    "XLA_AUTO_SPMD_MESH": "device",
    "CPU_NUM_DEVICES": "device",
    "TPU_VISIBLE_CHIPS": "device",
    "TPU_PROCESS_BOUNDS": "device",
    "TPU_CHIPS_PER_PROCESS_BOUNDS": "device",
    "TPU_PROCESS_PORT": "device",
    "XLA_COORDINATOR_PORT": "device",
    # cache: the persistent compilation cache (the role adds the read-only switch)
    CACHE_PATH: "cache",
    CACHE_READ_ONLY: "cache",
    # compiler: what shapes the compiled program and how Python values are lowered
    "XLA_FLAGS": "compiler",
    "LIBTPU_INIT_ARGS": "compiler",
    "XLA_NO_SPECIAL_SCALARS": "compiler",
    "TPU_MEGACORE": "compiler",
    "XLA_STABLEHLO_COMPILE": "compiler",
    "XLA_DISABLE_FUNCTIONALIZATION": "compiler",
    "XLA_ENABLE_PARAM_ALIASING": "compiler",
    "ENABLE_COLLECTIVE_MATMUL_IN_MP": "compiler",
    "CONVERT_SHLO_TO_SHARDY": "compiler",
    "XLA_COMPILATION_CACHE_SIZE": "compiler",
    # debug: switches and dumps (off in a training profile)
    "XLA_IR_DEBUG": "debug",
    "XLA_HLO_DEBUG": "debug",
    "PT_XLA_DEBUG": "debug",
    "PT_XLA_DEBUG_LEVEL": "debug",
    "PT_XLA_DEBUG_FILE": "debug",
    "XLA_SAVE_TENSORS_FILE": "debug",
    "XLA_SAVE_TENSORS_FMT": "debug",
    "XLA_SAVE_HLO_FILE": "debug",
    "XLA_DUMP_HLO_GRAPH": "debug",
    "XLA_DUMP_POST_OPTIMIZATIONS": "debug",
    "XLA_DUMP_FATAL_STACK": "debug",
    "XLA_METRICS_FILE": "debug",
    "TF_CPP_MIN_LOG_LEVEL": "debug",
    "TF_CPP_VMODULE": "debug",
}
#: Debug variables that write files (dumps): a training profile must not set them at all.
_DUMP_VARIABLES = frozenset(
    {
        "PT_XLA_DEBUG_FILE",
        "XLA_SAVE_TENSORS_FILE",
        "XLA_SAVE_TENSORS_FMT",
        "XLA_SAVE_HLO_FILE",
        "XLA_DUMP_HLO_GRAPH",
        "XLA_DUMP_POST_OPTIMIZATIONS",
        "XLA_METRICS_FILE",
    }
)
#: Debug switches that are harmless in training: logging verbosity.
LOG_VARIABLES = frozenset({"TF_CPP_MIN_LOG_LEVEL", "TF_CPP_VMODULE"})
_OFF = frozenset({"", "0", "false"})
_PROFILE_NAME = re.compile(r"[a-z][a-z0-9-]*")
_FLAG = re.compile(r"--[A-Za-z0-9_]+(=[^\s'\"`\\]*)?")
_PLACEHOLDERS = ("{bundle}", "{profile}", "{build}")
BUILD_PLACEHOLDER = "{build}"


@dataclass(frozen=True)
class LaunchProfile:
    name: str
    groups: Mapping[str, Mapping[str, str]]
    """group -> variable -> value, as declared (placeholders not yet expanded)."""

    @property
    def settings(self) -> dict[str, str]:
        """Every variable the profile sets, with its value as declared."""
        return {k: v for group in self.groups.values() for k, v in sorted(group.items())}

    @property
    def sha256(self) -> str:
        canonical = json.dumps(
            {g: dict(sorted(v.items())) for g, v in sorted(self.groups.items())},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def needs_build(self) -> bool:
        return BUILD_PLACEHOLDER in self.settings.get(CACHE_PATH, "")

    def environment(self, bundle: str, role: str, build: str | None = None) -> dict[str, str]:
        """What a process of ``role`` starts with: placeholders expanded (``{build}`` only
        when ``build`` is given), the role's cache mode."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {ROLES}")
        env = {
            k: v.replace("{bundle}", bundle).replace("{profile}", self.name)
            for k, v in self.settings.items()
        }
        if build is not None:
            env = {k: v.replace(BUILD_PLACEHOLDER, build) for k, v in env.items()}
        if CACHE_PATH in env:
            env[CACHE_READ_ONLY] = "1" if role == "reader" else "0"
        return dict(sorted(env.items()))


def is_training_profile(name: str) -> bool:
    return name == "train" or name.startswith("train-")


def merge_profiles(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """``[profiles]`` of a child bundle over its parent's: by profile, then group by group."""
    merged = copy.deepcopy(dict(parent))
    for name, groups in child.items():
        base = merged.get(name)
        if isinstance(groups, dict) and isinstance(base, dict):
            base.update(copy.deepcopy(groups))
        else:
            merged[name] = copy.deepcopy(groups)
    return merged


def parse_profiles(data: Any, path: Path) -> dict[str, LaunchProfile]:
    """Validate the (resolved) ``[profiles]`` table of manifest ``path``."""

    def fail(key: str, problem: str, fix: str) -> ManifestError:
        return ManifestError(f"{path}: key '{key}': {problem}", fix=fix)

    if not isinstance(data, dict):
        raise fail(
            "profiles",
            f"expected a table, got {type(data).__name__}",
            "write [profiles.<name>.<group>] tables",
        )
    profiles: dict[str, LaunchProfile] = {}
    for name, groups in data.items():
        where = f"profiles.{name}"
        if not _PROFILE_NAME.fullmatch(name):
            raise fail(
                where,
                "is not a profile name",
                'use lowercase letters, digits and "-", e.g. "train"',
            )
        if not isinstance(groups, dict) or not groups:
            raise fail(
                where,
                "expected a table of groups",
                f'add e.g. [{where}.device] with PJRT_DEVICE = "TPU"',
            )
        parsed: dict[str, dict[str, str]] = {}
        for group, variables in groups.items():
            if group not in GROUPS:
                raise fail(f"{where}.{group}", "unknown group", f"use one of: {', '.join(GROUPS)}")
            if not isinstance(variables, dict):
                raise fail(
                    f"{where}.{group}",
                    "expected a table of variables",
                    f'write [{where}.{group}] with VARIABLE = "value" lines',
                )
            parsed[group] = {
                variable: _checked_value(
                    fail, f"{where}.{group}.{variable}", name, group, variable, value
                )
                for variable, value in variables.items()
            }
        _check_flag_strings_together(fail, where, parsed)
        profiles[name] = LaunchProfile(name, parsed)
    return profiles


def _checked_value(fail: Any, key: str, profile: str, group: str, variable: str, value: Any) -> str:
    home = KNOWN_VARIABLES.get(variable)
    if home is None:
        raise fail(
            key,
            "not a variable torch_xla, XLA or libtpu reads (a typo would be silently ignored)",
            "fix the name; if torch_xla really reads it, add it to KNOWN_VARIABLES in "
            "host/src/xla_host/launch_profile.py with its group",
        )
    if home != group:
        raise fail(key, f"belongs in the {home} group", f"move it to [profiles.{profile}.{home}]")
    if not isinstance(value, str):
        raise fail(
            key,
            f"expected a string, got {type(value).__name__} {value!r}",
            f'write it as the process sees it, e.g. {variable} = "{_as_env_text(value)}"',
        )
    if "\n" in value or "\0" in value:
        raise fail(key, "contains a newline or NUL", "write the value on one line")
    if variable == CACHE_READ_ONLY:
        raise fail(
            key,
            "the read-only switch is decided by the launch role, not by the profile",
            "remove it; `make launch-env BUNDLE=<bundle> PROFILE=<profile> ROLE=writer` (one "
            "per cache) or ROLE=reader sets it",
        )
    if variable == CACHE_PATH:
        _check_cache_path(fail, key, value)
    if variable in FLAG_STRINGS:
        _check_flag_string(fail, key, profile, variable, value)
    if is_training_profile(profile):
        _check_training_debug(fail, key, profile, variable, value)
    return value


def _as_env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _check_cache_path(fail: Any, key: str, value: str) -> None:
    rest = re.sub("|".join(map(re.escape, _PLACEHOLDERS)), "", value)
    if "{" in rest or "}" in rest:
        raise fail(
            key,
            f"'{value}' has a placeholder other than {{bundle}}, {{profile}} and {{build}}",
            "use only {bundle}, {profile} and {build}",
        )
    if not value.startswith("/"):
        raise fail(
            key,
            f"'{value}' is not an absolute path (a relative one names another directory "
            "in every working directory)",
            'write an absolute path, e.g. "/mnt/xla-cache/{bundle}/{profile}"',
        )


def flag_tokens(value: str) -> list[str]:
    """The flags of a flag string, as torch_xla's cache key splits it (on single spaces)."""
    return [token for token in value.split(" ") if token]


def flag_name(token: str) -> str:
    return token.split("=", 1)[0]


def _check_flag_string(fail: Any, key: str, profile: str, variable: str, value: str) -> None:
    if value != value.strip(" ") or "  " in value:
        raise fail(
            key, f"'{value}' has leading, trailing or doubled spaces", "separate flags by one space"
        )
    seen: set[str] = set()
    for token in flag_tokens(value):
        if not _FLAG.fullmatch(token):
            raise fail(
                key,
                f"'{token}' is not a flag (torch_xla and XLA split {variable} on single spaces; "
                "tabs, quotes and backslashes are not separators)",
                "write --name=value flags separated by one space, without quotes",
            )
        name = flag_name(token)
        if name in seen:
            raise fail(key, f"flag {name} is given twice", "keep one of them")
        seen.add(name)
        if variable == "XLA_FLAGS" and name.startswith("--xla_tpu_"):
            raise fail(
                key,
                f"{name} is a TPU compiler flag; XLA aborts on it in XLA_FLAGS "
                '("Unknown flag in XLA_FLAGS")',
                "move it to LIBTPU_INIT_ARGS",
            )
        if name.startswith("--xla_dump") and is_training_profile(profile):
            raise fail(
                key,
                f"{name} dumps compiler output in a training profile",
                "remove it; dump in a debug profile",
            )


def _check_flag_strings_together(
    fail: Any, where: str, groups: Mapping[str, Mapping[str, str]]
) -> None:
    compiler = groups.get("compiler", {})
    both = [set(map(flag_name, flag_tokens(compiler.get(v, "")))) for v in FLAG_STRINGS]
    for name in sorted(both[0] & both[1]):
        raise fail(
            f"{where}.compiler",
            f"flag {name} is given in both XLA_FLAGS and LIBTPU_INIT_ARGS",
            "keep it in one of them (TPU flags in LIBTPU_INIT_ARGS)",
        )


def _check_training_debug(fail: Any, key: str, profile: str, variable: str, value: str) -> None:
    if KNOWN_VARIABLES[variable] != "debug" or variable in LOG_VARIABLES:
        return
    if variable in _DUMP_VARIABLES:
        raise fail(
            key,
            f"{variable} writes dumps; the training profile {profile} must not",
            "remove it (dump in a separate profile, e.g. [profiles.debug])",
        )
    if value.strip().lower() not in _OFF:
        raise fail(
            key,
            f"debug switch {variable}={value} is on in the training profile {profile} "
            "(it slows every step, and XLA_IR_DEBUG/XLA_HLO_DEBUG are in the cache key)",
            f'set {variable} = "0" or remove it',
        )


def diff_rows(
    left: Mapping[str, LaunchProfile], right: Mapping[str, LaunchProfile]
) -> list[tuple[str, str, str]]:
    """(``profile.<name>.<VARIABLE>``, left, right) for every setting that differs."""
    rows: list[tuple[str, str, str]] = []
    for name in sorted(set(left) | set(right)):
        if name not in left or name not in right:
            in_left, in_right = ("declared" if name in side else "-" for side in (left, right))
            rows.append((f"profile.{name}", in_left, in_right))
            continue
        a, b = left[name].settings, right[name].settings
        for variable in sorted(set(a) | set(b)):
            if a.get(variable) != b.get(variable):
                rows.append(
                    (f"profile.{name}.{variable}", a.get(variable, "-"), b.get(variable, "-"))
                )
    return rows


@dataclass(frozen=True)
class EnvDifference:
    variable: str
    kind: str
    """``missing`` (the profile sets it, the host not), ``extra`` (the host sets a variable
    a profile may set, the profile does not) or ``different``."""
    expected: str | None
    actual: str | None

    @property
    def in_cache_key(self) -> bool:
        return self.variable in CACHE_KEY_VARIABLES

    @property
    def logging_only(self) -> bool:
        """An extra logging switch: it changes what is printed, not what runs (a warning)."""
        return self.kind == "extra" and self.variable in LOG_VARIABLES

    def describe(self) -> str:
        """The difference in words, values masked as records mask them (it is printed and
        goes into the job's stamp: :func:`xla_host.redact.mask_variable`)."""
        key = " (in the compile cache's key)" if self.in_cache_key else ""
        expected = mask_variable(self.variable, self.expected or "")
        actual = mask_variable(self.variable, self.actual or "")
        if self.kind == "missing":
            return f"{self.variable} is not set; the profile sets {self.variable}={expected}{key}"
        if self.kind == "extra":
            return f"{self.variable}={actual} is set but not in the profile{key}"
        return f"{self.variable}={actual}, the profile says {expected}{key}"


def compare_environment(
    expected: Mapping[str, str], actual: Mapping[str, str]
) -> list[EnvDifference]:
    """How a host's launch environment differs from a profile's, for every variable a profile
    may set (other variables, PATH and the like, are not launch policy)."""
    differences = []
    for variable in sorted(set(KNOWN_VARIABLES) | set(expected)):
        want, have = expected.get(variable), actual.get(variable)
        if want == have:
            continue
        if want is None:
            differences.append(EnvDifference(variable, "extra", None, have))
        elif have is None:
            differences.append(EnvDifference(variable, "missing", want, None))
        elif variable in FLAG_STRINGS and sorted(flag_tokens(want)) == sorted(flag_tokens(have)):
            continue  # the same flags in another order: the same key and the same program
        else:
            differences.append(EnvDifference(variable, "different", want, have))
    return differences


def _unreadable(message: str, fix: str | None = None) -> ValueError:
    return ValueError(message)


def read_env_file(path: Path) -> dict[str, str]:
    """An environment from a file written by ``make launch-env`` (.json or .sh), or a plain
    ``KEY=value`` / ``export KEY=value`` file (values shell-quoted or bare)."""
    # A FIFO or device is refused from its stat, before it is opened; the caller reports
    # a ValueError (UnicodeDecodeError is one) as a file it cannot read.
    text = read_regular(path, _unreadable, what="environment file").decode("utf-8")
    if path.suffix == ".json":
        data = loads_json(text, source=str(path), error=_unreadable)
        env = data.get("environment", data) if isinstance(data, dict) else None
        if not isinstance(env, dict):
            raise ValueError(f"{path}: expected a JSON object of variables")
        return {str(k): str(v) for k, v in env.items()}
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export ") :]
        name, sep, raw = stripped.partition("=")
        words = shlex.split(raw) if raw else [""]
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or len(words) != 1:
            raise ValueError(f"{path}:{number}: not a NAME=value line: {line!r}")
        env[name] = words[0]
    return env


def choose(profiles: Mapping[str, LaunchProfile], name: str, bundle: str) -> LaunchProfile:
    """The profile ``name`` of ``bundle``; a missing or unknown name lists the bundle's."""
    declared = ", ".join(sorted(profiles)) or "(none: add [profiles.train.<group>] tables)"
    if not name:
        raise UsageError(
            "no launch profile given", fix=f"pass PROFILE=<name>; bundle {bundle} has: {declared}"
        )
    if name not in profiles:
        raise UsageError(
            f"bundle {bundle} has no launch profile '{name}'", fix=f"use one of: {declared}"
        )
    return profiles[name]


def launch_files(
    profile: LaunchProfile, bundle: str, role: str, build: str | None = None
) -> dict[str, str]:
    """``env.sh`` and ``env.json`` for a launcher: file name -> text."""
    env = profile.environment(bundle, role, build)
    document = {
        "bundle": bundle,
        "profile": profile.name,
        "profile_sha256": profile.sha256,
        "role": role,
        "environment": env,
        # What torch_xla hashes into the cache key (env_hash.cpp) of this environment.
        "cache_key_variables": sorted(v for v in CACHE_KEY_VARIABLES if v in env),
    }
    # A file a POSIX shell can source: every value single-quoted (shlex.quote).
    shell = [
        f"# launch profile {profile.name} of bundle {bundle}, role {role} "
        f"(sha256 {profile.sha256}); written by `make launch-env`.",
        "# Source it in the launcher before the training process starts: . ./env.sh",
        *(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())),
    ]
    return {
        "env.sh": "\n".join(shell) + "\n",
        "env.json": json.dumps(document, indent=2, sort_keys=True) + "\n",
    }
