"""ruff and mypy stay clean, modules stay small, imports go down the layers: CI runs these as
tests so a red lint cannot land."""

from __future__ import annotations

import ast
import subprocess
import sys
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
