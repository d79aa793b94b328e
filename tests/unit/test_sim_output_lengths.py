"""Answers of a reasoning model: lengths spread lognormally, as a job can set them for the
simulator (`sim.output_mean_tokens`, `sim.output_p99_tokens`)."""

from __future__ import annotations

from typing import Any

import pytest

from infra.settings import load_settings
from infra.sim.config import parse_sim_args
from infra.sim.text import complete
from tasks.engines import LocalServers, build_engine


def test_lengths_follow_the_mean_and_p99_and_stop_at_max_new_tokens() -> None:
    sampling: dict[str, object] = {"max_new_tokens": 40000}
    lengths = sorted(complete(f"p{i}", sampling, 0, (2000, 16000)).completion_tokens
                     for i in range(3000))
    assert sum(lengths) / len(lengths) == pytest.approx(2000, rel=0.1)
    assert lengths[int(0.99 * len(lengths))] == pytest.approx(16000, rel=0.2)
    assert min(lengths) < 200 and max(lengths) > 16000  # two orders of magnitude
    capped = [complete(f"p{i}", {"max_new_tokens": 3000}, 0, (2000, 16000))
              for i in range(300)]
    assert max(c.completion_tokens for c in capped) == 3000
    assert {c.finish_reason for c in capped if c.completion_tokens == 3000} == {"length"}
    fixed = complete("p", {"max_new_tokens": 500, "ignore_eos": True}, 0, (2000, 16000))
    assert fixed.completion_tokens == 500  # ignore_eos still runs to max_new_tokens


def test_the_setting_reaches_the_simulated_server() -> None:
    settings = load_settings(None, engine="sim", **{"sim.output_mean_tokens": 2000,
                                                     "sim.output_p99_tokens": 16000})
    engine = build_engine(settings)
    assert isinstance(engine, LocalServers)
    env = engine.env()  # what the launcher gives it
    cfg = parse_sim_args(["--model-path", "Qwen/Qwen3.6-27B"], env)
    assert cfg.output_lengths == (2000, 16000)


@pytest.mark.parametrize("values,needle", [
    ({"sim.output_mean_tokens": 2000}, "go together"),
    ({"sim.output_mean_tokens": 2000, "sim.output_p99_tokens": 1500}, "must exceed")])
def test_half_a_distribution_is_refused(values: dict[str, int], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        load_settings(None, engine="sim", **values)


def test_the_simulated_server_runs_the_flags_the_plan_read_from_extra_args() -> None:
    """`--cuda-graph-max-bs` and `--load-format` are not ServerFlags fields: the plan reads them
    from extra_args. A simulated server that dropped them ran the 35B-A3B's cap of 313 eager
    (≈ 3,000 modeled tok/s where the plan said 5,153, real SGLang 5,422), and the simulated
    tuner rolled back a real gain."""
    from pathlib import Path

    from infra.sglang.flag_parser import parse_server_flags
    from infra.sglang.memory import plan_memory
    from infra.sglang.profiles import gpu_profile, model_profile
    from infra.sglang.roofline import build_roofline
    from infra.sglang.versions import parse_version

    q35 = str(Path(__file__).resolve().parents[2] / "bench" / "real_sglang" / "models"
              / "qwen3.6-35b-a3b-text")
    tail = ["--mamba-ssm-dtype", "bfloat16", "--load-format", "dummy",
            "--sampling-backend", "pytorch", "--cuda-graph-max-bs", "313"]
    cfg = parse_sim_args(["--model-path", q35, *tail], {})
    assert cfg.flags.graph_max_bs == 313
    assert cfg.flags.extra_args[:2] == ("--load-format", "dummy")
    model, gpu, v = model_profile(q35, 64.63), gpu_profile("h200"), parse_version("0.5.17")
    planned = parse_server_flags(tail, v)

    def step(flags: Any) -> float:
        plan = plan_memory(model, gpu, flags, v)
        return build_roofline(model, gpu, flags, plan).decode_step_s(313, 1150)

    assert step(cfg.flags) == pytest.approx(step(planned))
    eager = parse_server_flags(tail[:-2], v)
    assert step(eager) > 1.5 * step(cfg.flags)
