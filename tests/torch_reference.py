"""Test helpers for the PyTorch bridges: tiny transformers models and reference forwards.

The forwards are written from the frameworks' own model code, straight on
their state-dict layouts, so a logits match proves the tensors are where and
how Megatron-Core or TorchTitan would use them:

- `megatron_forward`: Megatron-Core GPT (fused QKV viewed as `[G, (H/G+2)*D]`,
  `linear_fc1` chunked into gate/up, rotate-half RoPE, padded vocabulary,
  optional q/k layernorm).
- `torchtitan_forward`: TorchTitan's decoder (separate wq/wk/wv, complex
  interleaved-pair RoPE for Llama, rotate-half for Qwen 3, w1/w3/w2 SwiGLU).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch

from maxckpt.layouts.base import ModelSpec
from maxckpt.tensors import LazyTensor

TOKENS = [1, 5, 9, 13, 17, 21, 25, 29]


def tiny_hf_model(
    family: str = "llama",
    *,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
    layers: int = 2,
    vocab: int = 250,
    tied: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """A random transformers Llama or Qwen3 causal LM with these tiny dimensions."""
    import transformers

    torch.manual_seed(seed)
    common = dict(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        attn_implementation="eager",
    )
    if family == "qwen3":
        cfg = transformers.Qwen3Config(rope_theta=1_000_000.0, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(rope_theta=10_000.0, **common)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # non-trivial norm weights, so a swapped norm cannot pass
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


def spec_of(model) -> ModelSpec:
    """The ModelSpec of a transformers model built by `tiny_hf_model`."""
    c = model.config
    theta = getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10_000.0)
    family = "qwen3" if c.model_type == "qwen3" else "llama3"
    return ModelSpec(
        family=family,
        num_layers=c.num_hidden_layers,
        emb_dim=c.hidden_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        mlp_dim=c.intermediate_size,
        vocab_size=c.vocab_size,
        tie_word_embeddings=bool(c.tie_word_embeddings),
        qk_norm=family == "qwen3",
        rope_theta=float(theta),
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
    )


def hf_arrays(model) -> dict[str, np.ndarray]:
    """The model's HF state dict as numpy (bfloat16 kept), tied lm_head dropped as HF saves it."""
    from maxckpt.containers.torch_arrays import to_numpy

    sd = {k: to_numpy(v).copy() for k, v in model.state_dict().items() if "rotary_emb" not in k}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def lazy(arrays: Mapping[str, np.ndarray]) -> dict[str, LazyTensor]:
    return {k: LazyTensor.from_array(k, v) for k, v in arrays.items()}


def lazy_from_reader(reader) -> dict[str, LazyTensor]:
    """Every tensor of a TensorReader as a LazyTensor that reads (slices of) it on demand."""
    return {
        name: LazyTensor(name, info.shape, info.dtype, lambda index, n=name: reader.read(n, index))
        for name, info in reader.tensors().items()
    }


def write_all(writer, tensors: Mapping[str, LazyTensor]) -> None:
    """Stream LazyTensors into a TensorWriter, stacked ones piece by piece, with the pipeline's own loop."""
    from maxckpt.conversion.pipeline import write_tensors

    assert all(name == t.name for name, t in tensors.items())  # the writer stores each under t.name
    write_tensors(writer, tensors)


def megatron_shapes(spec: ModelSpec, padded_vocab: int) -> dict[str, tuple[int, ...]]:
    """Keys and shapes of a Megatron-Core GPT model's stacked `torch_dist` tensors (written out from its code)."""
    L, E, F, D, H, G = spec.num_layers, spec.emb_dim, spec.mlp_dim, spec.head_dim, spec.num_heads, spec.num_kv_heads
    shapes = {
        "embedding.word_embeddings.weight": (padded_vocab, E),
        "decoder.final_layernorm.weight": (E,),
        "decoder.layers.self_attention.linear_qkv.weight": (L, (H + 2 * G) * D, E),
        "decoder.layers.self_attention.linear_proj.weight": (L, E, H * D),
        "decoder.layers.mlp.linear_fc1.weight": (L, 2 * F, E),
        "decoder.layers.mlp.linear_fc2.weight": (L, E, F),
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight": (L, E),
        "decoder.layers.mlp.linear_fc1.layer_norm_weight": (L, E),
    }
    if not spec.tie_word_embeddings:
        shapes["output_layer.weight"] = (padded_vocab, E)
    if spec.qk_norm:
        shapes["decoder.layers.self_attention.q_layernorm.weight"] = (L, D)
        shapes["decoder.layers.self_attention.k_layernorm.weight"] = (L, D)
    return shapes


def torchtitan_shapes(spec: ModelSpec, keys: str = "2026") -> dict[str, tuple[int, ...]]:
    """Keys and shapes of a TorchTitan decoder's model state dict, in either key generation."""
    E, F, D, H, G, V = spec.emb_dim, spec.mlp_dim, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.vocab_size
    qkv = "attention.qkv_linear." if keys == "2026" else "attention."
    out = {"tok_embeddings.weight": (V, E), "norm.weight": (E,), ("lm_head.weight" if keys == "2026" else "output.weight"): (V, E)}
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        out.update({
            p + qkv + "wq.weight": (H * D, E), p + qkv + "wk.weight": (G * D, E), p + qkv + "wv.weight": (G * D, E),
            p + "attention.wo.weight": (E, H * D), p + "feed_forward.w1.weight": (F, E),
            p + "feed_forward.w3.weight": (F, E), p + "feed_forward.w2.weight": (E, F),
            p + "attention_norm.weight": (E,), p + "ffn_norm.weight": (E,),
        })
        if spec.qk_norm:
            out.update({p + "attention.q_norm.weight": (D,), p + "attention.k_norm.weight": (D,)})
    return out


@torch.no_grad()
def hf_logits(model, tokens=TOKENS) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0].float()


# ------------------------------------------------------------------ forwards


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)) * w.float()


def _inv_freq(spec: ModelSpec) -> torch.Tensor:
    d = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = dict(spec.rope_scaling or {})
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        # Llama 3.1 frequency scaling, as Megatron (`use_rope_scaling`), TorchTitan (`scaling="llama"`) and HF apply it.
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv


def _rope_half(x: torch.Tensor, pos: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """Rotate-half RoPE on [s, heads, D] (HF, Megatron `rotary_interleaved=False`)."""
    ang = torch.outer(pos.double(), _inv_freq(spec))
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().float()[:, None], emb.sin().float()[:, None]
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _rope_interleaved(x: torch.Tensor, pos: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """TorchTitan/Meta complex RoPE: pairs (2i, 2i+1) rotated by freqs_cis."""
    ang = torch.outer(pos.double(), _inv_freq(spec))
    freqs_cis = torch.polar(torch.ones_like(ang), ang).to(torch.complex64)[:, None]
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(-2)


def _attention(q, k, v, spec: ModelSpec) -> torch.Tensor:
    """Causal GQA attention on [s, heads, D]; q head h uses kv head h // (H/G)."""
    rep = spec.num_heads // spec.num_kv_heads
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = q.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(spec.head_dim)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", scores, v).reshape(s, -1)


@torch.no_grad()
def megatron_forward(sd: Mapping[str, torch.Tensor], spec: ModelSpec, tokens=TOKENS) -> torch.Tensor:
    """Logits [s, vocab] of a Megatron-Core GPT state dict with stacked `decoder.layers.*` keys."""
    sd = {k: v.float() for k, v in sd.items() if isinstance(v, torch.Tensor)}
    H, G, D, eps = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.rms_norm_eps
    pos = torch.arange(len(tokens))
    x = sd["embedding.word_embeddings.weight"][torch.tensor(tokens)]
    for i in range(spec.num_layers):
        lay = lambda n: sd[f"decoder.layers.{n}"][i]  # noqa: E731
        h = _rms(x, lay("self_attention.linear_qkv.layer_norm_weight"), eps)
        mixed = (h @ lay("self_attention.linear_qkv.weight").T).view(len(tokens), G, (H // G + 2) * D)
        q, k, v = torch.split(mixed, [H // G * D, D, D], dim=-1)
        q = q.reshape(len(tokens), H, D)
        if spec.qk_norm:
            q = _rms(q, lay("self_attention.q_layernorm.weight"), eps)
            k = _rms(k, lay("self_attention.k_layernorm.weight"), eps)
        q, k = _rope_half(q, pos, spec), _rope_half(k, pos, spec)
        x = x + _attention(q, k, v, spec) @ lay("self_attention.linear_proj.weight").T
        h = _rms(x, lay("mlp.linear_fc1.layer_norm_weight"), eps)
        gate, up = torch.chunk(h @ lay("mlp.linear_fc1.weight").T, 2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ lay("mlp.linear_fc2.weight").T
    x = _rms(x, sd["decoder.final_layernorm.weight"], eps)
    out = sd["output_layer.weight"] if "output_layer.weight" in sd else sd["embedding.word_embeddings.weight"]
    return (x @ out.T)[:, : spec.vocab_size]


@torch.no_grad()
def torchtitan_forward(
    sd: Mapping[str, torch.Tensor], spec: ModelSpec, tokens=TOKENS, rotary: str = "interleaved"
) -> torch.Tensor:
    """Logits [s, vocab] of a TorchTitan decoder state dict (either key generation)."""
    sd = {k.removeprefix("model."): v.float() for k, v in sd.items() if isinstance(v, torch.Tensor)}
    qkv = "attention.qkv_linear." if "layers.0.attention.qkv_linear.wq.weight" in sd else "attention."
    H, G, D, eps = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.rms_norm_eps
    rope = _rope_interleaved if rotary == "interleaved" else _rope_half
    pos = torch.arange(len(tokens))
    s = len(tokens)
    x = sd["tok_embeddings.weight"][torch.tensor(tokens)]
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        h = _rms(x, sd[p + "attention_norm.weight"], eps)
        q = (h @ sd[p + qkv + "wq.weight"].T).view(s, H, D)
        k = (h @ sd[p + qkv + "wk.weight"].T).view(s, G, D)
        v = (h @ sd[p + qkv + "wv.weight"].T).view(s, G, D)
        if spec.qk_norm:
            q, k = _rms(q, sd[p + "attention.q_norm.weight"], eps), _rms(k, sd[p + "attention.k_norm.weight"], eps)
        q, k = rope(q, pos, spec), rope(k, pos, spec)
        x = x + _attention(q, k, v, spec) @ sd[p + "attention.wo.weight"].T
        h = _rms(x, sd[p + "ffn_norm.weight"], eps)
        ff = torch.nn.functional.silu(h @ sd[p + "feed_forward.w1.weight"].T) * (h @ sd[p + "feed_forward.w3.weight"].T)
        x = x + ff @ sd[p + "feed_forward.w2.weight"].T
    x = _rms(x, sd["norm.weight"], eps)
    out = sd.get("lm_head.weight", sd.get("output.weight"))
    return x @ out.T
