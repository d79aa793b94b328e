"""The replay advances the modeled server from event to event (a completion, the KV pool's
edge), the decode steps between summed in closed form (`Roofline.decode_steps_s`); stepping
every decode step is the oracle. The two agree within 1 % on committed tok/s, steady rate and
retractions over fixed lengths, lognormal tails, n samples, a retracting pool, MTP's fractional
tokens a step, an MoE at a cap past the default graphs and an MoE family no fit has seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import ModelProfile, gpu_profile, model_profile
from infra.sglang.roofline import build_roofline
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload
from infra.sim.replay import replay_requests, replay_requests_exact

H200, V0517 = gpu_profile("h200"), parse_version("0.5.17")
Q27 = model_profile("Qwen/Qwen3.6-27B")
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
REAL_MODELS = Path(__file__).resolve().parents[2] / "bench" / "real_sglang" / "models"
Q35 = model_profile(str(REAL_MODELS / "qwen3.6-35b-a3b-text"), 64.63)  # MoE, 256 experts
NH30 = model_profile(str(MODELS / "nemotron-3-nano-30b-a3b" / "config.json"), 58.9)
NB = ServerFlags(mamba_strategy="no_buffer", mem_fraction_static=0.9)
MTP = ServerFlags(speculative_algorithm="EAGLE", speculative_num_steps=3,
                  speculative_eagle_topk=1, mem_fraction_static=0.9)
BF16_GRAPHS = ServerFlags(mamba_strategy="no_buffer", mamba_ssm_dtype="bfloat16",
                          extra_args=("--cuda-graph-max-bs", "320"))
CORPUS: dict[str, tuple[ServerFlags, Workload, int, int, ModelProfile]] = {
    "fixed 1024+256, no_buffer": (NB, Workload(1024, 256), 3, 1, Q27),
    "fixed 1024+256, extra_buffer": (ServerFlags(mem_fraction_static=0.9), Workload(1024, 256),
                                     3, 1, Q27),
    "lognormal 600/p99 3000": (NB, Workload(512, 600, 3000), 4, 1, Q27),
    "n=4 samples of each prompt": (NB, Workload(256, 300, 1500), 2, 4, Q27),
    "a pool that retracts": (NB.with_changes(max_total_tokens=60000, max_running_requests=60),
                             Workload(512, 900, 4000), 3, 1, Q27),
    "MTP: 2.x tokens a step": (MTP, Workload(1024, 400, 2000), 3, 1, Q27),
    "MoE at cap 313, graphs raised": (BF16_GRAPHS, Workload(1024, 300, 1500), 2, 1, Q35),
    "unseen NemotronH MoE, defaults": (ServerFlags(), Workload(1024, 300, 1500), 2, 1, NH30),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_events_agree_with_the_step_by_step_oracle_within_1_percent(name: str) -> None:
    flags, workload, rounds, samples, model = CORPUS[name]
    cap = plan_memory(model, H200, flags, V0517).max_running_requests
    clients = cap + 4
    rows = [(workload.prompt_tokens, out) for out in workload.output_lengths(rounds * clients)
            for _ in range(samples)]
    oracle = replay_requests_exact(model, H200, flags, V0517, rows, clients)
    events = replay_requests(model, H200, flags, V0517, rows, clients)
    assert events.answered == oracle.answered == len(rows)
    assert events.committed_tok_s == pytest.approx(oracle.committed_tok_s, rel=0.01)
    assert events.steady_tok_s == pytest.approx(oracle.steady_tok_s, rel=0.01)
    assert events.retracted == pytest.approx(oracle.retracted, rel=0.01)
    if name == "a pool that retracts":
        assert oracle.retracted > 0


def test_the_closed_form_sum_is_the_steps_added_one_by_one() -> None:
    roof = build_roofline(Q27, H200, NB, plan_memory(Q27, H200, NB, V0517))
    one_by_one = sum(roof.decode_step_s(80, 1500.0 + i) for i in range(300))
    assert roof.decode_steps_s(80, 1500.0, 300, 1.0) == pytest.approx(one_by_one, rel=1e-9)
