"""The typed input row: what the request path reads is a field; what the output carries is
every column the reader gave."""

from __future__ import annotations

from pathlib import Path

from infra.prompt_row import PromptRow
from infra.prompts import validate_input as validate
from tasks.shards import iter_pending_shards, make_plan


def test_a_read_row_keeps_every_column_and_types_what_a_request_reads() -> None:
    row = PromptRow.from_columns({"id": 7, "prompt": "p", "temperature": 0.3, "stop": "##",
                                  "topic": "x", "regex": None})
    assert (row.id, row.prompt, row.messages, row.input_ids) == (7, "p", None, None)
    assert row.sampling_overrides() == {"temperature": 0.3}
    assert row.stop == "##" and not row.constrained and row.grammar() == {}
    assert dict(row.columns) == {"id": 7, "prompt": "p", "temperature": 0.3, "stop": "##",
                                 "topic": "x", "regex": None}


def test_a_row_built_in_code_carries_its_id_and_what_it_sets() -> None:
    row = PromptRow("a", input_ids=[1, 2], ebnf="root ::= x")
    assert dict(row.columns) == {"id": "a", "input_ids": [1, 2], "ebnf": "root ::= x"}
    assert row.constrained and row.grammar() == {"ebnf": "root ::= x"}


def test_the_shard_reader_hands_typed_rows_with_the_ids_type_kept(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}], "k": 2}\n'
                    '{"id": 2, "messages": [{"role": "user", "content": "yo"}], "k": 3}\n')
    plan = make_plan(validate(path), 1)
    (_, first), (_, second) = iter_pending_shards(plan, [0, 1])
    assert isinstance(first[0], PromptRow) and first[0].id == 1
    assert first[0].messages == [{"role": "user", "content": "hi"}]
    assert second[0].columns["k"] == 3
