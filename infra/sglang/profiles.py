"""Built-in model and GPU profiles: the shapes the memory model and the simulator need.

Model shapes follow ../shared/sglang-reference.md §3.1 (public HF configs); GPU totals are the
`nvidia-smi` MiB figures SGLang reads. A HF `config.json` can stand in for a built-in model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class MambaShape:
    """Per-layer linear-attention (GDN / Mamba2) state shape, in SGLang's Mamba2 terms."""

    num_heads: int  # value heads (GDN) / mamba heads
    head_dim: int  # value head dim
    state_size: int  # key head dim (GDN) / ssm_state_size
    n_groups: int  # key heads (GDN) / mamba n_groups
    conv_kernel: int


@dataclass(frozen=True)
class ModelProfile:
    """What the memory model and the simulator's roofline need to know about a model."""

    name: str
    architecture: str
    num_layers: int
    num_linear_layers: int  # 0 for a dense model
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    weights_gib: float  # resident target weights (incl. ViT/MTP head as loaded)
    context_length: int
    mamba: MambaShape | None = None
    draft_layers: int = 1  # MTP next-n layers used by EAGLE/NEXTN
    vlm_mem_factor: float = 1.0  # SGLang's multimodal mem_fraction_static multiplier
    ssm_dtype_bytes: int = 4  # config mamba_ssm_dtype (float32 unless stated)
    mtp_accept_len: float = 3.2  # typical accept length with steps 3 / topk 1
    active_params_b: float = 0.0  # billions of parameters touched per token (for compute)

    @property
    def hybrid(self) -> bool:
        return self.mamba is not None and self.num_linear_layers > 0

    @property
    def num_full_layers(self) -> int:
        return self.num_layers - self.num_linear_layers

    @property
    def family(self) -> str:
        """The kernels its linear layers run, which set their speed: `gdn` (Qwen3-Next,
        Qwen3.5/3.6: gated delta net), `mamba2` (NemotronH), or `dense`."""
        if not self.hybrid:
            return "dense"
        return "mamba2" if self.architecture.startswith("NemotronH") else "gdn"


@dataclass(frozen=True)
class GpuProfile:
    """A GPU as SGLang sees it: total memory from nvidia-smi, plus roofline figures."""

    name: str
    total_mib: int
    bandwidth_gbs: float  # HBM/GDDR bandwidth, GB/s
    bf16_tflops: float
    context_gib: float = 1.0  # CUDA context + NCCL, charged before weights load

    @property
    def total_gib(self) -> float:
        return self.total_mib * MIB / GIB


_QWEN35_27B_MAMBA = MambaShape(num_heads=48, head_dim=128, state_size=128, n_groups=16,
                               conv_kernel=4)

_QWEN36_27B = ModelProfile(
    name="Qwen/Qwen3.6-27B", architecture="Qwen3_5ForConditionalGeneration",
    num_layers=64, num_linear_layers=48, num_kv_heads=4, head_dim=256, v_head_dim=256,
    weights_gib=51.74, context_length=262144, mamba=_QWEN35_27B_MAMBA,
    vlm_mem_factor=0.925, active_params_b=27.0,
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
        active_params_b=3.0,
    ),
    # Dense contrast: every layer is full attention, so only the KV pool can bind.
    "qwen3-32b": ModelProfile(
        name="Qwen/Qwen3-32B", architecture="Qwen3ForCausalLM",
        num_layers=64, num_linear_layers=0, num_kv_heads=8, head_dim=128, v_head_dim=128,
        weights_gib=61.0, context_length=40960, active_params_b=32.0, draft_layers=0,
    ),
    # Small dense model for quick simulated runs.
    "qwen2.5-0.5b": ModelProfile(
        name="Qwen/Qwen2.5-0.5B-Instruct", architecture="Qwen2ForCausalLM",
        num_layers=24, num_linear_layers=0, num_kv_heads=2, head_dim=64, v_head_dim=64,
        weights_gib=0.92, context_length=32768, active_params_b=0.5, draft_layers=0,
    ),
}

GPUS: dict[str, GpuProfile] = {
    "b200": GpuProfile("B200", total_mib=183359, bandwidth_gbs=8000, bf16_tflops=2250),
    "rtx-pro-6000": GpuProfile("RTX PRO 6000 Blackwell", total_mib=97887, bandwidth_gbs=1792,
                               bf16_tflops=500),
    # context_gib measured: "Load weight begin. avail mem=139.13 GB" of 140.40 (SGLang 0.5.17,
    # torch 2.11 + CUDA 13.0, bench/real_sglang/data/2026-12-01-h200).
    "h200": GpuProfile("H200", total_mib=143771, bandwidth_gbs=4800, bf16_tflops=989,
                       context_gib=1.27),
    "h100": GpuProfile("H100 80GB", total_mib=81559, bandwidth_gbs=3350, bf16_tflops=989),
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


def profile_from_hf_config(path: Path, weights_gib: float | None = None) -> ModelProfile:
    """Read the shapes SGLang uses from a HF config (Qwen3-Next/3.5/3.6, NemotronH, dense)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"model: cannot read {path}: {exc}") from exc
    cfg = raw.get("text_config", raw)
    if weights_gib is None:
        weights_gib = _weights_from_index(path.parent)
    if weights_gib is None:
        raise ValueError(
            f"model: {path} gives no weight size; pass --weights-gib (GiB of weights per GPU "
            "at TP1) or put model.safetensors.index.json next to it"
        )
    try:
        layers = int(cfg["num_hidden_layers"])
        arch = (raw.get("architectures") or ["unknown"])[0]
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        mamba: MambaShape | None = None
        linear = 0
        if "linear_num_value_heads" in cfg:
            interval = int(cfg.get("full_attention_interval", 4))
            types = cfg.get("layer_types")
            linear = (sum(1 for t in types if t != "full_attention") if types
                      else sum(1 for i in range(layers) if (i + 1) % interval != 0))
            mamba = MambaShape(
                num_heads=int(cfg["linear_num_value_heads"]),
                head_dim=int(cfg["linear_value_head_dim"]),
                state_size=int(cfg["linear_key_head_dim"]),
                n_groups=int(cfg["linear_num_key_heads"]),
                conv_kernel=int(cfg["linear_conv_kernel_dim"]),
            )
        elif "hybrid_override_pattern" in cfg:  # NemotronH: M = mamba, * = attention
            pattern = str(cfg["hybrid_override_pattern"])
            linear = pattern.count("M")
            mamba = MambaShape(
                num_heads=int(cfg["mamba_num_heads"]),
                head_dim=int(cfg["mamba_head_dim"]),
                state_size=int(cfg["ssm_state_size"]),
                n_groups=int(cfg["n_groups"]),
                conv_kernel=int(cfg["conv_kernel"]),
            )
            layers = linear + pattern.count("*")
        ssm_dtype = str(cfg.get("mamba_ssm_dtype", raw.get("mamba_ssm_dtype", "float32")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"model: {path} lacks or mangles field {exc}; is it a HF config?") from exc
    return ModelProfile(
        name=str(raw.get("_name_or_path") or path.parent.name),
        architecture=arch,
        num_layers=layers,
        num_linear_layers=linear,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        weights_gib=weights_gib,
        context_length=int(cfg.get("max_position_embeddings", 32768)),
        mamba=mamba,
        draft_layers=int(cfg.get("mtp_num_hidden_layers", cfg.get("num_nextn_predict_layers", 0))),
        vlm_mem_factor=0.925 if "vision_config" in raw else 1.0,
        ssm_dtype_bytes=2 if ssm_dtype in ("bfloat16", "float16") else 4,
        # Dense: every bf16 weight is touched per token. MoE: unknown from the config alone.
        active_params_b=0.0 if _is_moe(cfg) else weights_gib * GIB / 2 / 1e9,
    )


def _is_moe(cfg: dict[str, object]) -> bool:
    return any(cfg.get(k) for k in ("num_experts", "n_routed_experts", "num_local_experts"))


def _weights_from_index(folder: Path) -> float | None:
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        total = json.loads(index.read_text())["metadata"]["total_size"]
    except (KeyError, json.JSONDecodeError, TypeError):
        return None
    return float(total) / GIB
