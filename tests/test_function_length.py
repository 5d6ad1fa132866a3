"""No function of the source runs over 80 lines unless its docstring says why ("Over 80
lines: ..."). The ones that did when the rule came are listed, to be split; the list may
only shrink (a function split, or given its reason, must leave it)."""

from __future__ import annotations

import ast

from tests.gitrepos import REPO_ROOT

LIMIT = 80
REASON = "Over 80 lines:"

#: Today's long functions without a reason, to be split (file, function).
TO_SPLIT: set[tuple[str, str]] = set()


def long_functions(source: str) -> list[tuple[str, int]]:
    """The functions of ``source`` over :data:`LIMIT` lines whose docstring gives no
    reason, with their length."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMIT and REASON not in (ast.get_docstring(node) or ""):
                found.append((node.name, length))
    return found


def test_no_new_function_runs_over_80_lines_without_a_reason() -> None:
    found = {}
    for folder in ("src", "host/src"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT).as_posix()
            for name, length in long_functions(path.read_text()):
                found[(relative, name)] = length
    new = {key: length for key, length in found.items() if key not in TO_SPLIT}
    assert not new, f"split these, or say why in the docstring ({REASON} ...): {new}"
    done = TO_SPLIT - set(found)
    assert not done, f"split or given a reason: take them off TO_SPLIT: {sorted(done)}"


def test_the_rule_counts_lines_and_reads_the_reason() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    assert long_functions(f"def f():\n{body}") == [("f", LIMIT + 1)]
    assert long_functions(f'def f():\n    """{REASON} one table."""\n{body}') == []
    assert long_functions(f"def f():\n{body[: -len(body) // LIMIT]}") == []
