"""The house rules #40 asks to hold at grep level, as tests so they keep holding: a function
that needs two of the job's facts takes those two (not the whole `JobSettings`), engines are
built once per run (no `engine_for(` lookups in tasks/ or flows/), and `config`, `caps` and
`plan` each mean one thing wherever they name a parameter or an attribute."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tasks", "flows", "infra", "expansion")

# The only places a whole `JobSettings` may be taken for a field or two: the converters
# between a job and the configuration it runs, and the engine that owns the job's facts.
OWNERS_OF_THE_JOB = {
    "tasks/fleet_config.py:of",          # the configuration a job starts on
    "tasks/fleet_config.py:applied_to",  # the job running a configuration
    "tasks/engines/base.py:__init__",    # an engine is built once from the job's facts
}

# name → what its annotation must say wherever a parameter or attribute carries that name
ONE_MEANING = {
    "config": "FleetConfig",       # launch flags + client concurrency (tasks/fleet_config.py)
    "caps": "dict[str, int]",      # server name → the cap it runs under
    "plan": "MemoryPlan",          # the pools SGLang sizes (a shard plan is `shard_plan`)
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text())


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _settings_use(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> tuple[set[str], bool]:
    """The fields of `name` the function reads, and whether it uses the whole value (hands it
    on, or calls one of its methods, which read what they need)."""
    fields: set[str] = set()
    whole = False
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            whole |= any(isinstance(a, ast.Name) and a.id == name for a in args)
            func = node.func
            whole |= (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                      and func.value.id == name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == name):
            fields.add(node.attr)
    return fields, whole


def _job_settings_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    return [a.arg for a in args
            if a.annotation is not None and "JobSettings" in ast.unparse(a.annotation)]


def test_no_function_takes_the_job_settings_for_two_fields() -> None:
    narrow = []
    for path, tree in _modules():
        for fn in _functions(tree):
            if f"{path}:{fn.name}" in OWNERS_OF_THE_JOB:
                continue
            for name in _job_settings_params(fn):
                fields, whole = _settings_use(fn, name)
                if not whole and len(fields) <= 2:
                    narrow.append(f"{path}:{fn.lineno} {fn.name} reads {sorted(fields)}")
    assert not narrow, f"take the fields, not JobSettings: {narrow}"


def test_engines_are_not_looked_up_per_call() -> None:
    lookups = [f"{path}:{node.lineno}" for path, tree in _modules()
               if path.startswith(("tasks/", "flows/"))
               for node in ast.walk(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id == "engine_for"]
    assert not lookups, f"build the engine once per run and hand it on: {lookups}"


def _named_annotations(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, name, annotation) of every annotated parameter, attribute and variable."""
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            yield node.lineno, node.arg, ast.unparse(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            name = (target.id if isinstance(target, ast.Name)
                    else target.attr if isinstance(target, ast.Attribute) else "")
            yield node.lineno, name, ast.unparse(node.annotation)


def _means(annotation: str, meaning: str) -> bool:
    """`X`, `X | None`, a forward reference to `X`, an `Annotated[X, …]` column."""
    bare = annotation.strip("'\"").replace(" | None", "")
    return bare == meaning


def test_config_caps_and_plan_each_mean_one_thing() -> None:
    other = [f"{path}:{line} {name}: {annotation}" for path, tree in _modules()
             if not path.startswith("infra/output_row.py")  # the output's `config` column
             and not path.startswith("infra/manifest.py")   # manifest.jsonl's `plan` field
             for line, name, annotation in _named_annotations(tree)
             if name in ONE_MEANING and not _means(annotation, ONE_MEANING[name])]
    assert not other, f"one meaning per name {ONE_MEANING}: {other}"


def test_the_rules_would_catch_what_they_forbid() -> None:
    """The walkers see a narrow reader, a lookup and a second meaning when there is one."""
    tree = ast.parse("def f(s: JobSettings, caps: list[int]):\n"
                     "    engine_for(s.engine)\n    return s.model\n")
    fn = next(_functions(tree))
    assert _settings_use(fn, "s") == ({"engine", "model"}, False)
    assert [(n, a) for _, n, a in _named_annotations(tree)] == [
        ("s", "JobSettings"), ("caps", "list[int]")]
    assert not _means("list[int]", ONE_MEANING["caps"])
    assert _means("MemoryPlan | None", ONE_MEANING["plan"])
