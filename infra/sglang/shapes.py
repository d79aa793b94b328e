"""The shapes the memory model, the roofline and the simulator reason about: a model's layers
and state, a GPU's memory and speed. Built-in profiles live in profiles.py; profiles read from
a HF config.json in hf_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


# Families whose state layers run these kernels (their speed: roofline.py's per-family steps).
MAMBA2_ARCHS = frozenset({"NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
                          "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM"})
CONV_ARCHS = frozenset({"Lfm2ForCausalLM", "Lfm2MoeForCausalLM"})


@dataclass(frozen=True)
class MambaShape:
    """Per-layer state shape in SGLang's Mamba2 terms (`Mamba2StateShape`): the conv window
    holds num_heads × head_dim + 2 × n_groups × state_size channels, the SSM state num_heads ×
    head_dim × state_size. GDN and KDA: value heads/dim, key heads as groups, key dim as state;
    LFM2's short convolutions: one head of the hidden size and no SSM state (state_size 0)."""

    num_heads: int  # value heads (GDN, KDA) / mamba heads
    head_dim: int  # value head dim
    state_size: int  # key head dim (GDN, KDA) / ssm_state_size / 0 (conv only)
    n_groups: int  # key heads (GDN, KDA) / mamba n_groups
    conv_kernel: int


@dataclass(frozen=True)
class MoeShape:
    """The routed experts of a mixture-of-experts model, as its config gives them: which
    share of the weights a decode step reads depends on how many experts its batch touches
    (roofline.py), not on the model's size."""

    num_experts: int  # routed experts per MoE layer
    top_k: int  # experts each token is routed to
    moe_layers: int  # layers whose MLP is the MoE block
    expert_params: int  # parameters of one routed expert of one layer
    shared_params: int = 0  # parameters of the shared expert(s) of one layer
    # the router selects on score + a per-expert bias (None: the release's models don't say)
    biased_router: bool | None = None

    @property
    def routed_params(self) -> int:
        return self.moe_layers * self.num_experts * self.expert_params

    def touched_experts(self, batch: float, spread: float = 1.0) -> float:
        """Expected experts of one layer a batch of `batch` tokens touches, routed evenly
        over `spread` × the experts (1.0: a load-balanced trained router; a router of random
        weights sends most tokens to few experts: roofline.py's dummy spread)."""
        pool = max(float(self.top_k), spread * self.num_experts)
        return pool * (1.0 - (1.0 - self.top_k / pool) ** max(batch, 0.0))

    def flops_per_token(self) -> float:
        """Multiply-adds ×2 of the experts one token runs (routed top-k plus shared)."""
        return 2.0 * self.moe_layers * (self.top_k * self.expert_params + self.shared_params)


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
    # Falcon-H1 runs attention *and* mamba in every layer: its attention layers are not the
    # layers left over (None: num_layers - num_linear_layers)
    attention_layers: int | None = None
    mla_kv_dim: int = 0  # MLA (Kimi-Linear): kv_lora_rank + qk_rope_head_dim per token and layer
    moe: MoeShape | None = None  # None: dense MLPs
    quantized: bool = False  # the checkpoint names a quantization_config (SGLang reads it)
    eos_token_ids: tuple[int, ...] = ()  # what ends an answer (none known: a built-in)
    # Token ids a request may carry (config `vocab_size`; None: unknown). Real SGLang 0.5.17's
    # scheduler dies on an id at or above it ("device-side assert triggered").
    vocab_size: int | None = None

    @property
    def hybrid(self) -> bool:
        return self.mamba is not None and self.num_linear_layers > 0

    @property
    def num_full_layers(self) -> int:
        if self.attention_layers is not None:
            return self.attention_layers
        return self.num_layers - self.num_linear_layers

    @property
    def family(self) -> str:
        """The kernels its state layers run, which set their speed: `gdn` (Qwen3-Next,
        Qwen3.5/3.6: gated delta net; Kimi-Linear's KDA), `mamba2` (NemotronH, Falcon-H1,
        Granite 4 hybrids), `conv` (LFM2's short convolutions), or `dense`."""
        if not self.hybrid:
            return "dense"
        if self.architecture in MAMBA2_ARCHS:
            return "mamba2"
        return "conv" if self.architecture in CONV_ARCHS else "gdn"


@dataclass(frozen=True)
class GpuProfile:
    """A GPU as SGLang sees it: total memory from nvidia-smi, plus roofline figures."""

    name: str
    total_mib: int
    bandwidth_gbs: float  # HBM/GDDR bandwidth, GB/s
    bf16_tflops: float
    context_gib: float = 1.0  # CUDA context + NCCL, charged before weights load
    # Its architecture ("hopper"): a family's step constants measured on one GPU of it stand
    # for another that has none of its own (infra/sglang/roofline.py: calibration_key)
    generation: str = ""

    @property
    def total_gib(self) -> float:
        return self.total_mib * MIB / GIB
