"""Stop strings and JSON schemas are honoured by the simulator as SGLang honours them; regex
and EBNF grammars, which it cannot generate from, are refused with a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "n": {"type": "integer"},
                                           "kind": {"enum": ["a", "b"]}},
          "required": ["name", "n", "kind"]}


def generate(url: str, **params: Any) -> httpx.Response:
    return httpx.post(f"{url}/generate", json={"text": "Tell me about caches",
                                               "sampling_params": {"max_new_tokens": 64,
                                                                   **params}}, timeout=30)


def test_json_schema_output_validates(sim_url: str) -> None:
    for seed in range(5):
        answer = generate(sim_url, json_schema=json.dumps(SCHEMA), sampling_seed=seed)
        assert answer.status_code == 200, answer.text
        jsonschema.validate(json.loads(answer.json()["text"]), SCHEMA)
    chat = httpx.post(f"{sim_url}/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 64,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s",
                                                                   "schema": SCHEMA}}})
    assert chat.status_code == 200, chat.text
    jsonschema.validate(json.loads(chat.json()["choices"][0]["message"]["content"]), SCHEMA)


def test_stop_string_ends_the_text_and_is_reported(sim_url: str) -> None:
    answers = [generate(sim_url, stop=["cache"], sampling_seed=s).json() for s in range(8)]
    stopped = [a for a in answers if a["meta_info"]["finish_reason"].get("matched") == "cache"]
    assert stopped, "a common word should stop some of eight completions"
    for a in answers:
        assert "cache" not in a["text"]
        assert a["meta_info"]["completion_tokens"] == len(a["output_ids"])


def test_regex_and_ebnf_are_refused_not_ignored(sim_url: str) -> None:
    for field in ("regex", "ebnf"):
        answer = generate(sim_url, **{field: "[a-z]+"})
        assert answer.status_code == 400 and f"sampling_params.{field}" in answer.text
    bad = generate(sim_url, json_schema=json.dumps({"type": "object", "oneOf": []}))
    assert bad.status_code == 400 and "json_schema.oneOf" in bad.text
