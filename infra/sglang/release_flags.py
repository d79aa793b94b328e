"""Every flag `python -m sglang.launch_server` of a release accepts, read from its source.

SGLang 0.5.15+ builds its parser from `ServerArgs`' annotated fields (`A[T, Arg(...)]` or
`A[T, "help"]`, through `arg_groups/arg_utils.py::add_cli_args_from_dataclass`: the field's
name as `--field-name` unless `cli_name` says otherwise, plus `aliases`; `bool` fields are
store_true, list fields take one or more values) and a few explicit `parser.add_argument`
calls (deprecated aliases, dynamic choices). Parsing `srt/server_args.py` — not importing it,
which needs torch — gives the same table: `python -m infra.sglang.release_flags WHEEL...`
writes `data/sglang_flags.json`, and a test keeps it equal to the sources kept in
`tests/fixtures/sglang-source/`. A pasted launch line's flags that the memory model has no
field for are then carried to the launch as they are (and named), and a flag the release does
not have is refused, naming the release.
"""

from __future__ import annotations

import ast
import functools
import json
import sys
from pathlib import Path
from typing import Literal

from infra.sglang.release_tables import read_release_file
from infra.sglang.versions import SGLangVersion

FLAGS_FILE = Path(__file__).parent / "data" / "sglang_flags.json"
SERVER_ARGS_PATH = "sglang/srt/server_args.py"
Takes = Literal["none", "one", "many"]
_NO_VALUE_ACTIONS = ("store_true", "store_false", "StoreTrue", "StoreConst", "store_const",
                     "BooleanOptionalAction", "DeprecatedAction")


def read_server_args(path: Path) -> str:
    return read_release_file(path, SERVER_ARGS_PATH)


def extract_flags(source: str) -> dict[str, Takes]:
    """flag → how many values it takes, for every flag the release's parser defines."""
    tree = ast.parse(source)
    flags: dict[str, Takes] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    flags.update(_field_flags(item.target.id, item.annotation))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            flags.update(_explicit_flags(node))
    if "--model-path" not in flags:
        raise ValueError(f"{SERVER_ARGS_PATH}: no ServerArgs fields found; its parser changed")
    return dict(sorted(flags.items()))


def _field_flags(name: str, annotation: ast.expr) -> dict[str, Takes]:
    if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)
            and annotation.value.id == "A" and isinstance(annotation.slice, ast.Tuple)):
        return {}
    kind, *meta = annotation.slice.elts
    arg = next((m for m in meta if (isinstance(m, ast.Constant) and isinstance(m.value, str))
                or (isinstance(m, ast.Call) and getattr(m.func, "id", "") == "Arg")), None)
    if arg is None:
        return {}
    kwargs = {k.arg: k.value for k in arg.keywords} if isinstance(arg, ast.Call) else {}
    if _literal(kwargs.get("no_cli")) is True:
        return {}
    aliases = _literal(kwargs.get("aliases"))
    names = [_literal(kwargs.get("cli_name")) or "--" + name.replace("_", "-")]
    names += list(aliases) if isinstance(aliases, list) else []
    takes = _takes(ast.unparse(kind), kwargs)
    out = {str(n): takes for n in names}
    if "BooleanOptionalAction" in ast.unparse(kwargs.get("action", ast.Constant(""))):
        out.update({"--no-" + str(n).removeprefix("--"): "none" for n in names})
    return out


def _takes(kind: str, kwargs: dict[str | None, ast.expr]) -> Takes:
    if kwargs.get("nargs") is not None:
        return "many"
    if "action" in kwargs:
        action = ast.unparse(kwargs["action"])
        return "none" if any(a in action for a in _NO_VALUE_ACTIONS) else "one"
    bare = kind.replace("Optional[", "").rstrip("]")
    if bare == "bool":
        return "none"
    return "many" if bare.lower().startswith("list[") and "type_parser" not in kwargs else "one"


def _explicit_flags(call: ast.Call) -> dict[str, Takes]:
    names = [a.value for a in call.args if isinstance(a, ast.Constant)
             and isinstance(a.value, str) and a.value.startswith("--")]
    kwargs = {k.arg: k.value for k in call.keywords}
    takes = _takes("", kwargs)
    out: dict[str, Takes] = {n: takes for n in names}
    if "BooleanOptionalAction" in ast.unparse(kwargs.get("action", ast.Constant(""))):
        out.update({"--no-" + n.removeprefix("--"): "none" for n in names})
    return out


def _literal(node: ast.expr | None) -> object:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


@functools.cache
def known_flags() -> dict[str, dict[str, Takes]]:
    table: dict[str, dict[str, Takes]] = json.loads(FLAGS_FILE.read_text())
    return table


def flags_for(version: SGLangVersion) -> tuple[str, dict[str, Takes]] | None:
    """(release, its flags) of the newest extracted release at or before this version
    (`main`: 0.5.15, the newest cut before it); None before the oldest extracted."""
    table = known_flags()
    number: tuple[int, ...] = version.number or (
        _key("0.5.15") if version.release.isoformat() >= "2026-07-07" else (0,))
    eligible = [r for r in table if _key(r) <= number]
    if not eligible:
        return None
    release = max(eligible, key=_key)
    return release, table[release]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m infra.sglang.release_flags WHEEL_OR_SERVER_ARGS... "
              "(named with their release: sglang-0.5.17-….whl, server_args-0.5.17.py.gz)")
        return 2
    from infra.sglang.release_tables import release_of

    data = {release_of(Path(p)): extract_flags(read_server_args(Path(p))) for p in argv}
    FLAGS_FILE.write_text(json.dumps(dict(sorted(data.items(), key=lambda d: _key(d[0]))),
                                     indent=0) + "\n")
    print(f"wrote {FLAGS_FILE} ({', '.join(f'{r}: {len(f)} flags' for r, f in data.items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
