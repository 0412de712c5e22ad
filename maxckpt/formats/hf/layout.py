"""The HuggingFace layout: the hub every other layout maps to and from (names and shapes, no I/O).

HF names and shapes (`model.layers.{i}.self_attn.q_proj.weight` [Hq*D, E],
rotate-half q/k rows, no folded query scaling) are the common language of
the conversion pipeline. What config.json says is :mod:`maxckpt.formats.hf.config`;
reading and writing the files beside the tensors is :mod:`maxckpt.formats.hf.files`.

>>> spec = ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 256)
>>> sorted(expected_tensors(spec))[:2]
['lm_head.weight', 'model.embed_tokens.weight']
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES
from maxckpt.families.registry import refine_tree_family
from maxckpt.formats.hf import fused_experts, gemma4, hybrid
from maxckpt.formats.hf.layer_patterns import LAYER_PATTERNS, layer_pattern
from maxckpt.layouts import geometry
from maxckpt.layouts.dims import shape_of
from maxckpt.layouts.geometry import is_moe_layer
from maxckpt.layouts.transforms import lazy_rename
from maxckpt.tensors import LazyTensor, TensorInfo

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
LAYER = "model.layers.{i}."
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.")
# Multimodal wrappers (Gemma3ForConditionalGeneration) keep the text model under this prefix.
LANGUAGE_MODEL_PREFIX = "model.language_model."

# Per-layer tensors: suffix -> shape in spec dimension symbols.
LAYER_TENSORS: dict[str, tuple[str, ...]] = {
    "self_attn.q_proj.weight": ("Hq*D", "E"),
    "self_attn.k_proj.weight": ("Hkv*D", "E"),
    "self_attn.v_proj.weight": ("Hkv*D", "E"),
    "self_attn.o_proj.weight": ("E", "Hq*D"),
    "mlp.gate_proj.weight": ("F", "E"),
    "mlp.up_proj.weight": ("F", "E"),
    "mlp.down_proj.weight": ("E", "F"),
    "input_layernorm.weight": ("E",),
    "post_attention_layernorm.weight": ("E",),
}
QK_NORM_TENSORS: dict[str, tuple[str, ...]] = {
    "self_attn.q_norm.weight": ("D",),
    "self_attn.k_norm.weight": ("D",),
}



def layer_name(i: int, suffix: str) -> str:
    """The HF name of a per-layer tensor:
    `layer_name(3, "mlp.up_proj.weight")` -> `model.layers.3.mlp.up_proj.weight`."""
    return LAYER.format(i=i) + suffix


def is_global_layer(spec: ModelSpec, i: int) -> bool:
    """Layer i attends to the whole sequence (not a sliding window)."""
    n = spec.sliding_window_pattern
    return not n or i % n == n - 1


def attention_tensors(spec: ModelSpec) -> dict[str, tuple[str, ...]]:
    """One layer's attention tensors: MHA (q/k/v/o, biases, q/k norms, sinks) or MLA."""
    if spec.kv_lora_rank:  # MLA; its query through a LoRA (q_a / q_b) or, q_lora_rank 0, one q_proj (deepseek2)
        query = {"self_attn.q_proj.weight": ("Hq*QK", "E")} if not spec.q_lora_rank else {
            "self_attn.q_a_proj.weight": ("QL", "E"),
            "self_attn.q_a_layernorm.weight": ("QL",),
            "self_attn.q_b_proj.weight": ("Hq*QK", "QL"),
        }
        indexer = {} if not spec.indexer_n_heads else {  # DeepSeek-V3.2's sparse-attention indexer
            "self_attn.indexer.wq_b.weight": ("IH*ID", "QL"),
            "self_attn.indexer.wk.weight": ("ID", "E"),
            "self_attn.indexer.k_norm.weight": ("ID",),
            "self_attn.indexer.k_norm.bias": ("ID",),
            "self_attn.indexer.weights_proj.weight": ("IH", "E"),
        }
        return {
            **query,
            **indexer,
            "self_attn.kv_a_proj_with_mqa.weight": ("KVA", "E"),
            "self_attn.kv_a_layernorm.weight": ("KL",),
            "self_attn.kv_b_proj.weight": ("Hq*KVB", "KL"),
            "self_attn.o_proj.weight": ("E", "Hq*VD"),
        }
    out = {suffix: LAYER_TENSORS[suffix] for suffix in list(LAYER_TENSORS)[:4]}
    if spec.attention_output_gate:  # [query | gate] per head
        out["self_attn.q_proj.weight"] = ("Hq*2D", "E")
    if spec.attention_bias:
        out.update({
            "self_attn.q_proj.bias": ("Hq*D",), "self_attn.k_proj.bias": ("Hkv*D",),
            "self_attn.v_proj.bias": ("Hkv*D",), "self_attn.o_proj.bias": ("E",),
        })
    elif spec.qkv_bias:  # qwen2.5: q/k/v only
        out.update({
            "self_attn.q_proj.bias": ("Hq*D",), "self_attn.k_proj.bias": ("Hkv*D",),
            "self_attn.v_proj.bias": ("Hkv*D",),
        })
    if spec.qk_norm and FAMILIES[spec.family].qk_norm_across_heads:  # olmo3: over the whole projection
        out.update({"self_attn.q_norm.weight": ("Hq*D",), "self_attn.k_norm.weight": ("Hkv*D",)})
    elif spec.qk_norm:
        out.update(QK_NORM_TENSORS)
    if spec.attention_sinks:
        out["self_attn.sinks"] = ("Hq",)
    return out


def mlp_tensors(spec: ModelSpec, i: int) -> dict[str, tuple[str, ...]]:
    """Layer i's MLP: dense gate/up/down, or the router, every expert and any shared expert."""
    family = FAMILIES[spec.family]
    if not is_moe_layer(spec, i):
        return {
            f"{family.hf_mlp_block}.{proj}.weight": LAYER_TENSORS[f"mlp.{proj}.weight"]
            for proj in ("gate_proj", "up_proj", "down_proj")
        }
    if family.hf_experts == "packed_parallel":
        return gemma4.moe_tensors()
    out: dict[str, tuple[str, ...]] = {}
    if family.hf_experts == "fused_concat":  # llama4: the router, fused experts, one shared expert
        block, shared = family.hf_expert_block, f"{family.hf_expert_block}.{family.hf_shared_experts}"
        out.update({f"{block}.router.weight": ("X", "E"), f"{block}.experts.gate_up_proj": ("X", "E", "2*M"),
                    f"{block}.experts.down_proj": ("X", "M", "E")})
        if spec.num_shared_experts:
            out.update({f"{shared}.gate_proj.weight": ("S", "E"), f"{shared}.up_proj.weight": ("S", "E"),
                        f"{shared}.down_proj.weight": ("E", "S")})
        return out
    if family.hf_experts == "fused_interleaved":
        out["mlp.router.weight"] = ("X", "E")
        if spec.router_bias:
            out["mlp.router.bias"] = ("X",)
        out["mlp.experts.gate_up_proj"] = ("X", "E", "2*M")
        if spec.expert_bias:
            out["mlp.experts.gate_up_proj_bias"] = ("X", "2*M")
        out["mlp.experts.down_proj"] = ("X", "M", "E")
        if spec.expert_bias:
            out["mlp.experts.down_proj_bias"] = ("X", "E")
        return out
    block, names = family.hf_expert_block, family.hf_expert_projections
    out[f"{block}.gate.weight"] = ("X", "E")
    if spec.routing == "sigmoid_bias":
        out[f"{block}.gate.e_score_correction_bias"] = ("X",)
    for e in range(spec.num_experts):
        out[f"{block}.experts.{e}.{names[0]}.weight"] = ("M", "E")
        out[f"{block}.experts.{e}.{names[1]}.weight"] = ("M", "E")
        out[f"{block}.experts.{e}.{names[2]}.weight"] = ("E", "M")
    if spec.num_shared_experts:
        shared = f"{block}.{family.hf_shared_experts}"
        out.update({
            f"{shared}.gate_proj.weight": ("S", "E"),
            f"{shared}.up_proj.weight": ("S", "E"),
            f"{shared}.down_proj.weight": ("E", "S"),
        })
        if spec.shared_expert_gate:
            out[f"{shared}_gate.weight"] = ("1", "E")
    return out


def layer_tensors(spec: ModelSpec, i: int) -> dict[str, tuple[str, ...]]:
    """Every tensor of HF layer i: suffix -> shape symbols."""
    if hybrid.is_linear_layer(spec, i):
        out = hybrid.linear_attention_tensors(FAMILIES[spec.family].hf_gdn_projections == "split")
    else:
        out = attention_tensors(spec)
    out.update(mlp_tensors(spec, i))
    for norm in FAMILIES[spec.family].hf_layer_norms:
        out[f"{norm}.weight"] = ("E",)
    if spec.sandwich_norms:
        out["pre_feedforward_layernorm.weight"] = ("E",)
        out["post_feedforward_layernorm.weight"] = ("E",)
    if geometry.value_is_key(spec, i):  # gemma4's global layers: the key is also the value
        out.pop("self_attn.v_proj.weight", None)
    if geometry.is_kv_shared(spec, i):  # gemma4 e2b/e4b: keys and values from an earlier layer
        for suffix in ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight"):
            out.pop(suffix, None)
    if spec.per_layer_input_dim:
        out.update(gemma4.per_layer_input_tensors())
    if spec.layer_scalar:
        out["layer_scalar"] = ("1",)
    return out


def in_layer_order(tensors: Mapping[str, Any], spec: ModelSpec, i: int) -> dict[str, Any]:
    """Layer i's tensors (by HF suffix) in HF's order, so every bridge writes an HF layer the same way."""
    order = {suffix: k for k, suffix in enumerate(layer_tensors(spec, i))}
    return dict(sorted(tensors.items(), key=lambda item: order.get(item[0], len(order))))


def in_hf_order(tensors: Mapping[str, Any], shapes: Mapping[str, Any]) -> dict[str, Any]:
    """`tensors` (by full HF name) in the order of `shapes` (an :func:`expected_tensors`), unknown names last."""
    order = {name: k for k, name in enumerate(shapes)}
    return dict(sorted(tensors.items(), key=lambda item: order.get(item[0], len(order))))


def expert_counts(names: Iterable[str]) -> dict[int, int]:
    """HF layer -> number of routed experts its tensor names hold (per-expert naming)."""
    counts: dict[int, set[int]] = {}
    for n in names:
        m = _EXPERT_RE.match(n)
        if m:
            counts.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    return {layer: len(experts) for layer, experts in sorted(counts.items())}


def expected_tensors(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name this model has, with its shape, in HF's usual order."""
    out: dict[str, tuple[int, ...]] = {EMBED: (spec.vocab_size, spec.emb_dim)}
    if spec.per_layer_input_dim:  # gemma4 e2b/e4b's per-layer input embedder
        out.update({name: shape_of(symbols, spec) for name, symbols in gemma4.per_layer_embedder_tensors().items()})
    for i in range(spec.num_layers):
        sizes = geometry.layer_spec(spec, i)  # a layer's own head width / kv heads (gemma4's global layers)
        for suffix, symbols in layer_tensors(spec, i).items():
            out[layer_name(i, suffix)] = shape_of(symbols, sizes)
    out[FINAL_NORM] = (spec.emb_dim,)
    if not spec.tie_word_embeddings:
        out[LM_HEAD] = (spec.vocab_size, spec.emb_dim)
    return out


def check_shapes(found: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]], where: str) -> None:
    """Raise ShapeMismatchError for the first tensor whose shape differs, CorruptCheckpointError if one is missing."""
    missing = [n for n in expected if n not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CorruptCheckpointError(
            f"{where}: tensor {missing[0]!r}{more} is missing; the model spec expects it. "
            "Check that the checkpoint is complete and that --model names the right family."
        )
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise ShapeMismatchError(
                f"{where}: tensor {name!r} has shape {tuple(found[name])}, expected {tuple(shape)} "
                "from the model dimensions; the checkpoint and its config disagree."
            )


def strip_language_model(names: Mapping[str, Any]) -> dict[str, Any]:
    """`model.language_model.X` -> `model.X` (a multimodal wrapper's text model; llama4's wrapper holds
    `language_model.model.X` and `language_model.lm_head`); other names unchanged.

    Vision tensors (`model.vision_tower.*`, `model.multi_modal_projector.*`) are left as they are:
    the layouts ignore names they do not expect.
    """
    return {_text_name(n): v for n, v in names.items()}


# Llama4ForConditionalGeneration holds a whole Llama4ForCausalLM: `language_model.model.X`, `language_model.lm_head`.
_CAUSAL_LM_PREFIXES = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."))


def _text_name(name: str) -> str:
    if name.startswith(LANGUAGE_MODEL_PREFIX):
        return "model." + name[len(LANGUAGE_MODEL_PREFIX):]
    for prefix, text in _CAUSAL_LM_PREFIXES:
        if name.startswith(prefix):
            return text + name[len(prefix):]
    return name


def tree_family(infos: Mapping[str, Any]) -> str | None:
    """The family HF tensor names alone say, for the MoE, MLA and Gemma families (else None)."""
    has = lambda suffix: f"model.layers.0.{suffix}" in infos or any(n.endswith(suffix) for n in infos)  # noqa: E731
    if has("self_attn.kv_a_proj_with_mqa.weight"):
        return refine_tree_family("deepseek3", infos)  # deepseek2's q_proj, deepseek3.2's indexer
    if has("linear_attn.in_proj_qkvz.weight"):  # before gpt-oss: a hybrid's experts may be saved fused too
        return "qwen3-next"
    if has("linear_attn.in_proj_qkv.weight"):
        return "qwen3.5"
    if has("self_attn.sinks") or has("mlp.experts.gate_up_proj"):
        return "gpt-oss"
    for family in FAMILIES.values():  # fused experts under a block of the family's own (llama4's feed_forward)
        if family.hf_experts == "fused_concat" and has(f"{family.hf_expert_block}.experts.gate_up_proj"):
            return family.name
    if any(".block_sparse_moe." in n for n in infos):
        return "mixtral"
    if any(_EXPERT_RE.match(n) for n in infos):
        return "qwen3-moe"
    if gemma4.is_gemma4(infos):  # layer scalars: a local/global family, MoE when it has experts
        moe = any(n.endswith(".experts.down_proj") for n in infos)
        small = any(n.endswith("embed_tokens_per_layer.weight") for n in infos)
        return next((n for n, f in FAMILIES.items() if f.maxtext_scan == "local_global"
                     and (f.maxtext_moe is not None) == moe and f.per_layer_inputs == small), None)
    if has("post_feedforward_layernorm.weight") and not has("pre_feedforward_layernorm.weight"):
        return "olmo3"  # norms after attention and the MLP, none before
    if has("pre_feedforward_layernorm.weight"):
        return "gemma3" if has("self_attn.q_norm.weight") else "gemma2"
    return None


class HFLayout:
    """HF names are the hub, so both directions are (validated) identities."""

    name = "hf"

    def __init__(self, for_transformers: bool = True):
        # False: HF names in another container (plain torch), which need not be a model transformers can load.
        self.for_transformers = for_transformers

    def detect(self, infos: Mapping[str, TensorInfo]) -> bool:
        infos = strip_language_model(infos)
        return EMBED in infos and any(n.startswith("model.layers.") for n in infos)

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        infos = strip_language_model(infos)
        if EMBED not in infos:
            raise CorruptCheckpointError(
                f"no {EMBED!r} among {len(infos)} tensors: not a decoder-only HF model maxckpt knows"
            )
        vocab, emb = infos[EMBED].shape
        layers = {int(m.group(1)) for n in infos if (m := _LAYER_RE.match(n))}
        num_layers = max(layers) + 1 if layers else 0
        family = tree_family(infos)
        dims: dict[str, Any] = {
            "vocab_size": vocab,
            "emb_dim": emb,
            "num_layers": num_layers,
            "tie_word_embeddings": LM_HEAD not in infos,
            "qk_norm": "model.layers.0.self_attn.q_norm.weight" in infos,
        }
        if family:
            dims["_family"] = family
        get = lambda suffix, i=0: infos.get(layer_name(i, suffix))  # noqa: E731
        mlp_block = FAMILIES[family].hf_mlp_block if family else "mlp"
        gate = next((g for i in range(num_layers) if (g := get(f"{mlp_block}.gate_proj.weight", i)) is not None),
                    None)
        if gate is not None:
            dims["mlp_dim"] = gate.shape[0]
        dims.update(_hf_moe_dims(infos, num_layers))
        pattern = layer_pattern(FAMILIES[family]) if family else LAYER_PATTERNS["layers"]
        if pattern.layer_dims:  # the pattern's own layers (a hybrid's) tell the widths
            record = FAMILIES[family]
            if fused_experts.has_fused_experts(infos, record.hf_expert_block):  # transformers 5's fused experts
                views = fused_experts.per_expert_views(infos, record.hf_expert_block, record.hf_expert_projections)
                dims.update(_hf_moe_dims(views, num_layers))
            dims.update(pattern.layer_dims(infos, layer_name, num_layers))
            if dims.get("num_experts"):
                dims["mlp_dim"] = dims["moe_mlp_dim"]
            return dims
        if dims.get("num_experts") and gate is None:
            dims["mlp_dim"] = dims["moe_mlp_dim"]  # all layers MoE: the expert width stands for the MLP width
        q_a = get("self_attn.q_a_proj.weight")
        if get("self_attn.kv_a_proj_with_mqa.weight") is not None:  # MLA: every width follows from the shapes
            q_lora = q_a.shape[0] if q_a is not None else 0  # 0: one q_proj (deepseek2-16b)
            kv_lora = get("self_attn.kv_a_layernorm.weight").shape[0]
            rope = get("self_attn.kv_a_proj_with_mqa.weight").shape[0] - kv_lora
            q_b = get("self_attn.q_b_proj.weight" if q_lora else "self_attn.q_proj.weight").shape[0]  # H*(nope+rope)
            kv_b = get("self_attn.kv_b_proj.weight").shape[0]  # H * (nope + v)
            o = get("self_attn.o_proj.weight").shape[1]  # H * v
            heads = (q_b - kv_b + o) // rope if rope > 0 else 0
            dims.update(q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_rope_head_dim=rope, head_dim=rope)
            index_weights = get("self_attn.indexer.weights_proj.weight")
            if index_weights is not None:  # DeepSeek-V3.2's indexer: heads and width from its projections
                dims.update(indexer_n_heads=index_weights.shape[0],
                            indexer_head_dim=get("self_attn.indexer.wk.weight").shape[0])
            if heads > 0 and q_b % heads == 0 and o % heads == 0:
                dims.update(
                    num_heads=heads, num_kv_heads=heads, v_head_dim=o // heads, qk_nope_head_dim=q_b // heads - rope
                )
            return dims
        if get("self_attn.q_proj.bias") is not None:  # with an o_proj bias: gpt-oss's four; without: qwen2.5's
            dims["attention_bias" if get("self_attn.o_proj.bias") is not None else "qkv_bias"] = True
        if get("self_attn.sinks") is not None:
            dims["attention_sinks"] = True
        q, k = get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight")
        if q is not None and k is not None:  # H*D and G*D: one factor (config or --set) gives the rest
            dims["_q_features"], dims["_kv_features"] = q.shape[0], k.shape[0]
        if dims["qk_norm"] and not (family and FAMILIES[family].qk_norm_across_heads):
            # q/k norms are per head feature, so they tell head_dim and thus the head counts.
            head_dim = get("self_attn.q_norm.weight").shape[0]
            dims["head_dim"] = head_dim
            dims["num_heads"] = infos[layer_name(0, "self_attn.q_proj.weight")].shape[0] // head_dim
            dims["num_kv_heads"] = infos[layer_name(0, "self_attn.k_proj.weight")].shape[0] // head_dim
            dims.update(pattern.head_dims(infos, layer_name, num_layers))  # layers wider than layer 0 (gemma4)
        elif dims.get("attention_sinks"):  # one sink per query head
            dims["num_heads"] = get("self_attn.sinks").shape[0]
        return dims

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        tensors = strip_language_model(tensors)
        family = FAMILIES[spec.family]
        if family.hf_experts == "per_expert" and fused_experts.has_fused_experts(tensors, family.hf_expert_block):
            tensors = fused_experts.per_expert_views(tensors, family.hf_expert_block, family.hf_expert_projections)
        expected = expected_tensors(spec)
        _check_expert_names(tensors, spec)
        check_shapes({n: t.shape for n, t in tensors.items()}, expected, "HF checkpoint")
        return {
            name: tensors[name] if tensors[name].name == name else lazy_rename(tensors[name], name) for name in expected
        }

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        if FAMILIES[spec.family].hf_renormalises_topk and spec.num_experts and not spec.norm_topk_prob:
            raise UnsupportedModelError(
                f"{spec.family}: transformers' model always renormalises the top-k routing weights, but this model "
                "does not (norm_topk_prob=false); its HF export would compute different logits"
            )
        family = FAMILIES[spec.family]
        if (self.for_transformers and family.hf_last_layer_full and spec.num_layers
                and not geometry.is_full_attention(spec, spec.num_layers - 1)):
            raise UnsupportedModelError(
                f"{spec.family}: transformers makes the last layer full attention whatever layer_types says, but "
                f"layer {spec.num_layers - 1} of this model is a sliding layer ({spec.num_layers} layers, every "
                f"{spec.sliding_window_pattern}th full): its HF model would compute other logits; convert to "
                "maxtext or torch instead"
            )
        reason = layer_pattern(family).unloadable(spec)
        if self.for_transformers and reason:
            raise UnsupportedModelError(f"{spec.family}: {reason}; convert to maxtext or torch instead")
        expected = expected_tensors(spec)
        check_shapes({n: t.shape for n, t in hf.items()}, expected, "HF tensors")
        # Keep the incoming order: sources that stream stacked tensors rely on it.
        return {name: t for name, t in hf.items() if name in expected}


def _hf_moe_dims(infos: Mapping[str, TensorInfo], num_layers: int) -> dict[str, Any]:
    """Experts, expert width, shared experts and leading dense layers from HF MoE tensor names."""
    for i in range(num_layers):
        fused = infos.get(layer_name(i, "mlp.experts.down_proj"))
        if fused is not None and len(fused.shape) == 3:  # gpt-oss: [X, M, E]
            return {"num_experts": fused.shape[0], "moe_mlp_dim": fused.shape[1], "first_dense_layers": i,
                    "router_bias": layer_name(i, "mlp.router.bias") in infos,
                    "expert_bias": layer_name(i, "mlp.experts.down_proj_bias") in infos}
        fused = infos.get(layer_name(i, "feed_forward.experts.down_proj"))
        if fused is not None and len(fused.shape) == 3:  # llama4: [X, M, E], the first MoE layer is step - 1
            shared = infos.get(layer_name(i, "feed_forward.shared_expert.gate_proj.weight"))
            return {"num_experts": fused.shape[0], "moe_mlp_dim": fused.shape[1], "first_dense_layers": 0,
                    "interleave_moe_layer_step": i + 1,
                    "num_shared_experts": shared.shape[0] // fused.shape[1] if shared is not None else 0}
        counts = expert_counts(n for n in infos if n.startswith(LAYER.format(i=i)))
        if counts:
            block = "block_sparse_moe" if layer_name(i, "block_sparse_moe.gate.weight") in infos else "mlp"
            first = infos.get(layer_name(i, f"{block}.experts.0.w1.weight")) or infos.get(
                layer_name(i, f"{block}.experts.0.gate_proj.weight")
            )
            dims = {"num_experts": counts[i], "moe_mlp_dim": first.shape[0], "first_dense_layers": i}
            shared = infos.get(layer_name(i, f"{block}.shared_experts.gate_proj.weight")) or infos.get(
                layer_name(i, f"{block}.shared_expert.gate_proj.weight")
            )
            dims["num_shared_experts"] = shared.shape[0] // first.shape[0] if shared is not None else 0
            return dims
    return {}


def _check_expert_names(tensors: Mapping[str, Any], spec: ModelSpec) -> None:
    """Every MoE layer holds exactly num_experts experts: an extra expert is as wrong as a missing one."""
    if not spec.num_experts:
        return
    for layer, count in expert_counts(tensors).items():
        if count != spec.num_experts:
            raise ShapeMismatchError(
                f"HF checkpoint: layer {layer} has {count} experts, the model spec says {spec.num_experts}; "
                "the checkpoint and its config disagree."
            )
