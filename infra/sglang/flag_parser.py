"""SGLang's own command-line flags, parsed into ServerFlags — generated from its fields.

One definition (infra/sglang/flags.py) instead of a hand-written list per command: the
simulated server reads its argv with it, and `expansion plan -- <flags>` takes a pasted
SGLang command line with it. Names follow SGLang (`--mem-fraction-static`), the old and new
spellings of renamed flags both work (`--mamba-scheduler-strategy`), and a flag that is not
a ServerFlags field is left to the caller (SGLang's business for the simulator, an error
for `plan`).
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from infra.sglang.flags import ServerFlags
from infra.sglang.release_flags import flags_for
from infra.sglang.versions import SGLangVersion

# Fields whose SGLang name is not the field's name (first: the name launch.py emits).
ALIASES: dict[str, tuple[str, ...]] = {
    "mamba_strategy": ("--mamba-radix-cache-strategy", "--mamba-scheduler-strategy"),
    "tp_size": ("--tp-size", "--tensor-parallel-size"),
}
NOT_FLAGS = frozenset({"extra_args"})  # argv items, not one flag
# SGLang flags that are no ServerFlags field but that the model reads from extra_args: the
# decode graph size, the linear-attention backend extra_buffer needs, dummy weights' routing.
# Any other flag the targeted release accepts (release_flags.py) is carried verbatim too.
MODELLED_IN_EXTRA_ARGS = ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode",
                          "--linear-attn-backend", "--load-format")


def flag_names(field: str) -> tuple[str, ...]:
    return ALIASES.get(field, ("--" + field.replace("_", "-"),))


def _scalar(annotation: Any) -> tuple[type, tuple[str, ...] | None]:
    """(argparse type, choices) of `X | None`, `Literal[...]` and plain types."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return _scalar(args[0])
    if typing.get_origin(annotation) is Literal:
        return str, tuple(str(a) for a in typing.get_args(annotation))
    return annotation, None


def release_extra_args(items: list[str], version: SGLangVersion | None) -> tuple[str, ...]:
    """The argv items left over, checked against the release's own flag table."""
    if not items:
        return ()
    found = flags_for(version) if version is not None else None
    if found is None:
        raise ValueError(f"{items[0]}: not a server flag the memory model knows; "
                         "`expansion settings` lists those it does (server.*, as --flag-name)")
    release, table = found
    out: list[str] = []
    i = 0
    while i < len(items):
        name, equals, _ = items[i].partition("=")
        takes = table.get(name)
        if takes is None:
            raise ValueError(f"{name}: not a flag SGLang {release} accepts (its "
                             "server_args.py); check the spelling or --sglang-version")
        out.append(items[i])
        i += 1
        while takes != "none" and not equals and i < len(items) and not (
                items[i].startswith("--")):
            out.append(items[i])
            i += 1
            if takes == "one":
                break
    return tuple(out)


def unmodelled(flags: ServerFlags) -> list[str]:
    """The flags in extra_args that change nothing the memory or step model reads."""
    return [a.partition("=")[0] for a in flags.extra_args if a.startswith("--")
            and a.partition("=")[0] not in MODELLED_IN_EXTRA_ARGS]


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """Every ServerFlags field as SGLang's flag (defaults: unset, so ServerFlags decides)."""
    for name, info in ServerFlags.model_fields.items():
        if name in NOT_FLAGS:
            continue
        kind, choices = _scalar(info.annotation)
        if kind is bool:
            parser.add_argument(*flag_names(name), dest=name, action="store_true",
                                default=None, help=info.description)
        else:
            parser.add_argument(*flag_names(name), dest=name, type=kind, choices=choices,
                                default=None, help=info.description)


def flags_from(namespace: argparse.Namespace, **extra: Any) -> ServerFlags:
    """ServerFlags from parsed flags; fields not given keep ServerFlags' defaults."""
    given = {name: getattr(namespace, name) for name in ServerFlags.model_fields
             if name not in NOT_FLAGS and getattr(namespace, name, None) is not None}
    return ServerFlags(**given, **extra)


def parse_server_flags(argv: list[str], version: SGLangVersion | None = None) -> ServerFlags:
    """A pasted SGLang command line → ServerFlags; an unknown flag is a ValueError naming it.

    Launch-only flags (`--model-path`, `--host`, `--port`, ...) are accepted and ignored. With
    the targeted release, every other flag it accepts is carried in extra_args as given
    (`unmodelled` names those the model does not read)."""
    # no abbreviations: `--mem-fraction 0.9` is not silently `--mem-fraction-static`
    parser = argparse.ArgumentParser(prog="sglang flags", add_help=False, exit_on_error=False,
                                     allow_abbrev=False)
    add_server_flags(parser)
    # `expansion run`'s name for the strategy, so one spelling works in both commands (not
    # SGLang's: the simulator, which reads argv as SGLang does, refuses it)
    _, strategies = _scalar(ServerFlags.model_fields["mamba_strategy"].annotation)
    parser.add_argument("--mamba-strategy", dest="mamba_strategy", choices=strategies)
    for name in ("--model-path", "--model", "--host", "--port", "--api-key", "--config"):
        parser.add_argument(name)
    for name in MODELLED_IN_EXTRA_ARGS:
        parser.add_argument(name, dest=name, action="append", default=[])
    try:
        namespace, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise ValueError(f"{exc.argument_name}: {exc.message}") from None
    carried = tuple(item for name in MODELLED_IN_EXTRA_ARGS for value in getattr(namespace, name)
                    for item in (name, value))
    if unknown:
        carried += release_extra_args(unknown, version)
    return flags_from(namespace, **({"extra_args": carried} if carried else {}))
