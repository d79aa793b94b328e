"""Secrets move from argv into SGLang's --config YAML; the simulator reads it like SGLang."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.sglang.secret_config import (
    discard,
    hide_secrets,
    private_dir,
    secret_file_of,
    split_secret_flags,
)
from infra.sim.config import merge_config_file, parse_sim_args


def test_secret_flag_pairs_leave_argv_and_nothing_else_does() -> None:
    argv = ["python", "-m", "x", "--port", "1", "--api-key", "k1", "--model-path", "m"]
    public, hidden = split_secret_flags(argv, ("k1",))
    assert public == ["python", "-m", "x", "--port", "1", "--model-path", "m"]
    assert hidden == {"api-key": "k1"}
    assert split_secret_flags(argv, ()) == (argv, {})


def test_hidden_file_is_private_and_found_again_from_argv() -> None:
    argv, path = hide_secrets(["prog", "--api-key", "k: with 'quotes'"], ("k: with 'quotes'",))
    try:
        assert path is not None and argv == ["prog", "--config", str(path)]
        assert path.stat().st_mode & 0o777 == 0o600
        assert private_dir().stat().st_mode & 0o777 == 0o700
        assert yaml.safe_load(path.read_text()) == {"api-key": "k: with 'quotes'"}
        assert secret_file_of(argv) == path
    finally:
        discard(path)
    assert not path.exists()
    assert hide_secrets(["prog", "--port", "1"], ("k",)) == (["prog", "--port", "1"], None)


def test_a_users_own_config_file_is_never_treated_as_ours(tmp_path: Path) -> None:
    assert secret_file_of(["prog", "--config", str(tmp_path / "mine.yaml")]) is None


def test_simulator_merges_config_like_sglang_with_the_command_line_winning(
        tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api-key: sk-1\nport: 1111\nenable-metrics: true\ndisable-radix-cache: false\n")
    argv = ["--model-path", "m", "--config", str(cfg), "--port", "2222"]
    merged = merge_config_file(argv)
    assert merged == ["--api-key", "sk-1", "--port", "1111", "--enable-metrics",
                      "--model-path", "m", "--port", "2222"]
    parsed = parse_sim_args(argv, env={})
    assert parsed.api_key == "sk-1" and parsed.port == 2222 and parsed.flags.enable_metrics


@pytest.mark.parametrize(("name", "text", "message"), [
    ("c.json", "{}", "must be YAML"),
    ("missing.yaml", None, "not found"),
    ("list.yaml", "- a\n- b\n", "dictionary at root"),
])
def test_bad_config_file_gives_sglangs_error(tmp_path: Path, name: str, text: str | None,
                                             message: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=message):
        merge_config_file(["--config", str(path)])
