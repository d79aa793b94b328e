"""What every `expansion` command shares: the Typer app, the consoles, one-line failures and
the parsing of `--set KEY=VALUE` and `--gpus`."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

app = typer.Typer(
    help="Huge offline generation jobs on SGLang fleets, as a restartable Prefect flow.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console() if sys.stdout.isatty() else Console(width=160)
err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=1000)


def fail(message: str, code: int = 2) -> None:
    from rich.markup import escape

    # escaped: a message's own brackets ('expansion[sglang]', a list) are text, not markup
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    from infra.settings import NULL

    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            fail(f"--set {pair!r}: expected KEY=VALUE, e.g. --set server.mem_fraction_static=0.9")
        key, raw = pair.split("=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = NULL if value is None else value
    return out


def parse_gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"--gpus {text!r}: expected GPU indices like 0,1,2")
    return None
