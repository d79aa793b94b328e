"""Which hybrid architectures' routers add a per-expert bias to the scores they pick by, read
from each release's model sources instead of kept by hand.

Why it matters: a server started with `--load-format dummy` fills every floating parameter
uniformly in ±1e-3 (`initialize_dummy_weights` in srt/model_loader/weight_utils.py), norm
weights included, so the hidden state a router scores is ~1e-3 and its scores differ by far
less than a bias of the same ±1e-3 does. A router that selects on score + bias (`TopK(...,
correction_bias=...)`: DeepSeek-V3's) then sends every token to the same top-k experts, and a
batch reads top-k experts' weights, not all of them; one that selects on the scores alone
still spreads. Measured: Kimi-Linear and NemotronH (biased) at the lowest spread the fits
searched, which is top-k alone; Qwen3.5-MoE and Granite (unbiased) at 0.8 and 1.0
(data/step_calibration.json). The planner prices an MoE whose spread no run measured by this.

`python -m infra.sglang.router_tables WHEEL_OR_SITE... ` (named with their release) writes
`data/router_tables.json`; a test keeps it equal to what this reads from the model sources
kept in `tests/fixtures/sglang-source/`.
"""

from __future__ import annotations

import ast
import functools
import json
import sys
import zipfile
from pathlib import Path

from infra.sglang.release_tables import (
    _key,
    known_tables,
    read_release_file,
    release_of,
)

TABLES_FILE = Path(__file__).parent / "data" / "router_tables.json"
MODELS_DIR = "sglang/srt/models"
ALWAYS = "always"  # the router always adds its bias (a parameter the module creates)
NEVER = "never"  # it builds a TopK without one
# else "config:<field>": it adds one where the model's config sets that field


def entry_classes(tree: ast.Module) -> list[str]:
    """The architectures a model file serves (`EntryClass = X` or `[X, Y]`)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets)):
            value = node.value
            items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            return [item.id for item in items if isinstance(item, ast.Name)]
    return []


CONDITIONAL = "conditional"  # on something this reading does not follow: not known


def _attribute_values(tree: ast.Module) -> dict[str, list[ast.expr]]:
    """Attribute name → every value the file assigns to `<something>.<name>`."""
    out: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    out.setdefault(target.attr, []).append(node.value)
    return out


def _is_parameter(value: ast.expr) -> bool:
    func = value.func if isinstance(value, ast.Call) else None
    return (isinstance(func, ast.Attribute) and func.attr == "Parameter") or (
        isinstance(func, ast.Name) and func.id == "Parameter")


def _bias_value(value: ast.expr | None, assigned: dict[str, list[ast.expr]]) -> str:
    """What a `correction_bias=` value is: None, a parameter the module always creates, one
    on a config field (`x if config.field else None`), or something else (conditional)."""
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return NEVER
    if isinstance(value, ast.IfExp):
        if (isinstance(value.orelse, ast.Constant) and value.orelse.value is None
                and isinstance(value.test, ast.Attribute)
                and isinstance(value.test.value, ast.Name) and value.test.value.id == "config"):
            return f"config:{value.test.attr}"
        return CONDITIONAL
    if isinstance(value, ast.Attribute):
        values = assigned.get(value.attr, [])
        if values and all(_is_parameter(v) for v in values):
            return ALWAYS
        if len(values) == 1 and not isinstance(values[0], ast.Attribute):
            return _bias_value(values[0], assigned)
    return CONDITIONAL


def router_bias(source: str) -> str | None:
    """The file's routers' bias (None: it builds no TopK; its router lives elsewhere). Where
    its TopK calls disagree the file is read as biased: the bias decides the spread."""
    tree = ast.parse(source)
    assigned = _attribute_values(tree)
    found = {_bias_value(next((k.value for k in node.keywords if k.arg == "correction_bias"),
                              None), assigned)
             for node in ast.walk(tree) if isinstance(node, ast.Call) and (
                 (isinstance(node.func, ast.Name) and node.func.id == "TopK")
                 or (isinstance(node.func, ast.Attribute) and node.func.attr == "TopK"))}
    if not found:
        return None
    if CONDITIONAL in found:
        return CONDITIONAL
    biased = sorted(found - {NEVER})
    return biased[0] if biased else NEVER


def extract(sources: dict[str, str], hybrid_archs: frozenset[str]) -> dict[str, str]:
    """Architecture → its router's bias, for the hybrid architectures these files serve."""
    out: dict[str, str] = {}
    for name, raw in sources.items():
        text = raw.lstrip("\ufeff")
        if not any(arch in text for arch in hybrid_archs):
            continue  # (some files parse only under a newer Python than this one)
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            raise ValueError(f"{name}: serves a hybrid architecture and does not parse: "
                             f"{exc}") from exc
        archs = [a for a in entry_classes(tree) if a in hybrid_archs]
        bias = router_bias(text) if archs else None
        if bias is not None:
            out.update(dict.fromkeys(archs, bias))
    return dict(sorted(out.items()))


def hybrid_archs(release: str) -> frozenset[str]:
    """The architectures the release's own tables route through the mamba caches."""
    return known_tables()[release].hybrid_archs


def model_sources(path: Path) -> dict[str, str]:
    """Every srt/models/*.py of a site folder or wheel (or a folder of the files, .py.gz)."""
    folder = path / MODELS_DIR if (path / MODELS_DIR).is_dir() else path
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            names = [n for n in wheel.namelist()
                     if n.startswith(MODELS_DIR + "/") and n.endswith(".py")]
        return {Path(n).name: read_release_file(path, n) for n in names}
    return {f.name.removesuffix(".gz"): read_release_file(f, "")
            for f in sorted(folder.iterdir()) if f.name.endswith((".py", ".py.gz"))}


@functools.cache
def known_routers() -> dict[str, dict[str, str]]:
    return {release: dict(t["archs"]) for release, t in
            json.loads(TABLES_FILE.read_text()).items()}


def biased_router(architecture: str, hf_config: dict[str, object]) -> bool | None:
    """Whether this architecture's router adds its bias for this config, by the newest
    extracted release (None: no release's model files say)."""
    tables = known_routers()
    bias = tables[max(tables, key=_key)].get(architecture)
    if bias is None:
        return None
    if bias.startswith("config:"):
        return hf_config.get(bias.removeprefix("config:")) is True
    return None if bias == CONDITIONAL else bias == ALWAYS


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m infra.sglang.router_tables WHEEL_OR_SITE... (named with "
              "their release: sglang-0.5.17-….whl, a folder models-0.5.17/)")
        return 2
    data = {}
    for raw in argv:
        path = Path(raw)
        release = release_of(path)
        data[release] = {"archs": extract(model_sources(path), hybrid_archs(release)),
                         "source": f"sglang {release} {MODELS_DIR}/*.py: TopK(correction_bias=)"}
    TABLES_FILE.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {TABLES_FILE} ({', '.join(data)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
