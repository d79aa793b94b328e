"""The output folder is the manifest: atomic shards, append-only manifest, fixed plan."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from infra.manifest import Manifest, PlanMismatch, file_sha256, make_plan
from infra.prompts import validate_input
from tasks.shards import iter_pending_shards, prepare_job
from tests.rows import answered, failed


def write_prompts(path: Path, n: int, prefix: str = "p") -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "prompt": f"q {i}"}) + "\n"
                            for i in range(n)))
    return path


def test_plan_is_fixed_and_resume_against_other_input_fails(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "a.jsonl", 25)
    state = prepare_job(prompts, tmp_path / "out", 10)
    assert state.shard_plan.num_shards == 3 and state.pending == [0, 1, 2]
    again = prepare_job(prompts, tmp_path / "out", 10)
    assert again.shard_plan == state.shard_plan
    other = write_prompts(tmp_path / "b.jsonl", 25, prefix="x")
    with pytest.raises(PlanMismatch, match="holds a run over other input"):
        prepare_job(other, tmp_path / "out", 10)
    with pytest.raises(PlanMismatch):
        prepare_job(prompts, tmp_path / "out", 5)


def test_commit_writes_shard_then_manifest(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "a.jsonl", 4)
    manifest = Manifest(tmp_path / "out")
    plan = manifest.init_plan(make_plan(validate_input(prompts), 2))
    rows = [answered("p0", "x", 3), answered("p1", "y", 4)]
    entry = manifest.commit_shard(plan, 0, rows, [])
    assert entry.rows == 2 and entry.output_tokens == 7
    assert entry.sha256 == file_sha256(tmp_path / "out" / entry.path)
    assert pl.read_parquet(tmp_path / "out" / entry.path)["id"].to_list() == ["p0", "p1"]
    assert set(manifest.committed()) == {0}


def test_errors_go_to_their_own_shard(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "a.jsonl", 2)
    manifest = Manifest(tmp_path / "out")
    plan = manifest.init_plan(make_plan(validate_input(prompts), 2))
    entry = manifest.commit_shard(plan, 0, [answered("p0")], [failed("p1", "HTTP 400: too long")])
    assert entry.errors == 1 and entry.error_path == "errors/shard-000000.parquet"
    errs = pl.read_parquet(tmp_path / "out" / entry.error_path)
    assert errs["error"].to_list() == ["HTTP 400: too long"]


def test_uncommitted_files_and_temp_files_are_strays(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "a.jsonl", 4)
    state = prepare_job(prompts, tmp_path / "out", 2)
    manifest = Manifest(tmp_path / "out")
    manifest.commit_shard(state.shard_plan, 0, [answered("p0"), answered("p1")], [])
    (manifest.shards_dir / "shard-000001.parquet").write_bytes(b"renamed but not in manifest")
    (manifest.shards_dir / ".shard-000001.parquet.tmp").write_bytes(b"half")
    state = prepare_job(prompts, tmp_path / "out", 2)
    assert state.removed_strays == 2 and state.pending == [1]
    assert sorted(p.name for p in manifest.shards_dir.iterdir()) == ["shard-000000.parquet"]


def test_torn_manifest_line_is_cut_and_shard_redone(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "a.jsonl", 4)
    state = prepare_job(prompts, tmp_path / "out", 2)
    manifest = Manifest(tmp_path / "out")
    manifest.commit_shard(state.shard_plan, 0, [answered("p0"), answered("p1")], [])
    with open(manifest.manifest_path, "a") as fh:
        fh.write('{"shard": 1, "rows": 2')
    state = prepare_job(prompts, tmp_path / "out", 2)
    assert state.pending == [1]
    assert manifest.manifest_path.read_text().endswith("\n")


def test_pending_shards_stream_in_order_skipping_committed(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "a.jsonl", 7)
    plan = make_plan(validate_input(prompts), 3)
    got = [(s, [r.id for r in rows]) for s, rows in iter_pending_shards(plan, [0, 2])]
    assert got == [(0, ["p0", "p1", "p2"]), (2, ["p6"])]


def _committed_job(tmp_path: Path, prompts: Path) -> Path:
    state = prepare_job(prompts, tmp_path / "out", 2)
    manifest = Manifest(tmp_path / "out")
    manifest.commit_shard(state.shard_plan, 0, [answered("p0", "a", 1, model=None),
                                        answered("p1", "b", 5, finish_reason="length",
                                                 model=None)], [])
    manifest.commit_shard(state.shard_plan, 1, [answered("p2", "c", 1, model=None)],
                        [failed("p3", "HTTP 400: too long")])
    return tmp_path / "out"


def _exported(output: Path, target: Path) -> dict[str, dict]:
    from infra.export import export_openai_batch

    assert export_openai_batch(output, target, "m") == 4
    assert [p.name for p in target.parent.iterdir() if p.name.endswith(".tmp")] == []
    return {line["custom_id"]: line for line in map(json.loads, target.read_text().splitlines())}


def test_openai_batch_export_of_chat_rows_reads_as_chat_completions(tmp_path: Path) -> None:
    prompts = tmp_path / "a.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [
        {"role": "user", "content": f"q {i}"}]}) + "\n" for i in range(4)))
    by_id = _exported(_committed_job(tmp_path, prompts), tmp_path / "batch_output.jsonl")
    assert set(by_id) == {"p0", "p1", "p2", "p3"}
    ok = by_id["p1"]["response"]["body"]
    assert ok["choices"][0]["message"]["content"] == "b"
    assert ok["choices"][0]["finish_reason"] == "length" and ok["usage"]["total_tokens"] == 7
    assert by_id["p3"]["response"] is None and "too long" in by_id["p3"]["error"]["message"]
    # the body is what the openai SDK reads as a ChatCompletion
    from openai.types.chat import ChatCompletion

    parsed = ChatCompletion.model_validate(ok)
    assert parsed.id == "chatcmpl-p1" and parsed.created > 1_700_000_000


def test_openai_batch_export_of_prompt_rows_reads_as_text_completions(tmp_path: Path) -> None:
    """Prompt rows (the pipeline's own, or /v1/completions batch rows) are sent as raw text,
    no chat template: they answer as `text_completion`, which the SDK reads as a Completion."""
    prompts = tmp_path / "a.jsonl"
    prompts.write_text("".join(json.dumps({
        "custom_id": f"p{i}", "method": "POST", "url": "/v1/completions",
        "body": {"model": "m", "prompt": f"q {i}", "max_tokens": 5}}) + "\n" for i in range(4)))
    by_id = _exported(_committed_job(tmp_path, prompts), tmp_path / "batch_output.jsonl")
    ok = by_id["p1"]["response"]["body"]
    from openai.types import Completion

    parsed = Completion.model_validate(ok)
    assert parsed.object == "text_completion" and parsed.choices[0].text == "b"
    assert parsed.choices[0].finish_reason == "length" and parsed.id == "cmpl-p1"
    assert by_id["p3"]["error"]["message"] == "HTTP 400: too long"


def test_export_refuses_a_folder_or_a_missing_parent_before_reading(tmp_path: Path) -> None:
    from infra.export import export_target_problem

    assert "is a folder; give a file path" in (export_target_problem(tmp_path) or "")
    assert "does not exist" in (export_target_problem(tmp_path / "no" / "x.jsonl") or "")
    assert export_target_problem(tmp_path / "x.jsonl") is None
