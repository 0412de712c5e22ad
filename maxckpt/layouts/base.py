"""Model dimensions and the layout protocol shared by every framework mapping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Protocol

from maxckpt.tensors import LazyTensor, TensorInfo


@dataclass(frozen=True)
class ModelSpec:
    """Everything a mapping needs to know about a model (dense, MoE, MLA or Gemma).

    Dimensions come from tensor shapes; what shapes cannot tell (rope theta
    and scaling, norm eps, which rotary layout MaxText used, the routing
    top-k, softcaps, windows) comes from a family preset, an HF config.json,
    or flags.
    """

    family: str  # a key of families.FAMILIES: "llama2", ..., "mixtral", "deepseek3", "gemma3"
    num_layers: int
    emb_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    rope_theta: float = 10_000.0
    rope_scaling: Mapping[str, Any] | None = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    # How MaxText orders q/k features for rotary: "half" (HF's rotate-half) or
    # "interleaved" pairs (llama3.1's LLaMARotaryEmbedding).
    maxtext_rotary: Literal["half", "interleaved"] = "half"
    # Whether MaxText folded 1/sqrt(head_dim) into the query kernel (llama,
    # mistral) or scales queries at runtime (qwen3, whose q/k norms come first).
    maxtext_query_scale: bool = True
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    extra: Mapping[str, Any] = field(default_factory=dict)

    # ---- MoE (num_experts 0: a dense model). Read from shapes except the top-k.
    num_experts: int = 0  # routed experts per MoE layer
    num_experts_per_tok: int = 0  # top-k
    moe_mlp_dim: int = 0  # one routed expert's hidden width
    num_shared_experts: int = 0  # DeepSeek's always-on experts (width moe_mlp_dim each)
    first_dense_layers: int = 0  # DeepSeek: layers [0, k) are dense, the rest MoE (HF first_k_dense_replace)
    # "softmax_topk": top-k of the router logits, softmax over those k (= HF softmax, top-k, renormalise);
    # "sigmoid_bias": DeepSeek-V3, sigmoid scores, top-k by score + routing bias, weights the unbiased scores.
    # "sigmoid_input": llama4, top-k by logit, the chosen experts' *input* scaled by sigmoid(logit), outputs summed.
    # "softmax_greedy": DeepSeek-V2, softmax over every expert, its top-k probabilities (times routed_scaling_factor).
    routing: Literal["softmax_topk", "sigmoid_bias", "sigmoid_input", "softmax_greedy"] | None = None
    norm_topk_prob: bool = True  # renormalise the chosen weights to sum 1
    routed_scaling_factor: float = 1.0  # multiplies the routed experts' output (DeepSeek 2.5)
    # DeepSeek's group-limited routing (HF n_group / topk_group, MaxText n_routing_groups / topk_routing_group):
    # experts split into n_group groups, only those of the topk_group best groups compete. 1 / 1: off.
    n_group: int = 1
    topk_group: int = 1
    router_bias: bool = False  # the router has a bias (gpt-oss)
    expert_bias: bool = False  # expert projections have biases (gpt-oss)
    # ---- MLA (q_lora_rank 0: ordinary multi-head attention)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # ---- attention details
    attention_bias: bool = False  # q/k/v/o projections have biases (gpt-oss)
    qkv_bias: bool = False  # q/k/v projections have biases and o_proj has none (qwen2.5); off with attention_bias
    attention_sinks: bool = False  # one learned extra logit per query head (gpt-oss)
    # HF's query scale is query_pre_attn_scalar**-0.5 (Gemma); None means head_dim.
    query_pre_attn_scalar: float | None = None
    attn_logit_softcap: float | None = None  # scores -> tanh(s/c)*c (gemma2)
    final_logit_softcap: float | None = None  # logits -> tanh(l/c)*c (gemma2)
    sliding_window: int | None = None  # window of the local layers
    # 0: every layer global; n: layer i is global iff i % n == n - 1, the others sliding (gemma2 2, gemma3 6, gpt-oss 2)
    sliding_window_pattern: int = 0
    local_rope_theta: float | None = None  # rope theta of sliding layers when it differs (gemma3 1e4)
    # ---- norms, embeddings, MLP
    norm_offset: float = 0.0  # HF norm weight = MaxText scale - norm_offset (Gemma's (1 + w): 1.0)
    sandwich_norms: bool = False  # Gemma's extra post-attention and pre/post-MLP norms
    # MaxText stores the embedding table multiplied by sqrt(emb_dim) (Gemma: HF multiplies at runtime)
    maxtext_embedding_scaled: bool = False
    activation: Literal["silu", "gelu_tanh", "swiglu_oai"] = "silu"
    # ---- Gated DeltaNet hybrids (qwen3-next). 0: every layer is ordinary attention; n: layer i is full
    # (gated) attention iff i % n == n - 1, the others Gated DeltaNet (linear attention) layers.
    full_attention_interval: int = 0
    # Gated DeltaNet heads (MaxText's gdn_* names): key/query heads, value heads, their widths, conv kernel.
    gdn_num_key_heads: int = 0
    gdn_num_value_heads: int = 0
    gdn_key_head_dim: int = 0
    gdn_value_head_dim: int = 0
    gdn_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 1.0  # rope on the first factor * head_dim features of each head
    # The query kernel holds [query | output gate] per head; attention output *= sigmoid(gate) (qwen3-next).
    attention_output_gate: bool = False
    # Decoder norms compute x * (1 + scale) in MaxText and HF alike (zero-initialised): scales copy as they are.
    norm_plus_one: bool = False
    shared_expert_gate: bool = False  # the shared expert's output *= sigmoid(x @ gate) (qwen3-next)
    # Multimodal rope's (temporal, height, width) split of the rotary frequencies (qwen3.5); text gives the
    # three streams equal positions, so it is plain rope there. None: no multimodal rope.
    mrope_section: tuple[int, ...] | list[int] | None = None
    # ---- NoPE / chunked / interleaved-MoE layer patterns (llama4). 0: every layer has rope; n: layer i has
    # none (a NoPE layer, full attention) iff i % n == n - 1, the others rope (MaxText nope_layer_interval).
    nope_layer_interval: int = 0
    # MoE layer i iff (i + 1) % step == 0, the others a dense MLP of mlp_dim (MaxText interleave_moe_layer_step).
    interleave_moe_layer_step: int = 1
    # A weight-free L2 norm (x * rsqrt(mean(x^2) + eps)) of q and k after rope, on rope layers (llama4 use_qk_norm).
    qk_l2_norm: bool = False
    # Rope layers attend within chunks of this many tokens (MaxText chunk_attn_window_size); None: whole sequence.
    attention_chunk_size: int | None = None
    # NoPE layers scale queries by log(floor((pos + 1) / 8192) + 1) * 0.1 + 1 (MaxText temperature_tuning).
    attn_temperature_tuning: bool = False
    # MaxText's scanned block of a "cycle" family: this many layers (inhomogeneous_layer_cycle_interval).
    layer_cycle_interval: int = 0
    # ---- per-layer geometry (gemma4): the full-attention layers' own head width and kv heads (0: as the
    # sliding layers'), whether their key projection is also the value (no value kernel), and the share of each
    # of their heads that rope rotates (the sliding layers rotate all of it). See layouts/geometry.py.
    global_head_dim: int = 0
    global_num_kv_heads: int = 0
    global_k_eq_v: bool = False
    global_partial_rotary_factor: float = 1.0
    layer_scalar: bool = False  # every layer's output is multiplied by a learned scalar (gemma4)
    # ---- gemma4 e2b/e4b: per-layer input embeddings of width per_layer_input_dim (0: none) from a table of
    # per_layer_vocab_size rows; the last num_kv_shared_layers layers reuse the keys/values of the last earlier
    # layer of their type (no k/v projections of their own) and, with double_wide_mlp, have an MLP twice as wide.
    per_layer_input_dim: int = 0
    per_layer_vocab_size: int = 0
    num_kv_shared_layers: int = 0
    double_wide_mlp: bool = False
    # ---- DeepSeek-V3.2's sparse-attention indexer (0 heads: none): heads, width, and how many keys each query
    # keeps (MaxText indexer_*, HF index_*). Its weights sit beside MLA's: indexer/{wq_b, wk, k_norm, weights_proj}.
    indexer_n_heads: int = 0
    indexer_head_dim: int = 0
    indexer_topk: int = 0


class Layout(Protocol):
    """A mapping between one framework's tensor names/shapes and HF's."""

    name: str

    def detect(self, infos: Mapping[str, TensorInfo]) -> bool:
        """True when these tensor names look like this layout."""
        ...

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express this layout's tensors as HF tensors."""
        ...

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express HF tensors in this layout."""
        ...

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """The ModelSpec fields these tensor shapes determine.

        Keys are ModelSpec field names (num_layers, emb_dim, num_heads, ...,
        tie_word_embeddings, qk_norm). Leave out what shapes cannot tell (e.g.
        num_heads of a fused QKV): the pipeline takes it from config files,
        presets or flags, and checks every shape against the final spec.
        """
        ...
