"""Built-in model and GPU profiles: the shapes the memory model and the simulator need.

Model shapes follow ../shared/sglang-reference.md §3.1 (public HF configs); GPU totals are the
`nvidia-smi` MiB figures SGLang reads. A HF `config.json` can stand in for a built-in model
(hf_config.py reads it); the profile types themselves are in shapes.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from infra.sglang.hf_config import profile_from_hf_config
from infra.sglang.shapes import GIB as GIB
from infra.sglang.shapes import MIB as MIB
from infra.sglang.shapes import GpuProfile as GpuProfile
from infra.sglang.shapes import MambaShape
from infra.sglang.shapes import ModelProfile as ModelProfile

_QWEN35_27B_MAMBA = MambaShape(num_heads=48, head_dim=128, state_size=128, n_groups=16,
                               conv_kernel=4)

_QWEN36_27B = ModelProfile(
    name="Qwen/Qwen3.6-27B", architecture="Qwen3_5ForConditionalGeneration",
    num_layers=64, num_linear_layers=48, num_kv_heads=4, head_dim=256, v_head_dim=256,
    weights_gib=51.74, context_length=262144, mamba=_QWEN35_27B_MAMBA,
    vlm_mem_factor=0.925, active_params_b=27.0, vocab_size=248320,
)

MODELS: dict[str, ModelProfile] = {
    "qwen3.6-27b": _QWEN36_27B,
    # FP8 checkpoint: ~1 byte/param for the linear layers, bf16 embeddings, ViT and norms.
    "qwen3.6-27b-fp8": replace(_QWEN36_27B, name="Qwen/Qwen3.6-27B-FP8", weights_gib=27.5),
    "qwen3.5-27b": replace(_QWEN36_27B, name="Qwen/Qwen3.5-27B"),  # same shapes (§3.1)
    "qwen3-next-80b-a3b": ModelProfile(
        name="Qwen/Qwen3-Next-80B-A3B-Instruct", architecture="Qwen3NextForCausalLM",
        num_layers=48, num_linear_layers=36, num_kv_heads=2, head_dim=256, v_head_dim=256,
        weights_gib=148.5, context_length=262144,
        mamba=MambaShape(num_heads=32, head_dim=128, state_size=128, n_groups=16, conv_kernel=4),
        active_params_b=3.0, vocab_size=151936,
    ),
    # Dense contrast: every layer is full attention, so only the KV pool can bind.
    "qwen3-32b": ModelProfile(
        name="Qwen/Qwen3-32B", architecture="Qwen3ForCausalLM",
        num_layers=64, num_linear_layers=0, num_kv_heads=8, head_dim=128, v_head_dim=128,
        weights_gib=61.0, context_length=40960, active_params_b=32.0, draft_layers=0,
        vocab_size=151936,
    ),
    # Small dense model for quick simulated runs.
    "qwen2.5-0.5b": ModelProfile(
        name="Qwen/Qwen2.5-0.5B-Instruct", architecture="Qwen2ForCausalLM",
        num_layers=24, num_linear_layers=0, num_kv_heads=2, head_dim=64, v_head_dim=64,
        weights_gib=0.92, context_length=32768, active_params_b=0.5, draft_layers=0,
        vocab_size=151936,
    ),
}

GPUS: dict[str, GpuProfile] = {
    "b200": GpuProfile("B200", total_mib=183359, bandwidth_gbs=8000, bf16_tflops=2250,
                       generation="blackwell"),
    "rtx-pro-6000": GpuProfile("RTX PRO 6000 Blackwell", total_mib=97887, bandwidth_gbs=1792,
                               bf16_tflops=500, generation="blackwell"),
    # context_gib measured: "Load weight begin. avail mem=139.13 GB" of 140.40 (SGLang 0.5.17,
    # torch 2.11 + CUDA 13.0; docs/REAL_SGLANG.md).
    "h200": GpuProfile("H200", total_mib=143771, bandwidth_gbs=4800, bf16_tflops=989,
                       context_gib=1.27, generation="hopper"),
    # context_gib measured: "Load weight begin. avail mem=78.50 GB" of 79.65 on every H100 run
    # (bench/real_sglang/data/*-h100-*).
    "h100": GpuProfile("H100 80GB", total_mib=81559, bandwidth_gbs=3350, bf16_tflops=989,
                       context_gib=1.15, generation="hopper"),
}


def _key(name: str) -> str:
    return name.strip().lower().rsplit("/", 1)[-1].removesuffix("-instruct")


def gpu_profile(name: str) -> GpuProfile:
    """Look up a GPU by profile key (`b200`, `rtx-pro-6000`, `h200`, `h100`)."""
    key = name.strip().lower().replace(" ", "-").replace("_", "-")
    if key not in GPUS:
        raise ValueError(f"gpu: unknown GPU profile {name!r}; use one of {', '.join(GPUS)}")
    return GPUS[key]


def model_profile(name_or_path: str, weights_gib: float | None = None) -> ModelProfile:
    """A built-in profile by HF id or key, or a profile read from a HF `config.json` path."""
    path = Path(name_or_path)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        return profile_from_hf_config(path, weights_gib)
    key = _key(name_or_path)
    if key not in MODELS:
        raise ValueError(
            f"model: no built-in profile for {name_or_path!r}; use one of "
            f"{', '.join(m.name for m in MODELS.values())} or a path to a HF config.json"
        )
    profile = MODELS[key]
    return replace(profile, weights_gib=weights_gib) if weights_gib else profile
