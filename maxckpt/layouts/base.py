"""Model dimensions and the layout protocol shared by every framework mapping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Protocol

from maxckpt.tensors import LazyTensor, TensorInfo


@dataclass(frozen=True)
class ModelSpec:
    """Everything a mapping needs to know about a Llama-family model.

    Dimensions come from tensor shapes; what shapes cannot tell (rope theta
    and scaling, norm eps, which rotary layout MaxText used) comes from a
    family preset, an HF config.json, or flags.
    """

    family: str  # "llama2", "llama3", "llama3.1", "mistral", "qwen3"
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
