"""What a TorchTitan run must configure to load a converted model: its settings live in the job config.

A TorchTitan DCP checkpoint holds tensors only; the model's flavor, dims and rope settings come from the
loading run's config, so the hand-off after a conversion prints them.
"""

from __future__ import annotations

from maxckpt.families import FAMILIES
from maxckpt.layouts.base import ModelSpec

__all__ = ["torchtitan_model_notes"]


def torchtitan_model_notes(spec: ModelSpec) -> list[str]:
    """What a TorchTitan run must configure to load this model (its settings live in the job config).

    >>> torchtitan_model_notes(ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 250))[0][:40]
    'TorchTitan model: llama3 with dim 64, n_'
    """
    if spec.num_experts:
        model = FAMILIES[spec.family].torchtitan_model or "qwen3 MoE"
        groups = (
            f", router_num_expert_groups {spec.n_group}, router_num_limited_groups {spec.topk_group}"
            if spec.n_group > 1 else ""
        )  # TorchTitan scores a group by its top 2 experts, as DeepSeek does
        return [
            f"TorchTitan model: {model} with dim {spec.emb_dim}, n_layers {spec.num_layers}, n_heads {spec.num_heads}, "
            f"n_kv_heads {spec.num_kv_heads}, head_dim {spec.head_dim}, num_experts {spec.num_experts}, "
            f"top_k {spec.num_experts_per_tok}, moe_hidden_dim {spec.moe_mlp_dim}{groups}, "
            f"vocab_size {spec.vocab_size}, rope theta {spec.rope_theta:g}, norm eps {spec.rms_norm_eps:g}, "
            f"enable_weight_tying={spec.tie_word_embeddings}"
        ]
    if spec.qk_norm:
        return [
            f"TorchTitan model: qwen3 with dim {spec.emb_dim}, n_layers {spec.num_layers}, n_heads {spec.num_heads}, "
            f"n_kv_heads {spec.num_kv_heads}, head_dim {spec.head_dim}, hidden_dim {spec.mlp_dim}, "
            f"vocab_size {spec.vocab_size}, rope theta {spec.rope_theta:g}, norm eps {spec.rms_norm_eps:g}, "
            f"enable_weight_tying={spec.tie_word_embeddings}"
        ]
    rope = dict(spec.rope_scaling or {})
    scaling = (
        f"ComplexRoPE scaling='llama' (factor {rope.get('factor')}, low {rope.get('low_freq_factor')}, "
        f"high {rope.get('high_freq_factor')}, original {rope.get('original_max_position_embeddings')})"
        if rope.get("rope_type", rope.get("type")) == "llama3"
        else "ComplexRoPE scaling='none' (the stock llama3 flavors use Llama 3.1's 'llama' scaling)"
    )
    notes = [
        f"TorchTitan model: llama3 with dim {spec.emb_dim}, n_layers {spec.num_layers}, n_heads {spec.num_heads}, "
        f"n_kv_heads {spec.num_kv_heads}, hidden_dim {spec.mlp_dim}, vocab_size {spec.vocab_size}, "
        f"rope theta {spec.rope_theta:g}, {scaling}, norm eps {spec.rms_norm_eps:g}, "
        f"enable_weight_tying={spec.tie_word_embeddings}"
    ]
    if spec.head_dim * spec.num_heads != spec.emb_dim:
        notes.append(
            f"head_dim {spec.head_dim} is not dim / n_heads = {spec.emb_dim // spec.num_heads}: TorchTitan's llama3 "
            "builder derives head_dim that way, so its attention config must set head_dim explicitly"
        )
    return notes
