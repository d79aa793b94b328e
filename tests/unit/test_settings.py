"""Settings come from TOML, .env, env vars and overrides; bad values name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import SettingsError, load_settings


def test_defaults_run_the_embedded_demo() -> None:
    s = load_settings()
    assert s.engine == "sim" and s.gpus == [0, 1]
    assert s.prompts.is_file()


def test_precedence_override_over_env_over_toml(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "job.toml"
    toml.write_text('gpus = [0, 1, 2, 3]\nshard_size = 50\n[server]\n'
                    'mem_fraction_static = 0.8\nmamba_strategy = "no_buffer"\n')
    monkeypatch.setenv("EXPANSION_SHARD_SIZE", "70")
    s = load_settings(toml, **{"server.mem_fraction_static": 0.9})
    assert s.gpus == [0, 1, 2, 3]
    assert s.shard_size == 70
    assert s.server.mem_fraction_static == 0.9
    assert s.server.mamba_strategy == "no_buffer"


def test_env_nested_and_comma_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPANSION_GPUS", "0,2,5")
    monkeypatch.setenv("EXPANSION_SERVER__MAX_RUNNING_REQUESTS", "64")
    s = load_settings()
    assert s.gpus == [0, 2, 5] and s.server.max_running_requests == 64


def test_dotenv_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("EXPANSION_SHARD_SIZE=33\n")
    monkeypatch.chdir(tmp_path)
    assert load_settings().shard_size == 33


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("server.mem_fraction_static", 1.5, "server.mem_fraction_static: Input should be less than 1"),
    ("server.mem_fraction_static", 0, "server.mem_fraction_static: Input should be greater"),
    ("gpus", [0, 0], "gpus: GPU indices must be distinct"),
    ("engine", "tgi", "engine: Input should be 'sim', 'sglang', 'external' or 'vllm'"),
    ("nonsense", 1, "nonsense: unknown setting"),
    ("shard_size", 0, "shard_size: Input should be greater than or equal to 1"),
])
def test_invalid_values_name_the_field(key: str, value: object, needle: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(None, **{key: value})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_or_bad_toml_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("gpus = [0,\n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(bad)


def test_api_key_is_secret() -> None:
    s = load_settings(api_key="hunter2")
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())


def test_capacity_row_keeps_measured_and_requested_apart() -> None:
    """A restart that requested 256 running requests got 85: the artifact must say 85."""
    from flows.progress import capacity_row
    from tasks.capacity import Capacity

    settings = load_settings(None, **{"server": {"max_running_requests": 256}})
    cap = Capacity(index=0, url="http://h:1", version="0.5.17", max_running_requests=85,
                   max_total_num_tokens=1000, max_mamba_cache_size=255, context_len=None,
                   fingerprint="abc")
    row = capacity_row(settings.server, cap)
    assert row["max_running_requests"] == 85
    assert row["requested_max_running_requests"] == 256
