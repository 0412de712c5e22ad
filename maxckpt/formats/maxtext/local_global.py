"""MaxText's Gemma 4 layer layout: blocks of sliding + full-attention layers, each kind with its own geometry.

MaxText 0.2.5's `gemma4` decoder block (models/gemma4.py, `Gemma4ScannableBlock`) scans whole blocks of
`sliding_window_pattern` (6) layers: `decoder/scanned_blocks/local_layers/...` holds the 5 sliding layers of every
block, stacked on the scan axis (the block) and the next (the position in it), `decoder/scanned_blocks/global_layer`
the full-attention one; the leftover layers (sliding, as the pattern's first positions are) are one more stack,
`decoder/layers_remainder/local_layers`. Unscanned, layer i is `decoder/layers_{i}`.

The two kinds differ in shape (geometry.layer_spec: the full-attention layers' `global_head_dim` and
`global_num_kv_heads`) and in tensors (no value kernel where the key is the value), so each Stack carries
the spec that sizes it (layout.py: local_global_stacks). Every layer has a `layer_scalar` [1]. This module
reads what the tree's shapes say.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from maxckpt.errors import UnsupportedModelError
from maxckpt.families import FAMILIES, Family
from maxckpt.layouts import transforms as tf
from maxckpt.tensors import TensorInfo

LOCAL = "decoder/scanned_blocks/local_layers"
GLOBAL = "decoder/scanned_blocks/global_layer"
REMAINDER = "decoder/layers_remainder/local_layers"
SCANNED_ROOTS = ("decoder/scanned_blocks/",)
_LAYER_RE = re.compile(r"^decoder/layers_(\d+)/")


def is_scanned(names: Mapping[str, str]) -> bool:
    return any(n.startswith(SCANNED_ROOTS) for n in names)


def infer_dims(names: Mapping[str, str], infos: Mapping[str, TensorInfo], axis: int, family: Family) -> dict[str, Any]:
    """The ModelSpec fields a local/global tree's shapes show (see :func:`stacks`)."""
    scanned = any(n.startswith(SCANNED_ROOTS + ("decoder/layers_remainder/",)) for n in names)
    attn = family.maxtext_attention

    def shape_at(path: str, stacked_axes: int) -> tuple[int, ...] | None:
        if path not in names:
            return None
        shape = tuple(infos[names[path]].shape)
        for _ in range(stacked_axes):
            shape = tf.remove_axis(shape, axis)
        return shape

    if scanned:
        pattern_local = infos[names[f"{LOCAL}/layer_scalar"]].shape[axis + 1] if f"{LOCAL}/layer_scalar" in names else 0
        blocks = infos[names[f"{GLOBAL}/layer_scalar"]].shape[axis] if f"{GLOBAL}/layer_scalar" in names else 0
        rest = infos[names[f"{REMAINDER}/layer_scalar"]].shape[axis] if f"{REMAINDER}/layer_scalar" in names else 0
        if not blocks:
            raise UnsupportedModelError(f"{family.name} checkpoint has no {GLOBAL}: no whole block of layers to read")
        pattern = pattern_local + 1
        num_layers = blocks * pattern + rest
        one_local = (lambda p: shape_at(f"{LOCAL}/{p}", 2)) if pattern_local else (  # noqa: E731
            lambda p: shape_at(f"{REMAINDER}/{p}", 1))
        one_global = lambda p: shape_at(f"{GLOBAL}/{p}", 1)  # noqa: E731
    else:
        layers = sorted({int(m.group(1)) for n in names if (m := _LAYER_RE.match(n))})
        num_layers = len(layers)
        widths = [shape_at(f"decoder/layers_{i}/{attn}/query/kernel", 0)[-1] for i in layers]
        wide = [i for i, w in zip(layers, widths) if w != widths[0]]
        pattern = wide[0] + 1 if wide else int(family.settings.get("sliding_window_pattern", 0))
        one_local = lambda p: shape_at(f"decoder/layers_0/{p}", 0)  # noqa: E731
        g = pattern - 1 if 0 < pattern <= num_layers else None
        one_global = (lambda p: shape_at(f"decoder/layers_{g}/{p}", 0)) if g is not None else (  # noqa: E731
            lambda p: None)
    vocab, emb = infos[names["token_embedder/embedding"]].shape
    _, heads, head_dim = one_local(f"{attn}/query/kernel")
    dims: dict[str, Any] = {
        "_family": family.name, "num_layers": num_layers, "emb_dim": emb, "vocab_size": vocab,
        "tie_word_embeddings": "decoder/logits_dense/kernel" not in names, "sliding_window_pattern": pattern,
        "num_heads": heads, "head_dim": head_dim, "num_kv_heads": one_local(f"{attn}/key/kernel")[1],
        "qk_norm": one_local(f"{attn}/query_norm/scale") is not None,
        "layer_scalar": one_local("layer_scalar") is not None,
    }
    moe = family.maxtext_moe
    if moe and one_local(f"{moe}/wi_0") is not None:  # gemma4's MoE: the dense MLP beside the experts
        experts, _, width = one_local(f"{moe}/wi_0")
        dense = moe.rsplit("/", 1)[0] + "/shared_experts/wi_0/kernel"
        dims.update(num_experts=experts, moe_mlp_dim=width, mlp_dim=one_local(dense)[-1], num_shared_experts=0,
                    first_dense_layers=0, router_bias=False, expert_bias=False)
    else:
        dims["mlp_dim"] = one_local("mlp/wi_0/kernel")[-1]
    table = names.get("decoder/per_layer_embedder/embed_tokens_per_layer")
    if table is not None:  # e2b/e4b: per-layer inputs; KV-shared layers have no key kernel
        shared = [i for i in range(num_layers) if f"decoder/layers_{i}/{attn}/key/kernel" not in names]
        dims.update(per_layer_input_dim=one_local("per_layer_input_gate/kernel")[-1],
                    per_layer_vocab_size=infos[table].shape[0], num_kv_shared_layers=len(shared),
                    double_wide_mlp=bool(shared) and shape_at(f"decoder/layers_{shared[0]}/mlp/wi_0/kernel", 0)[-1]
                    == 2 * dims["mlp_dim"])
    g_key = one_global(f"{attn}/key/kernel")
    if g_key is not None:
        dims.update(global_num_kv_heads=g_key[1], global_head_dim=g_key[2],
                    global_k_eq_v=one_global(f"{attn}/value/kernel") is None)
    return dims


def family_of(text: str) -> str | None:
    """The local/global family a MaxText tree's names say (its layer scalars), else None."""
    if "/layer_scalar" not in text:
        return None
    moe, small = "/moe_block/" in text, "/per_layer_embedder/" in text
    return next((f.name for f in FAMILIES.values() if f.maxtext_scan == "local_global"
                 and (f.maxtext_moe is not None) == moe and f.per_layer_inputs == small), None)
