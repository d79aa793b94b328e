"""SGLang's own architecture tables, read from each release's source instead of kept by hand.

Which hybrid architectures route through the mamba radix cache, and which of those may run
the extra_buffer strategy, are two frozensets in SGLang's `srt/arg_groups/overrides.py`
(`_MAMBA_RADIX_CACHE_ARCHS`, `_MAMBA_EXTRA_BUFFER_ARCHS`), read by
`_mamba_radix_cache_resolution` (the `auto` strategy) and `supports_mamba_cache_extra_buffer`
(also behind `ServerArgs._validate_mamba_extra_buffer`, the check of an explicit
extra_buffer). A list copied by hand went wrong both ways (Qwen3.6-35B-A3B's text model
planned extra_buffer where 0.5.17 runs no_buffer; NemotronH's extra_buffer refused where 0.5.17
serves it), so the tables come from the release: `python -m infra.sglang.release_tables
WHEEL_OR_OVERRIDES_PY...` extracts them (by parsing, not importing: no torch needed) into
`data/mamba_cache_tables.json`, and a test keeps that file equal to what the extractor reads
from the releases' sources kept in `tests/fixtures/sglang-source/`.

The same file says which architectures run their experts on `flashinfer_cutlass` when no
`--moe-runner-backend` is given (an arch-registered override function that assigns it:
0.5.17's `_nemotron_h_overrides`, for an unquantized NemotronH before SM100; 0.5.23 has none):
a runner no step fit ran, whose first start on an H100 autotuned for over 8 minutes.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from infra.sglang.versions import SGLangVersion

TABLES_FILE = Path(__file__).parent / "data" / "mamba_cache_tables.json"
OVERRIDES_PATH = "sglang/srt/arg_groups/overrides.py"
_NAMES = {"_MAMBA_RADIX_CACHE_ARCHS": "radix_cache_archs",
          "_MAMBA_EXTRA_BUFFER_ARCHS": "extra_buffer_archs"}


@dataclass(frozen=True)
class MambaCacheTables:
    """One release's answer to "does this architecture use the mamba radix cache, and may it
    run extra_buffer" (with the linear-attention backend extra_buffer needs)."""

    release: str
    radix_cache_archs: frozenset[str]
    extra_buffer_archs: frozenset[str]
    extra_buffer_linear_backend: str
    cutlass_moe_archs: frozenset[str] = frozenset()

    def uses_radix_cache(self, architecture: str) -> bool:
        return architecture in self.radix_cache_archs

    @property
    def hybrid_archs(self) -> frozenset[str]:
        """Every architecture the release serves with a mamba state pool."""
        return self.radix_cache_archs | self.extra_buffer_archs

    def supports_extra_buffer(self, architecture: str, linear_backend: str) -> bool:
        return (architecture in self.extra_buffer_archs
                and linear_backend == self.extra_buffer_linear_backend)


def extract(source: str, release: str) -> MambaCacheTables:
    """Read both tables and the backend extra_buffer requires from overrides.py's text."""
    tree = ast.parse(source)
    found: dict[str, frozenset[str]] = {}
    backend = ""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in _NAMES and isinstance(node.value, ast.Call)):
            found[_NAMES[node.targets[0].id]] = frozenset(ast.literal_eval(node.value.args[0]))
        if isinstance(node, ast.FunctionDef) and node.name == "supports_mamba_cache_extra_buffer":
            backend = _compared_backend(node)
    missing = [name for name, key in _NAMES.items() if key not in found]
    cutlass = frozenset(a for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                        and _assigns_cutlass_runner(node) for a in _registered_archs(node))
    if missing or not backend:
        raise ValueError(f"sglang {release}: {OVERRIDES_PATH} has no {missing or 'backend check'}"
                         "; its mamba cache resolution changed — model it before planning it")
    return MambaCacheTables(release, found["radix_cache_archs"], found["extra_buffer_archs"],
                            backend, cutlass)


def _registered_archs(func: ast.FunctionDef) -> list[str]:
    """The architectures an override function is registered for (`@_register_for(...)`)."""
    return [str(ast.literal_eval(arg)) for dec in func.decorator_list
            if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "_register_for"
            for arg in dec.args]


def _assigns_cutlass_runner(func: ast.FunctionDef) -> bool:
    """Whether the function sets `overrides["moe_runner_backend"] = "flashinfer_cutlass"`."""
    return any(isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
               and node.value.value == "flashinfer_cutlass"
               and isinstance(node.targets[0], ast.Subscript)
               and ast.unparse(node.targets[0].slice) == "'moe_runner_backend'"
               for node in ast.walk(func))


def _compared_backend(func: ast.FunctionDef) -> str:
    """The string `view.linear_attn_backend` is compared with in the support check."""
    for node in ast.walk(func):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute)
                and node.left.attr == "linear_attn_backend"
                and isinstance(node.comparators[0], ast.Constant)):
            return str(node.comparators[0].value)
    return ""


def read_overrides(path: Path) -> str:
    return read_release_file(path, OVERRIDES_PATH)


def read_release_file(path: Path, inner: str) -> str:
    """One source file of a release (`inner`, as in the wheel) from a wheel, a site-packages
    folder, or the file itself as .py or .py.gz."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            return wheel.read(inner).decode()
    if path.is_dir():
        path = path / inner
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


@functools.cache
def known_tables() -> dict[str, MambaCacheTables]:
    raw = json.loads(TABLES_FILE.read_text())
    return {release: MambaCacheTables(release, frozenset(t["radix_cache_archs"]),
                                      frozenset(t["extra_buffer_archs"]),
                                      t["extra_buffer_linear_backend"],
                                      frozenset(t["cutlass_moe_archs"]))
            for release, t in raw.items()}


def tables_for(version: SGLangVersion) -> MambaCacheTables | None:
    """The tables of the newest extracted release at or before this version (`main`: the
    newest whose cut date is known to precede it); None before the oldest extracted."""
    tables = known_tables()
    number: tuple[int, ...] = version.number or (
        _key("0.5.15") if version.release.isoformat() >= "2026-07-07" else (0,))
    eligible = [r for r in tables if _key(r) <= number]
    return tables[max(eligible, key=_key)] if eligible else None


def write_tables(sources: list[tuple[str, Path]]) -> dict[str, object]:
    data: dict[str, object] = {}
    for release, path in sorted(sources, key=lambda s: _key(s[0])):
        t = extract(read_overrides(path), release)
        data[release] = {"radix_cache_archs": sorted(t.radix_cache_archs),
                         "extra_buffer_archs": sorted(t.extra_buffer_archs),
                         "extra_buffer_linear_backend": t.extra_buffer_linear_backend,
                         "cutlass_moe_archs": sorted(t.cutlass_moe_archs),
                         "source": f"sglang {release} {OVERRIDES_PATH}"}
    return data


def release_of(path: Path) -> str:
    """`sglang-0.5.17-cp311-….whl` or `overrides-0.5.17.py.gz` → 0.5.17."""
    for part in path.name.replace("-", " ").replace(".py", " ").split():
        if part[:1].isdigit() and part.count(".") == 2:
            return part
    raise ValueError(f"{path}: no release number in its name")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m infra.sglang.release_tables WHEEL_OR_OVERRIDES... "
              "(named with their release: sglang-0.5.17-….whl, overrides-0.5.17.py.gz)")
        return 2
    data = write_tables([(release_of(Path(p)), Path(p)) for p in argv])
    TABLES_FILE.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {TABLES_FILE} ({', '.join(data)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
