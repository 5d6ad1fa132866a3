"""Who writes the persistent cache: the one rule every command decides a host's role by.

A shared cache directory has one writer; every other worker runs read-only
(``XLA_PERSISTENT_CACHE_READ_ONLY=1``). ``doctor``, the gate, ``cache fetch``/``prune``,
``launch-env`` (the host's command line and the builder's) and the runtime image's
entrypoint all ask :func:`decide`, which answers with the role and how it was decided, so
every message can say "reader (TPU_WORKER_ID=3)". :data:`RULE` is the rule's text: the
docs' copy is written from it (``make generate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from xla_host.errors import UsageError
from xla_host.settings import by_flag, env_of

WRITER = "writer"
READER = "reader"
ROLES = (WRITER, READER)
FLAG = "--role"
ROLE_VARIABLE = env_of(FLAG)  # XLA_WHEELS_ROLE: the --role row's variable
#: The rule past the flag and its variable, in a few words (the --role row's default).
DEFAULT_TEXT = by_flag(FLAG).default_text
READ_ONLY = "XLA_PERSISTENT_CACHE_READ_ONLY"
WORKER = "TPU_WORKER_ID"
#: The source of a role nothing decided: the rule's last line.
DEFAULT = "default"
#: The worker of a multi-host slice that writes the shared cache.
WRITER_WORKER = 0
#: What the read-only switch may be (torch_xla reads it as a number); empty is unset.
READ_ONLY_VALUES = ("", "0", "1")

#: The rule, in the order it is applied: what decides, and what it decides.
RULE: tuple[tuple[str, str], ...] = (
    (f"`{FLAG} writer|reader` (make: `ROLE=`)", "that role"),
    (f"`{ROLE_VARIABLE}=writer|reader`", "that role"),
    (
        f"`{READ_ONLY}=1`",
        "reader (`0` or empty decides nothing: the next line does)",
    ),
    (
        f"`{WORKER}=N` (the TPU VM sets it)",
        f"writer for worker {WRITER_WORKER}, reader for any other",
    ),
    ("none of these", "writer: one process alone writes its own cache"),
)
#: When an explicit role contradicts the read-only switch.
CONTRADICTION = (
    f"An explicit writer (`{FLAG} writer` or `{ROLE_VARIABLE}=writer`) wins over "
    f"`{READ_ONLY}=1`, but never silently: every command warns that torch_xla would run "
    f"that writer read-only, `doctor` fails its cache role check, the entrypoint refuses "
    f"the job (the writer's environment sets `{READ_ONLY}=0`), and `launch-env` writes "
    f"`{READ_ONLY}=0` for it. Likewise a reader with `{READ_ONLY}=0` set, which torch_xla "
    f"would let write: warned, failed by `doctor`, refused by the entrypoint, and "
    f"`launch-env` writes `{READ_ONLY}=1` for it."
)


@dataclass(frozen=True)
class CacheRole:
    """A host's role on its persistent cache, how it was decided, and what contradicts it."""

    role: str
    reason: str
    """What decided it, as the rule names it: ``--role``, ``TPU_WORKER_ID=3``, ..."""
    source: str
    """The line of the rule that decided: :data:`FLAG`, :data:`ROLE_VARIABLE`,
    :data:`READ_ONLY`, :data:`WORKER` or :data:`DEFAULT`."""
    warning: str | None = None
    """An explicit writer with the read-only switch on: said wherever the role is used."""

    @property
    def writer(self) -> bool:
        return self.role == WRITER

    @property
    def by_default(self) -> bool:
        """Nothing decided it: the rule's last line (a writer)."""
        return self.source == DEFAULT

    @property
    def explicit(self) -> bool:
        """Said in so many words (the flag, the role variable, the read-only switch), not
        inferred from the worker number or the default."""
        return self.source in (FLAG, ROLE_VARIABLE, READ_ONLY)

    def describe(self) -> str:
        """``reader (TPU_WORKER_ID=3)``: the role as every message names it."""
        return f"{self.role} ({self.reason})"


def _checked(value: str, where: str, fix: str) -> str:
    if value not in ROLES:
        raise UsageError(f"{where}: {value!r} is not a cache role (writer or reader)", fix=fix)
    return value


def decide(flag: str | None, env: Mapping[str, str]) -> CacheRole:
    """The role by :data:`RULE`: ``flag`` (the command's ``--role``), else ``env``'s
    ``XLA_WHEELS_ROLE``, ``XLA_PERSISTENT_CACHE_READ_ONLY``, ``TPU_WORKER_ID``, else
    writer. A value none of them may take is a :class:`UsageError` naming the variable."""
    read_only = _read_only(env)
    decided = _decided(flag, env, read_only)
    if decided.writer and read_only:
        warning = (
            f"{decided.reason} makes this host the cache writer, but {READ_ONLY}=1 makes "
            f"torch_xla run it read-only: unset {READ_ONLY} on the one writer, or make it a "
            "reader"
        )
    elif not decided.writer and env.get(READ_ONLY, "").strip() == "0":
        warning = (
            f"{decided.reason} makes this host a cache reader, but {READ_ONLY}=0 lets "
            f"torch_xla write the cache: export {READ_ONLY}=1 on every worker but the writer"
        )
    else:
        return decided
    return replace(decided, warning=warning)


def _decided(flag: str | None, env: Mapping[str, str], read_only: bool) -> CacheRole:
    explicit = None
    if flag:
        checked = _checked(
            flag, FLAG, f"pass {FLAG} writer or {FLAG} reader (make: ROLE=writer or ROLE=reader)"
        )
        explicit = CacheRole(checked, f"{FLAG} {checked}", FLAG)
    elif raw := env.get(ROLE_VARIABLE, "").strip():
        # As the settings cascade names a variable's bad value: the flag it stands for too.
        checked = _checked(
            raw, f"{FLAG} / {ROLE_VARIABLE} (from {ROLE_VARIABLE})",
            f"set {ROLE_VARIABLE}=writer, or unset it (reader: {ROLE_VARIABLE}=reader)",
        )  # fmt: skip
        explicit = CacheRole(checked, f"{ROLE_VARIABLE}={checked}", ROLE_VARIABLE)
    if explicit is not None:
        return explicit
    if read_only:
        return CacheRole(READER, f"{READ_ONLY}=1", READ_ONLY)
    worker = env.get(WORKER, "").strip()
    if worker:
        if not worker.isdigit():
            raise UsageError(
                f"{WORKER}={worker!r} is not a worker number",
                fix=f"export {WORKER}=N (0 for the writer), or pass {FLAG} writer|reader",
            )
        return of_worker(int(worker))
    return of_worker(None)


def of_worker(worker: int | None, reason: str | None = None) -> CacheRole:
    """The rule's last two lines for a worker number (``reason``: where it is from, by
    default ``TPU_WORKER_ID=N``); None: no worker, a writer by default."""
    if worker is None:
        return CacheRole(WRITER, "one process alone writes its own cache", DEFAULT)
    role = WRITER if worker == WRITER_WORKER else READER
    return CacheRole(role, reason or f"{WORKER}={worker}", WORKER)


def _read_only(env: Mapping[str, str]) -> bool:
    value = env.get(READ_ONLY, "").strip()
    if value not in READ_ONLY_VALUES:
        raise UsageError(
            f"{READ_ONLY}={value!r} is neither 0 nor 1 (torch_xla would not read it as meant)",
            fix=f"export {READ_ONLY}=1 on every worker that only reads the cache, or unset it",
        )
    return value == "1"


def rule_markdown() -> str:
    """The rule as the docs hold it (between their markers): a numbered list, then what an
    explicit writer with the read-only switch on does."""
    lines = ["The first of these that is set decides a host's cache role:", ""]
    lines += [f"{n}. {what}: {decides}." for n, (what, decides) in enumerate(RULE, start=1)]
    lines += ["", CONTRADICTION]
    return "\n".join(lines) + "\n"
