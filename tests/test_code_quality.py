"""ruff and mypy stay clean, modules stay small, imports go down the layers: CI runs these as
tests so a red lint cannot land."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


SOURCE_PACKAGES = ("expansion", "flows", "tasks", "infra")  # top of the layers first


def _modules() -> list[Path]:
    return sorted(p for pkg in SOURCE_PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_source_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these by concept: {long}"


def test_imports_go_down_the_layers_only() -> None:
    """expansion → flows → tasks → infra: a module never imports a layer above its own."""
    upward = []
    for path in _modules():
        layer = SOURCE_PACKAGES.index(path.relative_to(ROOT).parts[0])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                top = node.module.split(".")[0]
                if top in SOURCE_PACKAGES and SOURCE_PACKAGES.index(top) < layer:
                    upward.append(f"{path.relative_to(ROOT)} imports {node.module}")
    assert not upward, upward


def test_no_function_is_over_80_lines() -> None:
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, f"split these: {long}"


def _imports_of(path: Path, modules: set[str]) -> set[str]:
    """The source modules `path` imports (type-checking-only imports included: a circle
    there is a circle in the design)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([node.module] + [f"{node.module}.{a.name}" for a in node.names]
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found |= {n for n in names if n in modules}
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circle() -> None:
    """Modules import each other in one direction only, within a layer too (the tuner's
    handlers once imported the epoch that imported them: flows.epoch ⇄ repair ⇄ rollout)."""
    paths = {_module_name(p): p for p in _modules()}
    graph = {m: _imports_of(p, set(paths)) - {m} for m, p in paths.items()}
    circles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for module in graph:
        if module not in index:
            visit(module)
    assert not circles, circles


MAX_PARAMETERS = 7


def _entry_point(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A Typer command or a Prefect flow: its parameters are the interface the user types
    (one `--option` each: Typer has no option groups) or the Prefect UI and `prefect
    deployment run --param` show (grouping them would break every deployment made)."""
    for dec in node.decorator_list:
        call = dec.func if isinstance(dec, ast.Call) else dec
        name = call.attr if isinstance(call, ast.Attribute) else getattr(call, "id", "")
        if name in ("command", "flow"):
            return True
    return False


def test_no_function_takes_more_than_seven_parameters() -> None:
    """Records instead of parameter lists (#28: propose took 13, decide_next 15)."""
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
            count = len([n for n in names if n not in ("self", "cls")])
            if count > MAX_PARAMETERS and not _entry_point(node):
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({count})")
    assert not long, f"pass a record: {long}"


# "session 9", "sessions 5 and 15", "before this, …", a dated data folder (2026-12-01-h200-s6)
_HISTORY = re.compile(r"\bsessions? \d+|\bbefore this, |\d{4}-\d{2}-\d{2}-h\d{3}", re.IGNORECASE)


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module."""
    source = path.read_text()
    out = [(t.start[0], t.string) for t in
           tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((getattr(node, "lineno", 1), doc))
    return out


def test_source_prose_says_what_and_why_not_when() -> None:
    """Comments and docstrings explain the code; history (which session found what, dated
    data folders) lives in git and docs/."""
    found = [f"{path.relative_to(ROOT)}:{line} {m.group(0)!r}" for path in _modules()
             for line, text in _prose(path) for m in _HISTORY.finditer(text)]
    assert not found, found
