"""The bad-input matrix at the CLI: one clear line naming what is wrong, exit ≠ 0, and no
output folder left behind. The matrix runs the Typer app in-process (CliRunner: a second each
less than a Python start); two cases go through the real entry point as subprocesses, so
`python -m expansion.cli` itself stays proven. (More cases at function level: test_prompts,
test_settings, test_launch, test_faults, test_observe.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def jsonl(rows: list[object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


CASES: list[tuple[str, str | bytes | None, list[str], str]] = [
    ("missing-file", None, [], "does not exist"),
    ("wrong-suffix.csv", "id,prompt\n1,a\n", [], "must end in .jsonl or .parquet"),
    ("malformed.jsonl", '{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": \n', [], "prompts:"),
    ("dup.jsonl", jsonl([{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}]), [],
     "duplicate id"),
    ("empty-prompt.jsonl", jsonl([{"id": 1, "prompt": ""}]), [], "empty prompt"),
    ("no-id.jsonl", jsonl([{"prompt": "a"}]), [], "no `id` column"),
    ("latin1.jsonl", b'{"id": 1, "prompt": "caf\xe9"}\n', [], "not UTF-8"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--mem-fraction-static", "1.5"],
     "server.mem_fraction_static"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--set", "bogus=1"], "bogus: unknown"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--gpus", "a,b"], "--gpus"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--engine", "tgi"], "engine:"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--set", "sglang_version=banana"],
     "sglang_version"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--model", "nope/Nope-1B"],
     "no built-in profile"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--set", "sim.gpu=tpu-v5"],
     "unknown GPU profile"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]),
     ["--mamba-strategy", "extra_buffer_lazy", "--set", "server.speculative_algorithm=EAGLE"],
     "extra_buffer_lazy"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--output", "s3://"], "output"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--config", "missing.toml"],
     "does not exist"),
    # where the job writes, checked before Prefect starts (#27: these were tracebacks 20–40 s in)
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--output", "ok.jsonl"],
     "is a file; give a folder path"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--output", "ok.jsonl/sub"],
     "which is a file; choose another path"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]),
     ["--upload-to", "s3://bkt/x", "--set", "storage.endpoint_url=http://127.0.0.1:9"],
     "upload_to: "),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]),
     ["--output", "s3://bkt/x", "--set", "storage.endpoint_url=http://127.0.0.1:9"],
     "output: "),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]),
     ["--engine", "sglang", "--set", "sglang_version=0.5.17", "--set", "python=/no/python"],
     "python: SGLang is not installed for /no/python; install 'expansion[sglang]'"),
    # servers someone else runs (engine=external): named, and asked before anything starts
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--engine", "external"],
     "server_urls: engine=external needs the servers' URLs"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]),
     ["--engine", "external", "--server-urls", "node1:30000"],
     "'node1:30000' is not a URL; give http://host:port"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]),
     ["--engine", "external", "--server-urls", "http://127.0.0.1:9"],
     "server_urls: http://127.0.0.1:9 does not answer (ConnectError); start it or fix the URL"),
    ("ok.jsonl", jsonl([{"id": 1, "prompt": "a"}]), ["--server-urls", "http://127.0.0.1:9"],
     "server_urls: only for engine=external"),
]


def write_input(tmp_path: Path, name: str, content: str | bytes | None) -> Path:
    prompts = tmp_path / name
    if isinstance(content, bytes):
        prompts.write_bytes(content)
    elif content is not None:
        prompts.write_text(content)
    return prompts


def assert_one_clear_line(code: int, stderr: str, needle: str, out: Path) -> None:
    assert code != 0
    message = stderr.strip()
    assert needle in message, message
    assert "Traceback" not in message
    assert message.startswith("error:") and len(message.splitlines()) <= 3  # wrapped, one error
    assert not out.exists()


@pytest.mark.parametrize(("name", "content", "extra", "needle"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_clear_line_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
        content: str | bytes | None, extra: list[str], needle: str) -> None:
    from typer.testing import CliRunner

    from expansion.cli import app

    prompts, out = write_input(tmp_path, name, content), tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--prompts", str(prompts), "--output", str(out),
                                      *extra])
    assert_one_clear_line(result.exit_code, result.stderr, needle, out)


@pytest.mark.parametrize("case", [CASES[0], CASES[7]], ids=["missing-file", "bad-setting"])
def test_the_entry_point_gives_the_same_line(
        tmp_path: Path, case: tuple[str, str | bytes | None, list[str], str]) -> None:
    name, content, extra, needle = case
    prompts, out = write_input(tmp_path, name, content), tmp_path / "out"
    args = [sys.executable, "-m", "expansion.cli", "run", "--prompts", str(prompts),
            "--output", str(out), *extra]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert_one_clear_line(proc.returncode, proc.stderr, needle, out)


@pytest.mark.parametrize(("urls", "needle"), [
    (["127.0.0.1:9"], "127.0.0.1:9: a server URL needs its scheme: http://127.0.0.1:9"),
    (["http://127.0.0.1:9"], "no server answered at http://127.0.0.1:9"),
])
def test_diagnose_of_a_bad_url_is_one_line(urls: list[str], needle: str) -> None:
    from typer.testing import CliRunner

    from expansion.cli import app

    result = CliRunner().invoke(app, ["diagnose", *urls])
    assert result.exit_code != 0
    assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 3
