"""MaxText's parameter tables, written in the mapping vocabulary of :mod:`maxckpt.layouts.mapping`.

Each entry is one MaxText path (its key in a layer) and its HF counterpart, with its form (a DenseGeneral
kernel, a vector, a conv kernel: :mod:`maxckpt.layouts.forms`, in dimension symbols) and the flags
MaxText's values differ by (`rotary`, `query`, `norm`, `embedding`: :func:`maxtext_values`):

- :class:`~maxckpt.layouts.mapping.Same`: one HF tensor;
- :class:`~maxckpt.layouts.mapping.Experts`: HF's per-expert tensors, MaxText's `[X, ...]`;
- :class:`~maxckpt.layouts.mapping.Part`: one of the MaxText tensors HF fuses (gate_up_proj);
- :class:`~maxckpt.layouts.mapping.Regrouped`: one MaxText kernel HF holds as several (qwen3.5's GDN);
- :class:`ModelVariable`: a :class:`Same` MaxText keeps outside params (DeepSeek's routing bias).

:func:`layer_params` builds a layer's table from the spec (MHA or MLA attention, dense or MoE MLP, Gated
DeltaNet, Llama or Gemma norms): which entries a layer has is plain code. :func:`global_params` are the
embedding, final norm and output. How the layers are stacked is :mod:`maxckpt.formats.maxtext.scans`;
the walk is :class:`maxckpt.formats.maxtext.layout.MaxTextLayout`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from maxckpt.families import FAMILIES, Family
from maxckpt.formats.hf import layout as hfl
from maxckpt.layouts import geometry
from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.forms import Conv, Flat, Kernel, Swapped, Values, Vector, power_of_two
from maxckpt.layouts.mapping import Entry, Experts, Part, Regrouped, Same

PARAMS_PREFIX = "params/params/"
AUX_PREFIX = "nnx_aux/model/"  # NNX model variables that are not params (DeepSeek's routing bias)


@dataclass(frozen=True)
class ModelVariable(Same):
    """A model variable MaxText keeps in the training state (`nnx_aux/model/`, layers first), not in params:
    DeepSeek's routing bias."""


def kernel(key: str, hf: str, in_dims: tuple[str, ...], out_dims: tuple[str, ...], **flags: Any) -> Same:
    """A DenseGeneral kernel `[in..., out...]` and HF's Linear weight."""
    return Same(key, hf, form=Kernel(in_dims, out_dims), **flags)


def vector(key: str, hf: str, dims: tuple[str, ...], **flags: Any) -> Same:
    """An array MaxText and HF hold alike (norm scales, biases, tables)."""
    return Same(key, hf, form=Vector(dims), **flags)


def maxtext_values(spec: ModelSpec, model_dtype: np.dtype | None = None) -> Values:
    """How MaxText's stored values differ from HF's for `spec` (the query scale it folds in, Gemma's norm
    offset and embedding scale), for a model whose main dtype is `model_dtype`."""
    return Values(query_factor=query_factor(spec), norm_offset=spec.norm_offset,
                  embedding_scale=math.sqrt(spec.emb_dim) if spec.maxtext_embedding_scaled else None,
                  model_dtype=model_dtype)


def model_dtype(tensors: Mapping[str, Any]) -> np.dtype | None:
    """The floating dtype holding most of the model's elements: the one widened params came from."""
    counts: dict[np.dtype, int] = {}
    for t in tensors.values():
        if tf.is_float(t.dtype):
            counts[np.dtype(t.dtype)] = counts.get(np.dtype(t.dtype), 0) + math.prod(t.shape)
    return max(counts, key=counts.get) if counts else None


def query_factor(spec: ModelSpec) -> float:
    """HF q_proj = MaxText query kernel * this factor.

    HF scales scores by query_pre_attn_scalar**-0.5 (head_dim**-0.5 unless a
    Gemma config says otherwise). MaxText either folded that scale into the
    kernel (llama, mistral, mixtral, gemma2: factor sqrt(scalar)) or scales by
    head_dim**-0.5 at runtime (qwen3, gemma3, gpt-oss: factor
    sqrt(scalar / head_dim), 1 when they agree).
    """
    scalar = float(spec.query_pre_attn_scalar or spec.head_dim)
    return math.sqrt(scalar) if spec.maxtext_query_scale else math.sqrt(scalar / spec.head_dim)


def float32_rounding_note(spec: ModelSpec) -> str | None:
    """What a float32 conversion between MaxText and HF rounds for this model, or None when nothing does.

    MaxText folds the query scale into the query kernel (llama-style families) and stores Gemma's table times
    sqrt(emb); HF stores neither. A factor that is not a power of two (sqrt(128), sqrt(2304) = 48) rounds in
    float32, and no float32 value can always be chosen to come back exactly: measured on 1M normal values,
    85-96% of such a tensor's values survive a MaxText <-> HF round trip bit for bit, the rest are 1 ulp off.
    A bfloat16 model loses nothing (those tensors are widened to float32, :func:`maxckpt.layouts.forms.widens`).
    """
    parts = []
    factor = query_factor(spec)
    if FAMILIES[spec.family].attention != "mla" and factor != 1.0 and not power_of_two(factor):
        parts.append(f"the query kernels by {factor:.6g}")
    if spec.maxtext_embedding_scaled and not power_of_two(math.sqrt(spec.emb_dim)):
        parts.append(f"the embedding table by sqrt({spec.emb_dim}) = {math.sqrt(spec.emb_dim):.6g}")
    if not parts:
        return None
    return (f"float32: MaxText and HF differ in {' and '.join(parts)}, which rounds the last bit of some values "
            "(a round trip gives back 85-96% of them exactly, the rest 1 ulp off; a bfloat16 model is exact)")


def attention_params(spec: ModelSpec, module: str) -> list[Entry]:
    """One layer's attention entries under MaxText module `module` (self_attention, GptOssAttention, ...)."""
    m = module
    if spec.kv_lora_rank:  # MLA: every kernel is an ordinary [in..., out...] DenseGeneral
        query = [  # a query LoRA, or (q_lora_rank 0, deepseek2-16b) one query kernel
            kernel(f"{m}/wq_a/kernel", "self_attn.q_a_proj.weight", ("E",), ("QL",)),
            vector(f"{m}/q_norm/scale", "self_attn.q_a_layernorm.weight", ("QL",), norm=True),
            kernel(f"{m}/wq_b/kernel", "self_attn.q_b_proj.weight", ("QL",), ("Hq", "QK")),
        ] if spec.q_lora_rank else [kernel(f"{m}/query/kernel", "self_attn.q_proj.weight", ("E",), ("Hq", "QK"))]
        indexer = [  # DeepSeek-V3.2's sparse-attention indexer (its k_norm is a LayerNorm: scale and bias)
            kernel(f"{m}/indexer/wq_b/kernel", "self_attn.indexer.wq_b.weight", ("QL",), ("IH", "ID")),
            kernel(f"{m}/indexer/wk/kernel", "self_attn.indexer.wk.weight", ("E",), ("ID",)),
            vector(f"{m}/indexer/k_norm/scale", "self_attn.indexer.k_norm.weight", ("ID",)),
            vector(f"{m}/indexer/k_norm/bias", "self_attn.indexer.k_norm.bias", ("ID",)),
            kernel(f"{m}/indexer/weights_proj/kernel", "self_attn.indexer.weights_proj.weight", ("E",), ("IH",)),
        ] if spec.indexer_n_heads > 0 else []
        return [
            *query,
            *indexer,
            kernel(f"{m}/wkv_a/kernel", "self_attn.kv_a_proj_with_mqa.weight", ("E",), ("KVA",)),
            vector(f"{m}/kv_norm/scale", "self_attn.kv_a_layernorm.weight", ("KL",), norm=True),
            kernel(f"{m}/wkv_b/kernel", "self_attn.kv_b_proj.weight", ("KL",), ("Hq", "KVB")),
            kernel(f"{m}/out/kernel", "self_attn.o_proj.weight", ("Hq", "VD"), ("E",)),
        ]
    if spec.attention_output_gate:  # [query | gate] per head: no rotary reordering ("half" families only)
        query = kernel(f"{m}/query/kernel", "self_attn.q_proj.weight", ("E",), ("Hq", "2D"), query=True)
    else:
        query = kernel(f"{m}/query/kernel", "self_attn.q_proj.weight", ("E",), ("Hq", "D"), rotary="q", query=True)
    out: list[Entry] = [
        query,
        kernel(f"{m}/key/kernel", "self_attn.k_proj.weight", ("E",), ("Hkv", "D"), rotary="k"),
        kernel(f"{m}/value/kernel", "self_attn.v_proj.weight", ("E",), ("Hkv", "D")),
        # a gated attention's output is flattened and gated before the projection: [Hq*D, E]
        kernel(f"{m}/out/kernel", "self_attn.o_proj.weight", ("Hq*D",) if spec.attention_output_gate else ("Hq", "D"),
               ("E",)),
    ]
    if spec.attention_bias or spec.qkv_bias:  # q/k/v biases: gpt-oss's (with out/bias) or qwen2.5's
        out += [
            Same(f"{m}/query/bias", "self_attn.q_proj.bias", form=Flat(("Hq", "D")), rotary="q", query=True),
            Same(f"{m}/key/bias", "self_attn.k_proj.bias", form=Flat(("Hkv", "D")), rotary="k"),
            Same(f"{m}/value/bias", "self_attn.v_proj.bias", form=Flat(("Hkv", "D"))),
        ]
    if spec.attention_bias:
        out.append(vector(f"{m}/out/bias", "self_attn.o_proj.bias", ("E",)))
    if spec.qk_norm:
        out += qk_norm_params(spec, m)
    if spec.attention_sinks:
        out.append(vector(f"{m}/sinks", "self_attn.sinks", ("Hq",)))
    return out


def qk_norm_params(spec: ModelSpec, m: str) -> list[Entry]:
    """The q/k norm scales: per head feature [D] (reordered with the rotary features), or over the whole
    projection [H*D] (olmo3's, in HF's order already: no rotary reordering applies to a family without it)."""
    if FAMILIES[spec.family].qk_norm_across_heads:
        return [vector(f"{m}/query_norm/scale", "self_attn.q_norm.weight", ("Hq*D",), norm=True),
                vector(f"{m}/key_norm/scale", "self_attn.k_norm.weight", ("Hkv*D",), norm=True)]
    return [
        vector(f"{m}/query_norm/scale", "self_attn.q_norm.weight", ("D",), rotary="q", norm=True),
        vector(f"{m}/key_norm/scale", "self_attn.k_norm.weight", ("D",), rotary="k", norm=True),
    ]


def dense_mlp_params(module: str = "mlp", hf_block: str = "mlp") -> list[Entry]:
    return [
        kernel(f"{module}/wi_0/kernel", f"{hf_block}.gate_proj.weight", ("E",), ("F",)),
        kernel(f"{module}/wi_1/kernel", f"{hf_block}.up_proj.weight", ("E",), ("F",)),
        kernel(f"{module}/wo/kernel", f"{hf_block}.down_proj.weight", ("F",), ("E",)),
    ]


def moe_params(spec: ModelSpec, family: Family) -> list[Entry]:
    """The router, routed experts (and shared experts, routing bias) of one MoE layer."""
    m = family.maxtext_moe
    # gpt-oss: experts not transposed, gate/up interleaved in one HF tensor
    if family.hf_experts == "fused_interleaved":
        gate_up, gate_up_bias = "mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj_bias"
        return [
            kernel(f"{m}/gate/kernel", "mlp.router.weight", ("E",), ("X",)),
            *([vector(f"{m}/gate/bias", "mlp.router.bias", ("X",))] if spec.router_bias else []),
            Part(f"{m}/wi_0", gate_up, form=Vector(("X", "E", "M")), slot=0),
            Part(f"{m}/wi_1", gate_up, form=Vector(("X", "E", "M")), slot=1),
            *([Part(f"{m}/wi_0_bias", gate_up_bias, form=Vector(("X", "M")), slot=0),
               Part(f"{m}/wi_1_bias", gate_up_bias, form=Vector(("X", "M")), slot=1)] if spec.expert_bias else []),
            vector(f"{m}/wo", "mlp.experts.down_proj", ("X", "M", "E")),
            *([vector(f"{m}/wo_bias", "mlp.experts.down_proj_bias", ("X", "E"))] if spec.expert_bias else []),
        ]
    block, names = family.hf_expert_block, family.hf_expert_projections
    default_shared = m.rsplit("/", 1)[0] + "/shared_experts" if "/" in m else "shared_experts"
    shared = family.maxtext_shared_experts or default_shared
    hf_shared = f"{block}.{family.hf_shared_experts}"
    shared_params = [
        kernel(f"{shared}/wi_0/kernel", f"{hf_shared}.gate_proj.weight", ("E",), ("S",)),
        kernel(f"{shared}/wi_1/kernel", f"{hf_shared}.up_proj.weight", ("E",), ("S",)),
        kernel(f"{shared}/wo/kernel", f"{hf_shared}.down_proj.weight", ("S",), ("E",)),
    ] if spec.num_shared_experts > 0 else []
    if family.hf_experts == "fused_concat":  # llama4: [X, E, 2M] gate then up, [X, M, E]; MaxText's layout as is
        gate_up = f"{block}.experts.gate_up_proj"
        return [
            kernel(f"{m}/gate/kernel", f"{block}.router.weight", ("E",), ("X",)),
            Part(f"{m}/wi_0", gate_up, form=Vector(("X", "E", "M")), slot=0, fused="concat"),
            Part(f"{m}/wi_1", gate_up, form=Vector(("X", "E", "M")), slot=1, fused="concat"),
            vector(f"{m}/wo", f"{block}.experts.down_proj", ("X", "M", "E")),
            *shared_params,
        ]
    routing_bias = [ModelVariable(f"{m}/gate/bias", f"{block}.gate.e_score_correction_bias", form=Vector(("X",)))]
    shared_gate = [kernel(f"{shared}_gate/kernel", f"{hf_shared}_gate.weight", ("E",), ("1",))]
    return [
        kernel(f"{m}/gate/kernel", f"{block}.gate.weight", ("E",), ("X",)),
        *(routing_bias if spec.routing == "sigmoid_bias" else []),
        Experts(f"{m}/wi_0", (f"{block}.experts.{{e}}.{names[0]}.weight",), form=Kernel(("E",), ("M",))),
        Experts(f"{m}/wi_1", (f"{block}.experts.{{e}}.{names[1]}.weight",), form=Kernel(("E",), ("M",))),
        Experts(f"{m}/wo", (f"{block}.experts.{{e}}.{names[2]}.weight",), form=Kernel(("M",), ("E",))),
        *shared_params,
        *(shared_gate if spec.num_shared_experts > 0 and spec.shared_expert_gate else []),
    ]


def linear_attention_params(module: str, split: bool = False) -> list[Entry]:
    """One Gated DeltaNet layer's entries under MaxText module `module` (formats/hf/hybrid.py): HF packs the
    input projections alike, or (`split`, qwen3.5) holds each head-major part apart."""
    m = module
    qkvz = (kernel(f"{m}/in_proj_qkvz/kernel", "linear_attn.in_proj_qkvz.weight", ("E",), ("GQKVZ",)),
            kernel(f"{m}/in_proj_ba/kernel", "linear_attn.in_proj_ba.weight", ("E",), ("GBA",)))
    if split:
        qkvz = (Regrouped(f"{m}/in_proj_qkvz/kernel",
                          ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight"),
                          form=Kernel(("E",), ("GQKVZ",)), grouping="qkvz"),
                Regrouped(f"{m}/in_proj_ba/kernel", ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
                          form=Kernel(("E",), ("GBA",)), grouping="ba"))
    return [
        *qkvz,
        Same(f"{m}/conv1d/kernel", "linear_attn.conv1d.weight", form=Conv(("GCK", "1", "GC"))),
        vector(f"{m}/dt_bias", "linear_attn.dt_bias", ("GVH",)),
        vector(f"{m}/A_log", "linear_attn.A_log", ("GVH",)),
        vector(f"{m}/norm/rms_norm/scale", "linear_attn.norm.weight", ("GVD",)),  # a plain RMSNorm: no offset
        kernel(f"{m}/out_proj/kernel", "linear_attn.out_proj.weight", ("GV",), ("E",)),
    ]


def norm_params(spec: ModelSpec, suffix: str = "") -> list[Entry]:
    if spec.sandwich_norms:  # Gemma: norms around attention and around the MLP
        return [
            vector(f"pre_self_attention_norm{suffix}/scale", "input_layernorm.weight", ("E",), norm=True),
            vector(f"post_self_attention_norm{suffix}/scale", "post_attention_layernorm.weight", ("E",), norm=True),
            vector(f"pre_ffw_norm{suffix}/scale", "pre_feedforward_layernorm.weight", ("E",), norm=True),
            vector(f"post_ffw_norm{suffix}/scale", "post_feedforward_layernorm.weight", ("E",), norm=True),
        ]
    family = FAMILIES[spec.family]
    (pre, post), (hf_pre, hf_post) = family.maxtext_layer_norms, family.hf_layer_norms
    return [
        vector(f"{pre}/scale", f"{hf_pre}.weight", ("E",), norm=True),
        vector(f"{post}/scale", f"{hf_post}.weight", ("E",), norm=True),
    ]


def layer_params(spec: ModelSpec, moe: bool, suffix: str = "", linear: bool = False) -> tuple[Entry, ...]:
    """Every entry of one MaxText layer (gemma2's half-layers carry `suffix` _local/_global; `linear`: a
    Gated DeltaNet layer of a hybrid)."""
    family = FAMILIES[spec.family]
    attention = family.maxtext_attention + suffix
    if linear:
        mixer = linear_attention_params(family.maxtext_linear_attention, family.hf_gdn_projections == "split")
    else:
        mixer = attention_params(spec, attention)
    mlp = moe_params(spec, family) if moe else dense_mlp_params("mlp" + suffix, family.hf_mlp_block)
    return (*mixer, *mlp, *norm_params(spec, suffix))


def global_params(spec: ModelSpec) -> tuple[Entry, ...]:
    """The embedding, the final norm, the output (untied) and gemma4 e2b/e4b's per-layer input embedder."""
    out: list[Entry] = [
        vector("token_embedder/embedding", hfl.EMBED, ("V", "E"), embedding=True),
        vector("decoder/decoder_norm/scale", hfl.FINAL_NORM, ("E",), norm=True),
    ]
    if not spec.tie_word_embeddings:
        out.append(kernel("decoder/logits_dense/kernel", hfl.LM_HEAD, ("E",), ("V",)))
    if spec.per_layer_input_dim > 0:  # its table is scaled at runtime, in MaxText and HF alike
        embedder = "decoder/per_layer_embedder"
        out += [
            vector(f"{embedder}/embed_tokens_per_layer", "model.embed_tokens_per_layer.weight", ("VP", "L*P")),
            kernel(f"{embedder}/per_layer_model_projection/kernel", "model.per_layer_model_projection.weight",
                   ("E",), ("L*P",)),
            vector(f"{embedder}/per_layer_projection_norm/scale", "model.per_layer_projection_norm.weight", ("P",),
                   norm=True),
        ]
    return tuple(out)


def local_global_layer_params(spec: ModelSpec, i: int) -> tuple[Entry, ...]:
    """Layer i's entries of a local/global model (gemma4), sized by its own spec: the common table, less the
    value kernel where the key is the value, plus the layer scalar."""
    sizes = geometry.layer_spec(spec, i)
    params = [p for p in layer_params(sizes, False)
              if not (geometry.value_is_key(spec, i) and p.hf == "self_attn.v_proj.weight")]
    if geometry.is_kv_shared(spec, i):  # e2b/e4b: keys and values from the donor layer
        dropped = ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight")
        params = [p for p in params if p.hf not in dropped]
    if spec.per_layer_input_dim:
        params += [
            kernel("per_layer_input_gate/kernel", "per_layer_input_gate.weight", ("E",), ("P",)),
            kernel("per_layer_projection/kernel", "per_layer_projection.weight", ("P",), ("E",)),
            vector("post_per_layer_input_norm/scale", "post_per_layer_input_norm.weight", ("E",), norm=True),
        ]
    if spec.num_experts:  # gemma4's MoE: the dense MLP is `moe_block/shared_experts`, beside the experts
        params = [p for p in params if not p.key.startswith("mlp/")] + packed_parallel_moe_params(spec)
    if spec.layer_scalar:
        params.append(vector("layer_scalar", "layer_scalar", ("1",)))
    return tuple(params)


def packed_parallel_moe_params(spec: ModelSpec) -> list[Entry]:
    """Gemma4MoE's entries (families/gemma4_moe.py): the dense MLP, the router and the packed experts."""
    m = FAMILIES[spec.family].maxtext_moe  # mlp/moe_block/MoeBlock_0
    dense = m.rsplit("/", 1)[0] + "/shared_experts"
    return [
        kernel(f"{dense}/wi_0/kernel", "mlp.gate_proj.weight", ("E",), ("F",)),
        kernel(f"{dense}/wi_1/kernel", "mlp.up_proj.weight", ("E",), ("F",)),
        kernel(f"{dense}/wo/kernel", "mlp.down_proj.weight", ("F",), ("E",)),
        kernel(f"{m}/gate/kernel", "router.proj.weight", ("E",), ("X",)),
        vector("mlp/pre_forward_scale_2", "router.scale", ("E",)),
        vector(f"{m}/per_expert_scale", "router.per_expert_scale", ("X",)),
        Part(f"{m}/wi_0", "experts.gate_up_proj", form=Vector(("X", "E", "M")), slot=0, fused="swapped"),
        Part(f"{m}/wi_1", "experts.gate_up_proj", form=Vector(("X", "E", "M")), slot=1, fused="swapped"),
        Same(f"{m}/wo", "experts.down_proj", form=Swapped(("X", "M", "E"))),
        vector("mlp/post_feedforward_layernorm_1/scale", "post_feedforward_layernorm_1.weight", ("E",), norm=True),
        vector("mlp/post_feedforward_layernorm_2/scale", "post_feedforward_layernorm_2.weight", ("E",), norm=True),
        vector("mlp/pre_feedforward_layernorm_2/scale", "pre_feedforward_layernorm_2.weight", ("E",), norm=True),
    ]
