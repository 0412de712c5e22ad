"""TorchTitan Llama 3 (and Qwen 3, Qwen 3 MoE, DeepSeek V3, gpt-oss) model keys <-> HF, as lazy tensors (no I/O).

TorchTitan saves `<checkpoint.folder>/step-<N>/` DCP directories whose model
keys sit flat at the top level (older full checkpoints prefixed them with
`model.`). Two key generations exist:

=========================================  ==============================================
classic (2024-2025)                        2026 (torchtitan 0.3.0)
=========================================  ==============================================
`layers.{i}.attention.wq.weight` (wk, wv)   `layers.{i}.attention.qkv_linear.wq.weight` ...
`output.weight`                            `lm_head.weight`
=========================================  ==============================================

shared by both: `tok_embeddings.weight`, `layers.{i}.attention.wo.weight`,
`layers.{i}.feed_forward.w1/w3/w2.weight` (gate/up/down),
`layers.{i}.attention_norm.weight`, `layers.{i}.ffn_norm.weight`,
`norm.weight`; Qwen 3 adds `layers.{i}.attention.q_norm/k_norm.weight`.
With weight tying the model state dict holds both the embedding and the
output key (same values); both are written.

Rotary: TorchTitan's Llama uses interleaved-pair rotary (Meta's layout), so q/k
rows are permuted per head against HF, as its own `Llama3StateDictAdapter`
does; its Qwen 3 uses HF's rotate-half layout and needs no permutation.
The `step-N` folders and `train_state` are the files module's (:mod:`maxckpt.formats.torchtitan.files`).

>>> layout = TorchTitanLayout(keys="2026")                          # doctest: +SKIP
>>> tt = layout.from_hf(hf_tensors, model_spec)                    # doctest: +SKIP
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

import numpy as np

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.formats.hf import layout as hfl
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES
from maxckpt.layouts.torch_transforms import rotary_rows
from maxckpt.layouts.transforms import lazy_rename
from maxckpt.tensors import LazyTensor, TensorInfo

__all__ = ["KeyGeneration", "TorchTitanLayout", "layer_keys_for", "strip_model_prefix"]

KeyGeneration = Literal["2026", "classic"]

_QKV_NAMES = {
    "2026": ("attention.qkv_linear.wq.weight", "attention.qkv_linear.wk.weight", "attention.qkv_linear.wv.weight"),
    "classic": ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight"),
}
_OUTPUT_NAMES = {"2026": "lm_head.weight", "classic": "output.weight"}
# Per-layer keys after `layers.{i}.` that both generations share, with their HF suffix.
_SHARED_LAYER_KEYS = {
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_QK_NORM_KEYS = {
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
}
# Qwen 3 MoE layers (torchtitan 0.3.0): router, experts stacked on a leading [X] axis, load-balancing bias.
_ROUTER = "moe.router.gate.weight"
_EXPERTS = {  # TorchTitan key -> HF per-expert suffix
    "moe.routed_experts.inner_experts.w1_EFD": "mlp.experts.{e}.gate_proj.weight",
    "moe.routed_experts.inner_experts.w3_EFD": "mlp.experts.{e}.up_proj.weight",
    "moe.routed_experts.inner_experts.w2_EDF": "mlp.experts.{e}.down_proj.weight",
}
_EXPERT_BIAS = "moe.expert_bias_E"
MODEL_PREFIX = "model."


_MLA_KEYS = {  # DeepSeek V3's multi-latent attention (torchtitan deepseek_v3), TorchTitan suffix -> HF suffix
    "attention.wq_a.weight": "self_attn.q_a_proj.weight",
    "attention.q_norm.weight": "self_attn.q_a_layernorm.weight",
    "attention.wq_b.weight": "self_attn.q_b_proj.weight",
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
}
# MLA without a query LoRA (DeepSeek-V2-Lite, q_lora_rank 0): TorchTitan's deepseek_v3 builds one `wq`.
_MLA_NO_Q_LORA = {"attention.wq.weight": "self_attn.q_proj.weight"}
# A family's own keys (gpt-oss's biases and sinks, its fused experts) are on its record:
# Family.torchtitan_layer_keys and Family.torchtitan_transposed_experts.
_SHARED_EXPERT_KEYS = {
    "moe.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "moe.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "moe.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}


def layer_keys_for(spec: ModelSpec, keys: KeyGeneration, i: int) -> dict[str, str]:
    """Layer i's TorchTitan suffix -> HF suffix (experts and the balancing bias are mapped apart)."""
    moe = hfl.is_moe_layer(spec, i)
    extra = FAMILIES[spec.family].torchtitan_layer_keys
    if extra:
        return {**_layer_keys(keys, spec.qk_norm, moe), **extra}
    if not spec.kv_lora_rank:
        return _layer_keys(keys, spec.qk_norm, moe)
    out = dict(_MLA_KEYS) if spec.q_lora_rank else {  # no query LoRA: one wq in place of wq_a, q_norm, wq_b
        **_MLA_NO_Q_LORA, **{k: v for k, v in _MLA_KEYS.items() if "wq_" not in k and "q_norm" not in k}}
    out.update({
        k: v for k, v in _SHARED_LAYER_KEYS.items()
        if k != "attention.wo.weight" and not (moe and k.startswith("feed_forward."))
    })
    if moe and spec.num_shared_experts:
        out.update(_SHARED_EXPERT_KEYS)
    return out


def _layer_keys(keys: KeyGeneration, qk_norm: bool, moe: bool = False) -> dict[str, str]:
    """TorchTitan per-layer key suffix -> HF suffix, in TorchTitan's state-dict order (MoE layers: no feed_forward)."""
    wq, wk, wv = _QKV_NAMES[keys]
    shared = {k: v for k, v in _SHARED_LAYER_KEYS.items() if not (moe and k.startswith("feed_forward."))}
    out = {wq: "self_attn.q_proj.weight", wk: "self_attn.k_proj.weight", wv: "self_attn.v_proj.weight", **shared}
    return {**out, **_QK_NORM_KEYS} if qk_norm else out


def _get(
    tensors: Mapping[str, LazyTensor], name: str, shape: tuple[int, ...], where: str, note: str = ""
) -> LazyTensor:
    t = tensors.get(name)
    if t is None:
        raise ShapeMismatchError(f"{where}: tensor {name!r} is missing{note}")
    if tuple(t.shape) != shape:
        raise ShapeMismatchError(f"{name}: shape {tuple(t.shape)}, the model spec implies {shape}")
    return t


def _per_expert_transposed(t: LazyTensor, name: str, balance_bias: LazyTensor | None = None) -> LazyTensor:
    """`[X, a, b]` -> `[X, b, a]`, one expert per piece (so a writer holds one expert at a time).

    `balance_bias`: TorchTitan's load-balancing bias, which must be zero (HF has no place for it).
    """
    X, a, b = t.shape

    def read(e: int) -> np.ndarray:
        if e == 0 and balance_bias is not None and np.any(balance_bias.read() != 0):
            raise UnsupportedModelError(
                f"{balance_bias.name} is non-zero: TorchTitan's load-balancing bias steers routing and HF gpt-oss "
                "has no such tensor; converting would change which experts are chosen"
            )
        return np.ascontiguousarray(t.read((e,)).T)

    def expert(e: int) -> LazyTensor:
        return LazyTensor.computed(f"{name}[{e}]", (b, a), t.dtype, lambda: read(e))

    return LazyTensor.stacked(name, [expert(e) for e in range(X)])


def strip_model_prefix(names: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the `model.` prefix older TorchTitan full checkpoints put on model keys.

    Only applied when the model keys carry it (`model.tok_embeddings.weight`),
    so flat 0.3.0 checkpoints pass through unchanged; non-model keys
    (`optimizer.*`, `train_state.*`) are dropped when stripping.
    """
    if f"{MODEL_PREFIX}tok_embeddings.weight" not in names:
        return dict(names)
    return {k[len(MODEL_PREFIX):]: v for k, v in names.items() if k.startswith(MODEL_PREFIX)}


@dataclass(frozen=True)
class TorchTitanLayout:
    """TorchTitan Llama-family model keys, mapped to and from HF.

    keys: "2026" (`attention.qkv_linear.wq`, `lm_head`; torchtitan 0.3.0) or
        "classic" (`attention.wq`, `output`); only used when writing, reading
        detects the generation (and a `model.` prefix) from the names.
    rotary: "interleaved" or "half"; None picks TorchTitan's choice for the
        family (half for qwen3, interleaved for the Llama family).
    """

    keys: KeyGeneration = "2026"
    rotary: Literal["interleaved", "half"] | None = None

    name: ClassVar[str] = "torchtitan"

    def __post_init__(self) -> None:
        if self.keys not in _QKV_NAMES:
            raise UnsupportedModelError(f"TorchTitan keys must be '2026' or 'classic', got {self.keys!r}")
        if self.rotary not in (None, "interleaved", "half"):
            raise UnsupportedModelError(f"TorchTitan rotary must be 'interleaved' or 'half', got {self.rotary!r}")

    def detect(self, infos: Mapping[str, TensorInfo]) -> bool:
        """True for TorchTitan model key names (either generation, with or without `model.`)."""
        names = strip_model_prefix(infos)
        return "tok_embeddings.weight" in names and any(k.startswith("layers.") for k in names)

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """What the shapes tell: layers, widths, vocab, q/k norms, and H*D / G*D of wq / wk.

        Tying is not visible (TorchTitan stores the output weight either way) and,
        without q/k norms, neither is head_dim: both come from `maxckpt_model.json`
        next to the tensors, a config or flags.
        """
        names = strip_model_prefix(infos)
        moe = next((n for n in names if re.match(r"layers\.\d+\.moe\.", n)), None)
        mla = "layers.0.attention.wkv_a.weight" in names
        if mla:
            return self._mla_dims(names)
        if "layers.0.attention.sinks" in names:
            return self._gpt_oss_dims(names)
        if moe is not None and ("layers.0." + _ROUTER not in names or "layers.0.attention.q_norm.weight" not in names):
            raise UnsupportedModelError(
                f"{moe!r}: a Mixture-of-Experts TorchTitan checkpoint other than Qwen 3 MoE (deepseek_v3, "
                "gpt_oss); maxckpt reads TorchTitan's dense llama3/qwen3 and its qwen3 MoE models only"
            )
        if "tok_embeddings.weight" not in names:
            raise CorruptCheckpointError(
                f"no 'tok_embeddings.weight' among {len(names)} items: not a TorchTitan Llama-family checkpoint"
            )
        vocab, emb = names["tok_embeddings.weight"].shape
        layers = {int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n))}
        if not layers:
            raise CorruptCheckpointError("no layers.{i}.* tensors: not a TorchTitan decoder checkpoint")
        wq, wk, _ = _QKV_NAMES[self.detect_keys(names)]
        dims: dict[str, Any] = {
            "num_layers": max(layers) + 1,
            "emb_dim": emb,
            "vocab_size": vocab,
            "qk_norm": "layers.0.attention.q_norm.weight" in names,
        }
        w1 = names.get("layers.0.feed_forward.w1.weight")
        if w1 is not None:
            dims["mlp_dim"] = w1.shape[0]
        if moe is not None:
            experts = names["layers.0.moe.routed_experts.inner_experts.w1_EFD"].shape  # [X, M, E]
            dims.update(num_experts=experts[0], moe_mlp_dim=experts[1], mlp_dim=experts[1], _family="qwen3-moe")
        q, k = names.get("layers.0." + wq), names.get("layers.0." + wk)
        if q is not None and k is not None:
            dims["_q_features"], dims["_kv_features"] = q.shape[0], k.shape[0]
        if dims["qk_norm"]:
            dims["head_dim"] = names["layers.0.attention.q_norm.weight"].shape[0]
        return dims

    def _gpt_oss_dims(self, names: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """gpt-oss dims from TorchTitan shapes, by way of the HF names they map to (its record's keys)."""
        family = next(f for f in FAMILIES.values() if "attention.sinks" in f.torchtitan_layer_keys)
        gen = self.detect_keys(names)
        hf_infos: dict[str, TensorInfo] = {"model.embed_tokens.weight": names["tok_embeddings.weight"]}
        layers = sorted({int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n))})
        for i in layers:
            for suffix, hf_suffix in {**_layer_keys(gen, False, True), **family.torchtitan_layer_keys}.items():
                if f"layers.{i}.{suffix}" in names:
                    hf_infos[hfl.layer_name(i, hf_suffix)] = names[f"layers.{i}.{suffix}"]
            for key, hf_suffix in family.torchtitan_transposed_experts.items():
                t = names.get(f"layers.{i}.{key}")
                if t is not None:
                    hf_shape = (t.shape[0], t.shape[2], t.shape[1])
                    hf_infos[hfl.layer_name(i, hf_suffix)] = TensorInfo("", hf_shape, t.dtype)
        if "lm_head.weight" in names:
            hf_infos["lm_head.weight"] = names["lm_head.weight"]
        dims = hfl.HFLayout().infer_dims(hf_infos)
        dims["tie_word_embeddings"] = False
        return dims

    @staticmethod
    def _mla_dims(names: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """DeepSeek V3 dims from TorchTitan shapes, by way of the HF names they map to."""
        hf_infos: dict[str, TensorInfo] = {"model.embed_tokens.weight": names["tok_embeddings.weight"]}
        layers = sorted({int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n))})
        for i in layers:
            keys = {**_MLA_KEYS, **_MLA_NO_Q_LORA, **_SHARED_LAYER_KEYS, **_SHARED_EXPERT_KEYS,
                    _ROUTER: "mlp.gate.weight"}
            for suffix, hf_suffix in keys.items():
                if f"layers.{i}.{suffix}" in names:
                    hf_infos[hfl.layer_name(i, hf_suffix)] = names[f"layers.{i}.{suffix}"]
            w1 = names.get(f"layers.{i}.moe.routed_experts.inner_experts.w1_EFD")
            if w1 is not None:  # [X, M, E]: stand in one HF tensor per expert
                for e in range(w1.shape[0]):
                    gate = TensorInfo("", tuple(w1.shape[1:]), w1.dtype)
                    hf_infos[hfl.layer_name(i, f"mlp.experts.{e}.gate_proj.weight")] = gate
        if "lm_head.weight" in names:
            hf_infos["lm_head.weight"] = names["lm_head.weight"]
        dims = hfl.HFLayout().infer_dims(hf_infos)
        dims["tie_word_embeddings"] = False  # TorchTitan stores the output weight either way
        return dims

    @staticmethod
    def detect_keys(names: Mapping[str, Any]) -> KeyGeneration:
        """Which key generation a (prefix-stripped) TorchTitan checkpoint uses."""
        if any(".attention.qkv_linear." in k for k in names) or "lm_head.weight" in names:
            return "2026"
        return "classic"

    def rotary_for(self, spec: ModelSpec) -> str:
        if self.rotary is not None:
            return self.rotary
        # Family.torchtitan_rotary: qwen3 uses HF's rotate-half; DeepSeek V3's MLA rope pairs are interleaved in
        # TorchTitan and in HF's rope_interleave alike, so nothing is permuted there either.
        return FAMILIES[spec.family].torchtitan_rotary

    # ------------------------------------------------------------- from HF

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express HF tensors under TorchTitan's flat model keys.

        Globals first, then kind by kind (every layer's wq, every layer's wk, ...):
        a scanned MaxText source stores each kind as one [.., L, ..] array, and
        reading it kind by kind decodes its chunks once (see transforms.LayerGroups).
        """
        permute = self.rotary_for(spec) == "interleaved"
        if spec.qk_norm and permute:
            raise UnsupportedModelError(
                "q/k norms with interleaved rotary: TorchTitan has no such model; use rotary='half' (Qwen 3)"
            )
        shapes = hfl.expected_tensors(spec)

        def get(name: str) -> LazyTensor:
            return _get(hf, name, shapes[name], "HF -> TorchTitan")

        output = _OUTPUT_NAMES[self.keys]
        embed = get(hfl.EMBED)
        out = {
            "tok_embeddings.weight": lazy_rename(embed, "tok_embeddings.weight"),
            # The model state dict holds the output weight even when tied (then the embedding's values).
            output: lazy_rename(embed if spec.tie_word_embeddings else get(hfl.LM_HEAD), output),
            "norm.weight": lazy_rename(get(hfl.FINAL_NORM), "norm.weight"),
        }
        moe = self._check_moe(spec)
        per_layer = [layer_keys_for(spec, self.keys, i) for i in range(spec.num_layers)]
        for suffix in dict.fromkeys(k for keys in per_layer for k in keys):
            for i, keys in enumerate(per_layer):
                if suffix in keys:
                    key, hf_suffix = f"layers.{i}.{suffix}", keys[suffix]
                    src = get(hfl.layer_name(i, hf_suffix))
                    out[key] = self._rows(src, hf_suffix, spec, permute, "interleaved", key)
        if moe:
            for i in range(spec.num_layers):
                if hfl.is_moe_layer(spec, i):
                    out.update(self._moe_from_hf(i, spec, get))
        return out

    @staticmethod
    def _check_moe(spec: ModelSpec) -> bool:
        """True for a model TorchTitan holds as Qwen 3 MoE; other MoE families are refused."""
        if not spec.num_experts:
            return False
        if FAMILIES[spec.family].torchtitan_model is None:
            raise UnsupportedModelError(
                f"{spec.family}: maxckpt's TorchTitan mapping covers Qwen 3 MoE, DeepSeek V3 and gpt-oss "
                "among MoE models"
            )
        return True

    @staticmethod
    def _moe_from_hf(i: int, spec: ModelSpec, get) -> dict[str, LazyTensor]:
        """Layer i's router, experts stacked [X, ...] (one piece per expert) and a zero load-balancing bias."""
        transposed = FAMILIES[spec.family].torchtitan_transposed_experts
        if transposed:  # gpt-oss: router and biases are plain renames; the weights transpose per expert
            out = {}
            for key, hf_suffix in transposed.items():
                name, src = f"layers.{i}.{key}", get(hfl.layer_name(i, hf_suffix))
                out[name] = _per_expert_transposed(src, name)
            name = f"layers.{i}.{_EXPERT_BIAS}"  # present when the run balances load (the stock flavors do)
            out[name] = LazyTensor.from_array(name, np.zeros(spec.num_experts, np.float32))
            return out
        out = {f"layers.{i}.{_ROUTER}": lazy_rename(get(hfl.layer_name(i, "mlp.gate.weight")), f"layers.{i}.{_ROUTER}")}
        for key, hf_suffix in _EXPERTS.items():
            name = f"layers.{i}.{key}"
            experts = [get(hfl.layer_name(i, hf_suffix.format(e=e))) for e in range(spec.num_experts)]
            out[name] = LazyTensor.stacked(name, experts)
        name = f"layers.{i}.{_EXPERT_BIAS}"
        # TorchTitan's aux-loss-free balancing bias, added to the scores when choosing experts: DeepSeek's
        # e_score_correction_bias; HF Qwen 3 has none (zeros).
        if spec.routing == "sigmoid_bias":
            out[name] = lazy_rename(get(hfl.layer_name(i, "mlp.gate.e_score_correction_bias")), name)
        else:
            out[name] = LazyTensor.from_array(name, np.zeros(spec.num_experts, np.float32))
        return out

    # ------------------------------------------------------------- to HF

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express TorchTitan tensors (either key generation, `model.` prefix or not) as HF."""
        tensors = strip_model_prefix(tensors)
        gen = self.detect_keys(tensors)
        permute = self.rotary_for(spec) == "interleaved"
        shapes = hfl.expected_tensors(spec)

        def get(key: str, hf_name: str, transposed: bool = False) -> LazyTensor:
            shape = shapes[hf_name]
            if transposed:  # [X, a, b] stored as [X, b, a]
                shape = (shape[0], shape[2], shape[1])
            return _get(tensors, key, shape, "TorchTitan -> HF", f" ({gen} key names)")

        globals_ = {hfl.EMBED: "tok_embeddings.weight", hfl.FINAL_NORM: "norm.weight"}
        if not spec.tie_word_embeddings:  # tied: the stored output copy is left alone
            globals_[hfl.LM_HEAD] = _OUTPUT_NAMES[gen]
        out = {hf_name: lazy_rename(get(key, hf_name), hf_name) for hf_name, key in globals_.items()}
        moe = self._check_moe(spec)
        for i in range(spec.num_layers):
            for suffix, hf_suffix in layer_keys_for(spec, gen, i).items():
                hf_name = hfl.layer_name(i, hf_suffix)
                src = get(f"layers.{i}.{suffix}", hf_name)
                out[hf_name] = self._rows(src, hf_suffix, spec, permute, "half", hf_name)
            if moe and hfl.is_moe_layer(spec, i):
                out.update(self._moe_to_hf(i, tensors, spec, get))
        return out

    @staticmethod
    def _moe_to_hf(i: int, tensors: Mapping[str, LazyTensor], spec: ModelSpec, get) -> dict[str, LazyTensor]:
        transposed = FAMILIES[spec.family].torchtitan_transposed_experts
        if transposed:
            out = {}
            bias = tensors.get(f"layers.{i}.{_EXPERT_BIAS}")
            for key, hf_suffix in transposed.items():
                name = hfl.layer_name(i, hf_suffix)
                out[name] = _per_expert_transposed(get(f"layers.{i}.{key}", name, transposed=True), name, bias)
            return out
        return TorchTitanLayout._routed_moe_to_hf(i, tensors, spec, get)

    @staticmethod
    def _routed_moe_to_hf(i: int, tensors: Mapping[str, LazyTensor], spec: ModelSpec, get) -> dict[str, LazyTensor]:
        """Layer i's router and per-expert HF tensors; each expert reads its own slice of the [X, ...] stack.

        A non-zero load-balancing bias changes which experts TorchTitan picks and HF has no
        place for it: refused rather than dropped.
        """
        router = hfl.layer_name(i, "mlp.gate.weight")
        gate = get(f"layers.{i}.{_ROUTER}", router)
        bias = tensors.get(f"layers.{i}.{_EXPERT_BIAS}")

        if spec.routing == "sigmoid_bias":  # DeepSeek: the bias is HF's e_score_correction_bias
            name = hfl.layer_name(i, "mlp.gate.e_score_correction_bias")
            out = {router: lazy_rename(gate, router), name: lazy_rename(get(f"layers.{i}.{_EXPERT_BIAS}", name), name)}
            return {**out, **TorchTitanLayout._experts_to_hf(i, tensors, spec)}

        def router_weight() -> np.ndarray:
            if bias is not None and np.any(bias.read() != 0):
                raise UnsupportedModelError(
                    f"layers.{i}.{_EXPERT_BIAS} is non-zero: TorchTitan's load-balancing bias steers routing and "
                    "HF Qwen 3 MoE has no such tensor; converting would change which experts are chosen"
                )
            return gate.read()

        out = {router: LazyTensor.computed(router, gate.shape, gate.dtype, router_weight)}
        return {**out, **TorchTitanLayout._experts_to_hf(i, tensors, spec)}

    @staticmethod
    def _experts_to_hf(i: int, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Per-expert HF tensors of layer i, each reading its own slice of TorchTitan's [X, ...] stacks."""
        X, M, E = spec.num_experts, spec.moe_mlp_dim, spec.emb_dim
        out: dict[str, LazyTensor] = {}
        shapes = {"w1_EFD": (X, M, E), "w3_EFD": (X, M, E), "w2_EDF": (X, E, M)}
        for key, hf_suffix in _EXPERTS.items():
            src = tensors.get(f"layers.{i}.{key}")
            if src is None:
                raise ShapeMismatchError(f"TorchTitan -> HF: tensor 'layers.{i}.{key}' is missing")
            want = shapes[key.rsplit(".", 1)[1]]
            if tuple(src.shape) != want:
                raise ShapeMismatchError(f"layers.{i}.{key}: shape {tuple(src.shape)}, the model spec implies {want}")
            for e in range(X):
                name = hfl.layer_name(i, hf_suffix.format(e=e))
                out[name] = LazyTensor(
                    name, tuple(src.shape[1:]), src.dtype,
                    lambda index, src=src, e=e: src.read((e,) + tuple(index or ())),
                )
        return out

    @staticmethod
    def _rows(t: LazyTensor, hf_suffix: str, spec: ModelSpec, permute: bool, to: str, name: str) -> LazyTensor:
        """`t` renamed; q/k weights with their rows in `to` rotary order when the layouts differ."""
        heads = {"self_attn.q_proj.weight": spec.num_heads, "self_attn.k_proj.weight": spec.num_kv_heads}.get(hf_suffix)
        if not permute or heads is None:
            return lazy_rename(t, name)
        return LazyTensor.computed(name, t.shape, t.dtype, lambda: rotary_rows(t.read(), heads, spec.head_dim, to))
