"""What the simulator honours of SGLang's output controls: stop strings and JSON schemas.

A stop string ends the completion where it first appears (SGLang trims it from the text and
reports it as `matched`). A JSON schema makes the completion an instance of the schema, as
SGLang's grammar backend would; the instance is drawn from the schema with the request's
random stream, so it is deterministic. Schemas use the subset generation jobs use (object,
array, string, integer, number, boolean, null, enum, const); anything else is refused with a
400 naming the keyword — regex and EBNF grammars too — rather than answered unconstrained.
"""

from __future__ import annotations

import json
import random
from typing import Any

SUPPORTED_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
IGNORED_KEYWORDS = ("title", "description", "$schema", "additionalProperties", "default",
                    "examples", "minimum", "maximum", "minLength", "maxLength", "minItems",
                    "maxItems", "format")


class SchemaUnsupported(ValueError):
    """The schema uses a keyword the simulator cannot honour."""


def parse_schema(raw: Any) -> dict[str, Any]:
    """SGLang takes json_schema as a JSON string; an object is accepted too."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise SchemaUnsupported(f"`json_schema` is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise SchemaUnsupported("`json_schema` must be a JSON object (or its JSON text)")
    check_schema(raw, "json_schema")
    return raw


def check_schema(schema: dict[str, Any], where: str) -> None:
    known = {"type", "properties", "required", "items", "enum", "const", *IGNORED_KEYWORDS}
    for key in schema:
        if key not in known:
            raise SchemaUnsupported(f"`{where}.{key}`: the simulated server does not "
                                    "implement this JSON-schema keyword (real SGLang does)")
    kind = schema.get("type")
    if kind is not None and kind not in SUPPORTED_TYPES:
        raise SchemaUnsupported(f"`{where}.type` {kind!r}: not one the simulator generates")
    for name, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{where}.properties.{name}")
    if isinstance(schema.get("items"), dict):
        check_schema(schema["items"], f"{where}.items")


def instance(schema: dict[str, Any], rng: random.Random, words: list[str]) -> Any:
    """A value that validates against `schema`."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if kind == "object":
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        return {name: instance(sub, rng, words) for name, sub in props.items()
                if name in required or rng.random() < 0.7}
    if kind == "array":
        return [instance(schema.get("items") or {}, rng, words) for _ in range(rng.randint(1, 3))]
    if kind == "integer":
        return rng.randint(0, 1000)
    if kind == "number":
        return round(rng.uniform(0, 100), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))


def cut_at_stop(words: list[str], stops: list[str]) -> tuple[list[str], str | None]:
    """The words before the first stop string (the word it ends in is trimmed with it), and
    the one matched: found in one pass over the joined text (this runs per request)."""
    text = " ".join(words)
    found = [(text.find(s) + len(s), s) for s in stops if s and s in text]
    if not found:
        return words, None
    end, stop = min(found)
    # the word in which the earliest match ends, counted by the spaces before that point
    return words[:text.count(" ", 0, end - 1)], stop


def output_controls(sampling: dict[str, Any]) -> dict[str, Any]:
    """Sampling parameters with `stop` as a list of strings and `json_schema` parsed;
    raises ValueError (a 400) for a malformed or unsupported one."""
    out = dict(sampling)
    stop = out.get("stop")
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif stop is not None and not (isinstance(stop, list)
                                   and all(isinstance(x, str) for x in stop)):
        raise ValueError("`stop` must be a string or a list of strings")
    if out.get("json_schema") is not None:
        out["json_schema"] = parse_schema(out["json_schema"])
    return out
