"""Is every input of a compiled program in the persistent cache key? An audit of the source.

A cache that loads executables must never load one built from another program. Patch 0003
keys each entry on the lowered module and its compile options, so whatever changes those is
in the key whoever reads it; what remains a judgment is the list of inputs outside the key,
and a new reader nobody classified. This audit makes that list checked, not hoped for: it scans a
pytorch/xla tree (``torch_xla/csrc``, the series applied) for

- every read of an environment variable: ``sys_util::GetEnvString/Int/Bool/Double/
  OrdinalPath("NAME", ...)``, ``std::getenv("NAME")``, and the same with a name constant of
  ``runtime/env_vars.h`` (``env::kEnvPjRtDevice``);
- every process-wide setting reachable from Python: a binding of
  ``init_python_bindings.cpp`` (``.def("NAME", ...)``) whose name says it sets something
  (``_xla_set_mat_mul_precision``) or whose body assigns a ``FLAGS_`` global or calls a
  static setter (``XlaHelpers::set_mat_mul_precision``, ``Get()->SetUseEagerMode``);

and compares them with ONE table, ``patches/torch_xla/cache_key_inputs.toml``: each input
shapes the lowered module or its compile options (which the key hashes), is hashed next to
them (and where), or is deliberately outside the key (and why). A read or setter the table
does not name is a finding, reported with its file and line. The documentation's key
table (:data:`TABLE_PAGE`, "What the persistent cache key covers") is rendered from the
same table (:func:`readme_table`), and a test keeps the two equal: the documented table is
the audit's list.

Reads are found file by file over the whole ``torch_xla/csrc`` (tests, ``*_test.cpp``, are
not in the wheel and are skipped): the audit does not try to decide which code runs while
a graph is lowered, so a new reader anywhere is reported. A read whose name is neither a
literal nor a known constant (``GetEnvString(env_var_name.c_str(), ...)``) must be listed
under ``[[indirect]]`` by file and argument.

``patches-check`` and ``patch-rebase`` run it on the tree they carried the series to, so a
newer torch_xla's new readers are reported as code that no longer compiles is.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from xla_host.errors import CheckFailed, UsageError
from xla_host.tables import read_regular

TABLE_NAME = "cache_key_inputs.toml"
TABLE_SUBPATH = Path("patches") / "torch_xla" / TABLE_NAME
SOURCE_DIR = "torch_xla/csrc"
BINDINGS = "torch_xla/csrc/init_python_bindings.cpp"
ENV_CONSTANTS = "torch_xla/csrc/runtime/env_vars.h"
#: The documentation page whose key table is rendered between the markers below.
TABLE_PAGE = Path("docs") / "cache-key.md"
README_BEGIN = (
    "<!-- cache-key-table: begin (rendered from patches/torch_xla/cache_key_inputs.toml) -->"
)
README_END = "<!-- cache-key-table: end -->"

Status = Literal["module", "keyed", "outside"]
STATUSES: tuple[Status, ...] = ("module", "keyed", "outside")
_IN_KEY_CELL = {
    "module": "yes, through the module or its compile options",
    "keyed": "yes",
    "outside": "**no**",
}

# The calls that read the environment, and a name literal or constant as first argument.
_READ = re.compile(
    r"\b(?P<call>GetEnv(?:String|Int|Bool|Double|OrdinalPath)?|getenv)\s*\(\s*"
    r"(?P<arg>\"[^\"]*\"|[^,()]+(?:\([^()]*\))?)"
)
_LITERAL = re.compile(r'"(?P<name>[^"]*)"')
_CONSTANT = re.compile(r'\bconstexpr\s+char\s+(?P<id>k\w+)\[\]\s*=\s*"(?P<name>[^"]+)"')
_BINDING = re.compile(r'\.def\(\s*"(?P<name>[^"]+)"')
_SETTER_NAME = re.compile(r"(^|_)set(_|$)")
_SETTER_BODY = re.compile(
    r"\bFLAGS_\w+\s*=(?!=)|\b[A-Z]\w*::(?:set_\w+|Set[A-Z]\w*)\s*\(|\bGet\(\)->Set[A-Z]\w*\s*\("
)


# --- The table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One row of the key table: an input, whether it is in the key, where or why not."""

    title: str
    """The README's first cell (markdown)."""
    status: Status
    detail: str
    """Appended to the "in the key" cell ("yes, read once per process ...")."""
    where: str
    """Where it is hashed (module, keyed) or why it is outside (outside)."""
    env: tuple[str, ...] = ()
    """Environment variables this row covers (the audit matches reads against them)."""
    setters: tuple[str, ...] = ()
    """Python bindings (``init_python_bindings.cpp``) this row covers."""
    hashed_in: str = ""
    """The tree file (module and keyed rows) whose code must name what the row keys: a
    claim the audit checks by reading, while the compiled checks prove the hashing."""
    terms: tuple[str, ...] = ()
    """What ``hashed_in`` must contain; by default each of ``env`` as a string literal."""

    def key_terms(self) -> tuple[str, ...]:
        return self.terms or tuple(f'"{name}"' for name in self.env)


@dataclass(frozen=True)
class Indirect:
    """A read whose variable name is computed (``env_var_name.c_str()``), listed by file
    and argument, with what it reads."""

    path: str
    argument: str
    why: str


@dataclass(frozen=True)
class KeyTable:
    entries: tuple[Entry, ...]
    indirect: tuple[Indirect, ...] = ()

    def env_names(self) -> dict[str, Entry]:
        return {name: entry for entry in self.entries for name in entry.env}

    def setter_names(self) -> dict[str, Entry]:
        return {name: entry for entry in self.entries for name in entry.setters}

    def without(self, name: str) -> KeyTable:
        """This table without ``name`` (an environment variable or a binding): what a
        series whose table forgot an input looks like."""
        entries = tuple(
            replace(
                e,
                env=tuple(n for n in e.env if n != name),
                setters=tuple(n for n in e.setters if n != name),
            )
            for e in self.entries
        )
        return KeyTable(entries, self.indirect)


class KeyTableError(UsageError):
    """The table itself is malformed (exit 2: the audit cannot judge)."""


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise KeyTableError(
            f"{where} must be a list of non-empty strings",
            fix=f'write it as ["NAME", ...] in {TABLE_SUBPATH}',
        )
    return tuple(value)


def _text(row: dict[str, object], key: str, where: str, required: bool = True) -> str:
    value = row.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise KeyTableError(
            f"{where} needs a non-empty string `{key}`",
            fix=f'add `{key} = "..."` to that row of {TABLE_SUBPATH}',
        )
    return value


def parse_table(text: str, source: str = str(TABLE_SUBPATH)) -> KeyTable:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise KeyTableError(
            f"{source} is not valid TOML: {error}", fix="fix the line it names"
        ) from None
    entries = []
    seen: dict[str, str] = {}
    for index, row in enumerate(data.get("input", []), 1):
        where = f"{source} [[input]] #{index}"
        title = _text(row, "title", where)
        status = row.get("status")
        if status not in STATUSES:
            raise KeyTableError(
                f"{where} ({title}) has status {status!r}",
                fix=f"set status to one of {', '.join(STATUSES)}",
            )
        entry = Entry(
            title=title,
            status=status,
            detail=_text(row, "detail", where, required=False),
            where=_text(row, "where" if status != "outside" else "why", where),
            env=_strings(row.get("env", []), f"{where} env"),
            setters=_strings(row.get("setters", []), f"{where} setters"),
            hashed_in=_text(row, "hashed_in", where, required=False),
            terms=_strings(row.get("terms", []), f"{where} terms"),
        )
        if entry.hashed_in and status == "outside":
            raise KeyTableError(
                f"{where} ({title}) names hashed_in but has status {status!r}",
                fix="only a module or keyed row says where it is hashed",
            )
        for name in entry.env + entry.setters:
            if name in seen:
                raise KeyTableError(
                    f"{name} is listed twice in {source}: in {seen[name]!r} and {title!r}",
                    fix="keep it in the one row that says what it is",
                )
            seen[name] = title
        entries.append(entry)
    indirect = tuple(
        Indirect(
            _text(row, "file", f"{source} [[indirect]] #{i}"),
            _text(row, "argument", f"{source} [[indirect]] #{i}"),
            _text(row, "why", f"{source} [[indirect]] #{i}"),
        )
        for i, row in enumerate(data.get("indirect", []), 1)
    )
    if not entries:
        raise KeyTableError(f"{source} lists no [[input]]", fix="restore the table from git")
    return KeyTable(tuple(entries), indirect)


def load_table(project_root: Path, component: str = "torch_xla") -> KeyTable:
    path = table_path(project_root, component)
    if not path.is_file():
        raise KeyTableError(
            f"{path} does not exist: the audit has nothing to compare with",
            fix="restore it from git (it is the one list of the cache key's inputs)",
        )
    return parse_table(path.read_text(encoding="utf-8"), f"patches/{component}/{TABLE_NAME}")


# --- The source -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    """One read of the environment: where, the call, and the variable (``None`` when the
    argument is not a literal or a known constant)."""

    path: str
    line: int
    call: str
    argument: str
    name: str | None


@dataclass(frozen=True)
class Setter:
    """A Python binding that sets process-wide state."""

    path: str
    line: int
    binding: str


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def source_files(tree: Path) -> list[Path]:
    root = tree / SOURCE_DIR
    files = [
        path
        for path in root.rglob("*")
        if path.suffix in (".cpp", ".cc", ".h")
        and path.is_file()
        and not path.stem.endswith("_test")
    ]
    return sorted(files)


def env_constants(tree: Path) -> dict[str, str]:
    """``kEnvPjRtDevice`` -> ``PJRT_DEVICE``, from ``runtime/env_vars.h``."""
    path = tree / ENV_CONSTANTS
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    return {m.group("id"): m.group("name") for m in _CONSTANT.finditer(text)}


def _without_comments(text: str) -> str:
    """``//`` comments blanked to spaces (offsets and lines kept): a read in a comment
    (``// static bool use_ifrt = sys_util::GetEnvBool("XLA_USE_IFRT", false);``) is none."""
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)


def scan_reads(tree: Path) -> list[Read]:
    constants = env_constants(tree)
    reads = []
    for path in source_files(tree):
        relpath = path.relative_to(tree).as_posix()
        text = _without_comments(path.read_text(encoding="utf-8", errors="replace"))
        for match in _READ.finditer(text):
            argument = " ".join(match.group("arg").split())
            if argument.startswith("const ") or argument == "":
                continue  # a declaration or definition of the reader, not a read
            if literal := _LITERAL.fullmatch(argument):
                name: str | None = literal.group("name")
            else:
                name = constants.get(argument.rsplit("::", 1)[-1])
            line = _line_of(text, match.start("arg"))
            reads.append(Read(relpath, line, match.group("call"), argument, name))
    return reads


def scan_setters(tree: Path) -> list[Setter]:
    path = tree / BINDINGS
    if not path.is_file():
        return []
    text = _without_comments(path.read_text(encoding="utf-8", errors="replace"))
    bindings = list(_BINDING.finditer(text))
    setters = []
    for index, match in enumerate(bindings):
        end = bindings[index + 1].start() if index + 1 < len(bindings) else len(text)
        body = text[match.end() : end]
        name = match.group("name")
        if _SETTER_NAME.search(name) or _SETTER_BODY.search(body):
            setters.append(Setter(BINDINGS, _line_of(text, match.start()), name))
    return setters


# --- The verdict ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    message: str

    def render(self) -> str:
        return f"{self.path}{f':{self.line}' if self.line else ''}: {self.message}"


@dataclass(frozen=True)
class MissingKeyPatch:
    """A patch of the component's directory that the series lacks and that writes code
    the table says is there: the likely cause of the findings it accounts for."""

    relpath: str
    """Relative to ``patches/``, as a bundle lists it."""
    accounts_for: int
    """How many findings (a key term the code lacks) its added lines would answer."""


@dataclass(frozen=True)
class AuditReport:
    findings: tuple[Finding, ...]
    reads: int
    setters: int
    unused: tuple[str, ...] = field(default=())
    """Names the table lists that the tree no longer reads (worth a look, not a failure:
    XLA_FLAGS and LIBTPU_INIT_ARGS are read through a computed name, OpenXLA reads more)."""
    not_run: str = ""
    """Why nothing was audited (a tree without torch_xla/csrc), else empty."""
    missing: tuple[MissingKeyPatch, ...] = ()
    """Key patches out of the series (:func:`missing_key_patches`): named before the
    findings, since restoring them is the fix, not widening the table."""

    @property
    def passed(self) -> bool:
        return not self.findings

    def lines(self) -> list[str]:
        if self.not_run:
            return [f"cache key audit: not run, {self.not_run}"]
        lines = [f"  {finding.render()}" for finding in self.findings]
        if self.passed:
            lines.append(
                f"cache key audit: every one of {self.reads} environment read(s) and "
                f"{self.setters} Python setter(s) in {SOURCE_DIR} is in {TABLE_SUBPATH}"
            )
        else:
            lines.insert(
                0,
                f"cache key audit: {len(self.findings)} finding(s) against {TABLE_SUBPATH} "
                "(an input neither keyed nor listed, or a key the code lacks):",
            )
        for patch in reversed(self.missing):
            lines.insert(0, f"cache key audit: {missing_key_patch_line(patch, self)}")
        return lines


def missing_key_patch_line(patch: MissingKeyPatch, report: AuditReport) -> str:
    return (
        f"the series lacks patches/{patch.relpath}, which writes what {patch.accounts_for} "
        f"of the {len(report.findings)} finding(s) below look for: restore it first "
        "(the other findings may go with it)"
    )


def missing_key_patch_summary(report: AuditReport) -> str:
    """The one-line cause ``patches-check`` fails with when key patches are missing."""
    names = ", ".join(f"patches/{patch.relpath}" for patch in report.missing)
    return (
        f"the series lacks {names}, which the cache key relies on (the key table "
        f"{TABLE_SUBPATH} names code that only it writes; {len(report.findings)} audit "
        "finding(s) above)"
    )


def audit(tree: Path, table: KeyTable) -> AuditReport:
    """Every read and setter of ``tree`` against ``table``: a finding per one it lacks."""
    reads, setters = scan_reads(tree), scan_setters(tree)
    env, bound = table.env_names(), table.setter_names()
    indirect = {(i.path, i.argument) for i in table.indirect}
    findings = []
    for read in reads:
        if read.name is None:
            if (read.path, read.argument) not in indirect:
                findings.append(
                    Finding(
                        read.path,
                        read.line,
                        f"{read.call}({read.argument}, ...) reads a variable whose name "
                        "is computed: list it under [[indirect]] with what it reads",
                    )
                )
        elif read.name not in env:
            findings.append(
                Finding(
                    read.path,
                    read.line,
                    f'{read.call}("{read.name}") reads {read.name}, which the table '
                    "neither keys nor lists as outside the key",
                )
            )
    for setter in setters:
        if setter.binding not in bound:
            findings.append(
                Finding(
                    setter.path,
                    setter.line,
                    f"the Python binding {setter.binding} sets process-wide state that "
                    "the table neither keys nor lists as outside the key",
                )
            )
    findings.extend(_unhashed(tree, table))
    read_names = {read.name for read in reads} | {s.binding for s in setters}
    unused = tuple(sorted(name for name in [*env, *bound] if name not in read_names))
    return AuditReport(tuple(findings), len(reads), len(setters), unused)


def _unhashed(tree: Path, table: KeyTable) -> list[Finding]:
    """A keyed row whose ``hashed_in`` file does not name what it keys (the table claims
    a key the code does not have: the series lost a hunk, or upstream moved it)."""
    return [
        Finding(
            where, 0, f"{TABLE_SUBPATH} says {term} is hashed here, but this file does not name it"
        )
        for where, term in unhashed_terms(tree, table)
    ]


def unhashed_terms(tree: Path, table: KeyTable) -> list[tuple[str, str]]:
    """(``hashed_in`` file, term) for each key term the tree's file does not name."""
    missing = []
    for entry in table.entries:
        if not entry.hashed_in:
            continue
        path = tree / entry.hashed_in
        text = _without_comments(path.read_text(encoding="utf-8")) if path.is_file() else ""
        missing += [(entry.hashed_in, term) for term in entry.key_terms() if term not in text]
    return missing


def _added_lines(patch_text: str) -> dict[str, list[str]]:
    """The lines a patch adds, by the file it adds them to (``b/`` side)."""
    added: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in patch_text.splitlines():
        if line.startswith("diff --git "):
            current = added.setdefault(line.rsplit(" b/", 1)[-1], [])
        elif current is not None and line.startswith("+") and not line.startswith("+++ "):
            current.append(line[1:])
    return added


def missing_key_patches(
    project_root: Path,
    component: str,
    series: Iterable[str],
    unhashed: Iterable[tuple[str, str]],
) -> tuple[MissingKeyPatch, ...]:
    """The patches of ``patches/<component>/`` outside ``series`` whose added lines hold
    a key term the tree lacks, in file order: derived from the patch files themselves, so
    the table never has to say which patch writes which key."""
    wanted = list(unhashed)
    in_series = set(series)
    missing = []
    for path in sorted((project_root / "patches" / component).glob("*.patch")):
        relpath = f"{component}/{path.name}"
        if relpath in in_series or not path.is_file():
            continue
        text = read_regular(path, KeyTableError, what="patch file").decode("utf-8", "replace")
        added = _added_lines(text)
        answered = [
            (where, term)
            for where, term in wanted
            if any(term in line for line in added.get(where, ()))
        ]
        if answered:
            missing.append(MissingKeyPatch(relpath, len(answered)))
    return tuple(missing)


def table_path(project_root: Path, component: str) -> Path:
    return project_root / "patches" / component / TABLE_NAME


def audit_step_line(project_root: Path, component: str, tree: Path) -> str:
    """What a dry run prints for the audit a real run makes (or that there is none)."""
    if not table_path(project_root, component).is_file():
        return f"cache key audit: none (the {component} series has no {TABLE_NAME})"
    return (
        f"cache key audit: every environment read and Python setter of {tree / SOURCE_DIR} "
        f"against patches/{component}/{TABLE_NAME}"
    )


def audit_series(
    project_root: Path, component: str, tree: Path, series: Iterable[str] | None = None
) -> AuditReport | None:
    """The audit of ``tree`` against ``component``'s table; ``None`` when the series has
    no table (only torch_xla's keys a cache). Given the ``series`` applied to ``tree``
    (patch relpaths), the report also names the key patches it lacks."""
    if not table_path(project_root, component).is_file():
        return None
    table = load_table(project_root, component)
    if not (tree / SOURCE_DIR).is_dir():
        # Not a pytorch/xla tree (the tests' synthetic upstreams): nothing reads a variable.
        return AuditReport((), 0, 0, not_run=f"{tree} has no {SOURCE_DIR} to audit")
    report = audit(tree, table)
    if series is None or report.passed:
        return report
    unhashed = unhashed_terms(tree, table)
    return replace(report, missing=missing_key_patches(project_root, component, series, unhashed))


def judge(report: AuditReport, what: str, fix: str) -> None:
    if not report.passed:
        raise CheckFailed(
            f"{what}: the cache key audit found {len(report.findings)} input(s) of a "
            "compiled program that the key misses or the table does not list (listed above)",
            fix=fix,
        )


# --- The documented table (TABLE_PAGE) -------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def readme_table(table: KeyTable) -> str:
    """The documented key table (:data:`TABLE_PAGE`), rendered from the table: one row per entry."""
    rows = [
        "| input | in the key | where it is hashed, or why it is not |",
        "|---|---|---|",
    ]
    for entry in table.entries:
        in_key = _IN_KEY_CELL[entry.status] + (f", {entry.detail}" if entry.detail else "")
        # Every name the audit matches is in the documented table: those the title does not show
        # are listed after it.
        rest = [name for name in (*entry.env, *entry.setters) if f"`{name}`" not in entry.title]
        joiner = ", also " if "`" in entry.title else ": "
        title = entry.title + (joiner + ", ".join(f"`{n}`" for n in rest) if rest else "")
        rows.append(f"| {_cell(title)} | {_cell(in_key)} | {_cell(entry.where)} |")
    return "\n".join(rows) + "\n"


def readme_block(readme_text: str) -> str | None:
    """The text between the page's markers, or ``None`` without them."""
    start, end = readme_text.find(README_BEGIN), readme_text.find(README_END)
    if start < 0 or end < start:
        return None
    return readme_text[start + len(README_BEGIN) : end].strip("\n") + "\n"


def with_readme_table(readme_text: str, table: KeyTable) -> str:
    """``readme_text`` with the block between the markers rendered from ``table``."""
    start, end = readme_text.find(README_BEGIN), readme_text.find(README_END)
    if start < 0 or end < start:
        raise UsageError(
            f"the page has no {README_BEGIN} ... {README_END} block",
            fix="put the markers around the key table",
        )
    head = readme_text[: start + len(README_BEGIN)]
    return head + "\n" + readme_table(table) + readme_text[end:]


def names(entries: Iterable[Entry]) -> list[str]:
    return [name for entry in entries for name in (*entry.env, *entry.setters)]
