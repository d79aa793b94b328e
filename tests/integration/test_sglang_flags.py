"""Every flag the builder emits for SGLang 0.5.23 exists in SGLang's own argument definitions.

The real `sglang` wheel is downloaded without dependencies and its argument dataclasses are
read with `ast` (importing it would need CUDA torch).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from infra.sglang.flags import ServerFlags
from infra.sglang.launch import every_flag_name
from infra.sglang.versions import parse_version

VERSION = "0.5.23"
CACHE = Path.home() / ".cache" / "expansion-tests" / f"sglang-{VERSION}"


def sglang_wheel() -> Path:
    found = sorted(CACHE.glob("sglang-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    f"sglang=={VERSION}", "-d", str(CACHE)], check=True, timeout=600)
    return sorted(CACHE.glob("sglang-*.whl"))[0]


def _arg_keywords(annotation: ast.expr) -> dict[str, object]:
    found: dict[str, object] = {}
    for node in ast.walk(annotation):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Arg":
            for kw in node.keywords:
                if kw.arg and isinstance(kw.value, ast.Constant):
                    found[kw.arg] = kw.value.value
                elif kw.arg == "aliases" and isinstance(kw.value, ast.List):
                    found["aliases"] = [e.value for e in kw.value.elts
                                        if isinstance(e, ast.Constant)]
    return found


def sglang_cli_flags(wheel: Path) -> set[str]:
    """Flags SGLang derives from its ServerArgs dataclass fields (arg_utils' rules)."""
    flags: set[str] = set()
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if not name.endswith(".py") or not (
                    name.startswith("sglang/srt/arg_groups/fields/")
                    or name == "sglang/srt/server_args.py"):
                continue
            for node in ast.walk(ast.parse(zf.read(name))):
                if not isinstance(node, ast.ClassDef):
                    continue
                for stmt in node.body:
                    if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                            and isinstance(stmt.annotation, ast.Subscript)):
                        continue
                    kw = _arg_keywords(stmt.annotation)
                    if kw.get("no_cli"):
                        continue
                    flags.add(str(kw.get("cli_name") or "--" + stmt.target.id.replace("_", "-")))
                    flags.update(kw.get("aliases") or [])  # type: ignore[arg-type]
    return flags


@pytest.fixture(scope="module")
def real_flags() -> set[str]:
    flags = sglang_cli_flags(sglang_wheel())
    assert len(flags) > 200, "SGLang's argument definitions were not found in the wheel"
    return flags


FLAG_SETS = [
    ServerFlags(mem_fraction_static=0.9, max_running_requests=128, max_total_tokens=100000,
                mamba_strategy="extra_buffer", max_mamba_cache_size=200,
                mamba_full_memory_ratio=0.6, mamba_ssm_dtype="bfloat16", context_length=32768,
                page_size=64, chunked_prefill_size=8192, kv_cache_dtype="fp8_e4m3", tp_size=2,
                speculative_algorithm="EAGLE", speculative_num_steps=3,
                speculative_eagle_topk=1, speculative_num_draft_tokens=4),
    ServerFlags(mamba_strategy="no_buffer", disable_radix_cache=True,
                disable_overlap_schedule=True),
]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=["everything", "no_buffer"])
def test_every_emitted_flag_exists_in_sglang(real_flags: set[str], flags: ServerFlags) -> None:
    emitted = every_flag_name(flags, parse_version(VERSION))
    missing = [f for f in emitted if f not in real_flags]
    assert not missing, f"SGLang {VERSION} has no {missing}"


def test_old_names_are_really_gone_in_0_5_23(real_flags: set[str]) -> None:
    assert "--mamba-scheduler-strategy" not in real_flags
    assert "--cuda-graph-max-bs" not in real_flags
    assert "--mamba-radix-cache-strategy" in real_flags
