"""A model profile read from a HF `config.json`, the way SGLang 0.5.17 reads each family.

Which layers hold state and how big one request's state is comes from SGLang's own config
classes (`srt/configs/*.py`: `mamba2_cache_params`, `full_attention_layer_ids`), family by
family: Qwen3-Next and Qwen3.5/3.6 (GDN), NemotronH (Mamba2; its pattern string or, as
Nemotron 3 writes it, a `layers_block_type` list), Falcon-H1 (Mamba2 and attention in every
layer), Granite 4.0 hybrids (Mamba2 by `layer_types`), LFM2 (short convolutions: a conv window,
no SSM state) and Kimi-Linear (KDA layers, MLA attention). Checked against the pools real
SGLang allocated on the H200 (tests/unit/test_real_families.py). A config that names state
layers in a way none of these readers knows is refused, never planned as a dense model: a
dense plan of a hybrid is a confident, wrong cap.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.sglang.release_tables import known_tables
from infra.sglang.router_tables import biased_router
from infra.sglang.shapes import GIB, MambaShape, ModelProfile, MoeShape

# Fields that only a model with state layers has: seen in a config no reader claims, they
# mean a hybrid the planner cannot size.
STATE_FIELDS = ("mamba_d_state", "ssm_state_size", "mamba_num_heads", "mamba_n_heads",
                "linear_attn_config", "linear_num_value_heads", "hybrid_override_pattern",
                "conv_L_cache", "layers_block_type", "mamba_d_ssm", "conv_kernel")


@dataclass(frozen=True)
class StateLayers:
    """What a family reader finds: the state layers, their shape, the attention layers."""

    linear: int
    shape: MambaShape
    attention: int
    mla_kv_dim: int = 0


def _gdn(cfg: dict[str, Any]) -> StateLayers:
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    interval = int(cfg.get("full_attention_interval", 4))
    linear = (sum(1 for t in types if t != "full_attention") if types
              else sum(1 for i in range(layers) if (i + 1) % interval != 0))
    shape = MambaShape(num_heads=int(cfg["linear_num_value_heads"]),
                       head_dim=int(cfg["linear_value_head_dim"]),
                       state_size=int(cfg["linear_key_head_dim"]),
                       n_groups=int(cfg["linear_num_key_heads"]),
                       conv_kernel=int(cfg["linear_conv_kernel_dim"]))
    return StateLayers(linear, shape, layers - linear)


def _first(cfg: dict[str, Any], *names: str) -> Any:
    """The first of these spellings the config has (KeyError naming the first otherwise)."""
    for name in names:
        if name in cfg:
            return cfg[name]
    raise KeyError(names[0])


NEMOTRON_H_ARCHS = ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM")
_BLOCK_LETTERS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def nemotron_pattern(cfg: dict[str, Any]) -> str:
    """The layer pattern as NemotronHConfig resolves it (srt/configs/nemotron_h.py,
    `_resolve_layers_block_type`): `layers_block_type` when given, else the legacy
    `hybrid_override_pattern`; its length *is* the layer count (`num_hidden_layers` is a
    property of it there; a config's own value is ignored). M = mamba, * = attention,
    - / E = MLP or MoE (no state, no KV)."""
    if "layers_block_type" in cfg:
        blocks = cfg["layers_block_type"]
        bad = [w for w in blocks if w not in _BLOCK_LETTERS] if isinstance(blocks, list) else [
            blocks]
        if bad:
            raise ValueError(f"layers_block_type holds {bad[0]!r}; SGLang takes "
                             f"{', '.join(_BLOCK_LETTERS)}")
        return "".join(_BLOCK_LETTERS[w] for w in blocks)
    pattern = str(cfg["hybrid_override_pattern"])
    if set(pattern) - set(_BLOCK_LETTERS.values()):
        raise ValueError(f"hybrid_override_pattern {pattern!r} holds letters other than "
                         "M, *, - and E")
    return pattern


def hidden_layers(cfg: dict[str, Any], arch: str) -> int:
    """The decoder's layer count as SGLang's config class gives it."""
    if arch in NEMOTRON_H_ARCHS:
        return len(nemotron_pattern(cfg))
    return int(cfg["num_hidden_layers"])


def _nemotron_h(cfg: dict[str, Any]) -> StateLayers:
    """NemotronH's Mamba2 layers and attention layers by its pattern. Its group and conv
    spellings: `n_groups` and `conv_kernel` as the HF configs write them (the config class
    keeps them as given), SGLang's own `mamba_n_groups`/`mamba_d_conv` otherwise."""
    pattern = nemotron_pattern(cfg)
    shape = MambaShape(num_heads=int(cfg["mamba_num_heads"]),
                       head_dim=int(cfg["mamba_head_dim"]),
                       state_size=int(cfg["ssm_state_size"]),
                       n_groups=int(_first(cfg, "n_groups", "mamba_n_groups")),
                       conv_kernel=int(_first(cfg, "conv_kernel", "mamba_d_conv")))
    return StateLayers(pattern.count("M"), shape, pattern.count("*"))


def _mamba2_shape(cfg: dict[str, Any], intermediate: int) -> MambaShape:
    heads = int(cfg["mamba_n_heads"])
    head_dim = cfg.get("mamba_d_head", "auto")
    return MambaShape(num_heads=heads,
                      head_dim=intermediate // heads if head_dim == "auto" else int(head_dim),
                      state_size=int(cfg["mamba_d_state"]),
                      n_groups=int(cfg.get("mamba_n_groups", 1)),
                      conv_kernel=int(cfg.get("mamba_d_conv", 4)))


def _falcon_h1(cfg: dict[str, Any]) -> StateLayers:
    """Every layer runs attention and Mamba2 side by side (FalconH1Config)."""
    layers = int(cfg["num_hidden_layers"])
    d_ssm = cfg.get("mamba_d_ssm")
    intermediate = int(d_ssm) if d_ssm else int(cfg.get("mamba_expand", 2)) * int(
        cfg["hidden_size"])
    return StateLayers(layers, _mamba2_shape(cfg, intermediate), layers)


def _granite_hybrid(cfg: dict[str, Any]) -> StateLayers:
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types") or ["attention" if (i + 1) % 6 == 0 else "mamba"
                                       for i in range(layers)]
    mamba = sum(1 for t in types if t == "mamba")
    intermediate = int(cfg.get("mamba_expand", 2)) * int(cfg["hidden_size"])
    return StateLayers(mamba, _mamba2_shape(cfg, intermediate), layers - mamba)


def _lfm2(cfg: dict[str, Any]) -> StateLayers:
    """Short-conv layers keep a conv window of the hidden size, no SSM state (Lfm2Config)."""
    types = [str(t) for t in cfg["layer_types"]]
    conv = sum(1 for t in types if t in ("conv", "short_conv"))
    shape = MambaShape(num_heads=1, head_dim=int(cfg["hidden_size"]), state_size=0,
                       n_groups=1, conv_kernel=int(cfg["conv_L_cache"]))
    return StateLayers(conv, shape, sum(1 for t in types if t == "full_attention"))


def _kimi_linear(cfg: dict[str, Any]) -> StateLayers:
    """KDA layers (1-based `kda_layers`) keep conv windows for q, k and v and a head_dim²
    state per head; the others are MLA, caching kv_lora_rank + rope dims per token."""
    linear = cfg["linear_attn_config"]
    heads, head_dim = int(linear["num_heads"]), int(linear["head_dim"])
    kda = sum(1 for i in range(int(cfg["num_hidden_layers"])) if i + 1 in linear["kda_layers"])
    shape = MambaShape(num_heads=heads, head_dim=head_dim, state_size=head_dim,
                       n_groups=heads, conv_kernel=int(linear.get("short_conv_kernel_size", 4)))
    mla = int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"])
    return StateLayers(kda, shape, int(cfg["num_hidden_layers"]) - kda, mla_kv_dim=mla)


READERS: dict[str, Callable[[dict[str, Any]], StateLayers]] = {
    **dict.fromkeys(NEMOTRON_H_ARCHS, _nemotron_h),
    "FalconH1ForCausalLM": _falcon_h1, "GraniteMoeHybridForCausalLM": _granite_hybrid,
    "Lfm2ForCausalLM": _lfm2, "Lfm2MoeForCausalLM": _lfm2,
    "KimiLinearForCausalLM": _kimi_linear,
}


def _state_layers(arch: str, cfg: dict[str, Any]) -> StateLayers | None:
    if arch in READERS:
        found = READERS[arch](cfg)
        return found if found.linear else None  # e.g. a Granite config of attention only
    if "linear_num_value_heads" in cfg:
        return _gdn(cfg)
    if "hybrid_override_pattern" in cfg:
        return _nemotron_h(cfg)
    stated = [f for f in STATE_FIELDS if f in cfg]
    hybrid = any(arch in tables.hybrid_archs for tables in known_tables().values())
    if stated or hybrid:
        why = (f"field {stated[0]}" if stated else
               "SGLang's own mamba cache tables list it, srt/arg_groups/overrides.py")
        raise ValueError(
            f"{arch} has state layers ({why}) of a family the planner does "
            f"not read; it reads {', '.join(sorted(READERS))} and the Qwen3-Next/3.5/3.6 GDN "
            "configs — planning it as dense would give a wrong cap")
    return None


def profile_from_hf_config(path: Path, weights_gib: float | None = None) -> ModelProfile:
    """Read the shapes SGLang uses from a HF config: the families above, or a dense model."""
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
    arch = str((raw.get("architectures") or ["unknown"])[0])
    try:
        layers = hidden_layers(cfg, arch)
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        state = _state_layers(arch, cfg)
        ssm_dtype = str(cfg.get("mamba_ssm_dtype", raw.get("mamba_ssm_dtype", "float32")))
        moe = moe_shape(cfg, arch)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"model: {path} lacks or mangles field {exc}; is it a HF config?") from exc
    except ValueError as exc:
        raise ValueError(f"model: {path}: {exc}") from exc
    return ModelProfile(
        name=str(raw.get("_name_or_path") or path.parent.name),
        architecture=arch,
        num_layers=layers,
        num_linear_layers=state.linear if state else 0,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        weights_gib=weights_gib,
        context_length=int(cfg.get("max_position_embeddings", 32768)),
        mamba=state.shape if state else None,
        draft_layers=int(cfg.get("mtp_num_hidden_layers", cfg.get("num_nextn_predict_layers", 0))),
        vlm_mem_factor=0.925 if "vision_config" in raw else 1.0,
        ssm_dtype_bytes=2 if ssm_dtype in ("bfloat16", "float16") else 4,
        active_params_b=_active_params_b(weights_gib, moe),
        attention_layers=state.attention if state else None,
        mla_kv_dim=state.mla_kv_dim if state else 0,
        vocab_size=_vocab_size(cfg, raw),
        moe=moe,
        quantized="quantization_config" in raw or "quantization_config" in cfg,
        eos_token_ids=eos_token_ids(raw, path.parent / "generation_config.json"),
    )


def eos_token_ids(raw: dict[str, Any], generation: Path) -> tuple[int, ...]:
    """The config's `eos_token_id` (an int or a list) first, then generation_config.json's:
    the set SGLang stops on (ModelConfig._get_hf_eos_token_id in srt/configs/model_config.py)."""
    found: list[int] = []
    sources = [raw.get("eos_token_id", raw.get("text_config", {}).get("eos_token_id"))]
    if generation.is_file():
        try:
            sources.append(json.loads(generation.read_text()).get("eos_token_id"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"model: cannot read {generation}: {exc}") from exc
    for value in sources:
        for token in [value] if isinstance(value, int) else value or []:
            if isinstance(token, int) and token not in found:
                found.append(token)
    return tuple(found)


def _vocab_size(cfg: dict[str, Any], raw: dict[str, Any]) -> int | None:
    value = cfg.get("vocab_size", raw.get("vocab_size"))
    return int(value) if isinstance(value, int) and value > 0 else None


def moe_shape(cfg: dict[str, Any], arch: str) -> MoeShape | None:
    """The routed experts as SGLang's MoE blocks read them: Qwen3-Next/3.5 (`num_experts`,
    `moe_intermediate_size`, `shared_expert_intermediate_size`, every layer but
    `mlp_only_layers`), DeepSeek-style Kimi-Linear (`first_k_dense_replace` dense layers,
    `num_shared_experts` of the routed size), NemotronH (the pattern's `E` layers, squared-ReLU
    experts: two matrices, not three), Granite (`num_local_experts`), LFM2-MoE (`num_dense_layers`
    dense layers first). None: dense MLPs."""
    experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts")
                  or cfg.get("num_local_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token") or 0)
    if experts <= 1 or top_k <= 0:
        return None
    hidden = int(cfg["hidden_size"])
    inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    layers = hidden_layers(cfg, arch)
    matrices = 3
    if arch in NEMOTRON_H_ARCHS:
        moe_layers, matrices = nemotron_pattern(cfg).count("E"), 2
        shared = int(cfg.get("moe_shared_expert_intermediate_size") or 0)
    else:
        moe_layers = layers - _dense_lead_layers(cfg) - len(cfg.get("mlp_only_layers") or [])
        shared = int(cfg.get("shared_expert_intermediate_size")
                     or int(cfg.get("num_shared_experts") or cfg.get("n_shared_experts") or 0)
                     * inter)
    return MoeShape(num_experts=experts, top_k=top_k, moe_layers=moe_layers,
                    expert_params=matrices * hidden * inter,
                    shared_params=matrices * hidden * shared,
                    biased_router=biased_router(arch, cfg))


def _dense_lead_layers(cfg: dict[str, Any]) -> int:
    """The dense-MLP layers before the first MoE one: DeepSeek-style `first_k_dense_replace`
    (Kimi-Linear), LFM2-MoE's `num_dense_layers` (`Lfm2MoeDecoderLayer`: layer_id <
    config.num_dense_layers in srt/models/lfm2_moe.py)."""
    return int(cfg.get("first_k_dense_replace") or cfg.get("num_dense_layers") or 0)


def _active_params_b(weights_gib: float, moe: MoeShape | None) -> float:
    """Billions of parameters one token runs through (bf16 weights): all of them for a dense
    model; for an MoE the weights less the routed experts it is not sent to."""
    total = weights_gib * GIB / 2
    if moe is None:
        return total / 1e9
    idle = moe.routed_params * (1 - moe.top_k / moe.num_experts)
    return max(total - idle, 0.0) / 1e9


def _weights_from_index(folder: Path) -> float | None:
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        total = json.loads(index.read_text())["metadata"]["total_size"]
    except (KeyError, json.JSONDecodeError, TypeError):
        return None
    return float(total) / GIB
