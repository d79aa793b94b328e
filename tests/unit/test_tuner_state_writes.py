"""The tuner's record has one writer: its own methods. A field assigned, incremented or
mutated in place anywhere else (`state.config = …`, `state.relaunched[name] += 1`,
`state.advice.append(…)`) would be a second writer, from the watch's thread as often as not."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from tasks.tuning.state import TunerState

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name for f in dataclasses.fields(TunerState)}
MUTATORS = {"add", "append", "update", "pop", "clear", "extend", "discard", "setdefault"}


def _field_of(node: ast.expr) -> str | None:
    """`state.x` / `self.state.x` (and a subscript of one) → "x"."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and node.attr in FIELDS:
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "state") or (
                isinstance(owner, ast.Attribute) and owner.attr == "state"):
            return node.attr
    return None


def writes(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in MUTATORS):
            targets = [node.func.value]
        for target in targets:
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            found += [(getattr(node, "lineno", 0), name) for e in elements
                      if (name := _field_of(e))]
    return found


def test_no_module_but_the_state_writes_the_tuners_state() -> None:
    outside = {}
    for path in [*ROOT.glob("tasks/**/*.py"), *ROOT.glob("flows/**/*.py")]:
        if path.name == "state.py" and path.parent.name == "tuning":
            continue
        found = writes(ast.parse(path.read_text()))
        if found:
            outside[str(path.relative_to(ROOT))] = found
    assert outside == {}


def test_the_check_sees_each_kind_of_write() -> None:
    code = ("state.config = c\nself.state.restarts += 1\nstate.relaunched[n] = 2\n"
            "state.advice.append(r)\nx, state.mem_ceiling = f()\nstate.logger.info('x')\n")
    assert sorted(writes(ast.parse(code))) == [
        (1, "config"), (2, "restarts"), (3, "relaunched"), (4, "advice"), (5, "mem_ceiling")]
