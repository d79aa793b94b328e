"""The launch command builder emits the flags each SGLang version accepts."""

from __future__ import annotations

import itertools

import pytest

from infra.sglang.flags import ServerFlags
from infra.sglang.launch import LaunchSpec, UnsupportedFlags, server_args
from infra.sglang.versions import parse_version

V0523 = parse_version("0.5.23")
V0511 = parse_version("0.5.11")


def args(flags: ServerFlags, version=V0523, api_key: str | None = None) -> list[str]:
    return server_args(flags, version, model="Qwen/Qwen3.6-27B", host="127.0.0.1",
                       port=30000, api_key=api_key)


def test_every_lever_is_emitted() -> None:
    flags = ServerFlags(mem_fraction_static=0.9, max_running_requests=128,
                        mamba_strategy="extra_buffer", max_mamba_cache_size=200,
                        mamba_full_memory_ratio=0.6, context_length=32768,
                        speculative_algorithm="EAGLE", speculative_num_steps=3,
                        speculative_eagle_topk=1)
    a = args(flags)
    pairs = dict(itertools.pairwise(a))
    assert pairs["--mem-fraction-static"] == "0.9"
    assert pairs["--max-running-requests"] == "128"
    assert pairs["--mamba-radix-cache-strategy"] == "extra_buffer"
    assert pairs["--max-mamba-cache-size"] == "200"
    assert pairs["--mamba-full-memory-ratio"] == "0.6"
    assert pairs["--context-length"] == "32768"
    assert pairs["--speculative-algorithm"] == "EAGLE"
    assert "--enable-metrics" in a


def test_old_versions_get_the_old_strategy_flag() -> None:
    a = args(ServerFlags(mamba_strategy="extra_buffer"), V0511)
    assert "--mamba-scheduler-strategy" in a and "--mamba-radix-cache-strategy" not in a


def test_explicit_no_buffer_on_new_builds_disables_overlap() -> None:
    assert "--disable-overlap-schedule" in args(ServerFlags(mamba_strategy="no_buffer"))
    assert "--disable-overlap-schedule" not in args(ServerFlags(mamba_strategy="no_buffer"),
                                                    V0511)


def test_old_build_rejects_no_buffer_with_mtp() -> None:
    flags = ServerFlags(mamba_strategy="no_buffer", speculative_algorithm="EAGLE")
    with pytest.raises(UnsupportedFlags, match="extra_buffer"):
        args(flags, V0511)


def test_lazy_with_speculative_is_rejected() -> None:
    with pytest.raises(UnsupportedFlags, match="extra_buffer_lazy"):
        args(ServerFlags(mamba_strategy="extra_buffer_lazy", speculative_algorithm="EAGLE"))


def test_argv_is_a_list_and_the_api_key_is_redacted_in_the_shell_line() -> None:
    a = args(ServerFlags(), api_key="s3cret")
    spec = LaunchSpec(index=0, gpu=0, host="127.0.0.1", port=30000,
                      argv=("python", "-m", "sglang.launch_server", *a), secrets=("s3cret",))
    assert "s3cret" in spec.argv
    assert "s3cret" not in spec.shell_line()
    assert spec.shell_line().startswith("python -m sglang.launch_server --model-path")


def test_sim_and_sglang_share_the_flags_and_differ_in_their_adapters() -> None:
    from infra.settings import load_settings
    from tasks.engines import build_engine
    from tasks.engines.sglang import RealSGLang
    from tasks.engines.sim import SimulatedSGLang

    a = args(ServerFlags(mem_fraction_static=0.8))
    assert "--mem-fraction-static" in a
    sim = load_settings(None, engine="sim", python="py", sglang_version="0.5.17",
                        **{"sim.gpu": "h200", "sim.time_scale": 7.0})
    real = sim.model_copy(update={"engine": "sglang"})
    sim_engine, real_engine = build_engine(sim), build_engine(real)
    assert isinstance(sim_engine, SimulatedSGLang)
    assert isinstance(real_engine, RealSGLang)
    assert sim_engine.program() == ["py", "-m", "infra.sim"]
    assert real_engine.program() == ["py", "-m", "sglang.launch_server"]
    assert (sim_engine.time_scale(), real_engine.time_scale()) == (7.0, 1.0)
    assert sim_engine.gpu_name() == "h200"
    assert real_engine.gpu_name() == real.gpu_type  # what the user says it is
    assert sim_engine.env()["EXPANSION_SIM_GPU"] == "h200"
    assert real_engine.env() == {}
    assert real_engine.checks_gpu_memory_after_stop


def test_unknown_version_string_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="sglang_version"):
        parse_version("banana")
    with pytest.raises(ValueError, match="older than"):
        parse_version("0.1.0")


def test_server_ports_in_the_ephemeral_range_are_warned_about(tmp_path) -> None:
    from infra.processes import ephemeral_port_range, ephemeral_port_warning

    assert ephemeral_port_warning([30000, 30001], span=(32768, 60999)) is None
    warning = ephemeral_port_warning([32767, 32768, 32769], span=(32768, 60999))
    assert warning is not None and warning.startswith("base_port: server port(s) 32768–32769")
    assert "below 32768" in warning
    range_file = tmp_path / "range"
    range_file.write_text("40000\t50000\n")
    assert ephemeral_port_range(range_file) == (40000, 50000)
    range_file.write_text("garbage")
    assert ephemeral_port_range(range_file) is None


def test_a_users_config_flag_cannot_be_combined_with_an_api_key() -> None:
    import pytest

    from infra.sglang.launch import UnsupportedFlags

    flags = ServerFlags(extra_args=("--config", "mine.yaml"))
    assert "--config" in args(flags)
    with pytest.raises(UnsupportedFlags, match=r"^server\.extra_args: --config"):
        args(flags, api_key="k")
