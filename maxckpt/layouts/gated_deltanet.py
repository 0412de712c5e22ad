"""Gated DeltaNet's packed input projections: MaxText's (and qwen3-next's) per-key-head groups versus
qwen3.5's head-major tensors, and the dimension symbols of a Gated DeltaNet layer.

MaxText packs `in_proj_qkvz` and `in_proj_ba` per key-head group ([q, k, v, z] and [b, a] of each key
head, value heads of a group together); transformers' Qwen3.5 holds `in_proj_qkv` (all q | all k | all v),
`in_proj_z`, `in_proj_b` and `in_proj_a` apart. :func:`split_grouped` and :func:`join_split` convert
between the two, exactly (rows are only moved).
"""

from __future__ import annotations

import numpy as np

from maxckpt.layouts.base import ModelSpec

__all__ = ["gdn_sizes", "join_split", "split_grouped", "split_symbols"]


def gdn_sizes(spec: ModelSpec) -> dict[str, int]:
    """The Gated DeltaNet dimension symbols' sizes."""
    keys = spec.gdn_num_key_heads * spec.gdn_key_head_dim
    values = spec.gdn_num_value_heads * spec.gdn_value_head_dim
    return {
        "GVH": spec.gdn_num_value_heads,
        "GVD": spec.gdn_value_head_dim,
        "GCK": spec.gdn_conv_kernel_dim,
        "GV": values,
        "GC": 2 * keys + values,  # conv channels: [q | k | v]
        "GQKVZ": 2 * keys + 2 * values,
        "GBA": 2 * spec.gdn_num_value_heads,
        "2D": 2 * spec.head_dim,  # a gated query head: [query | gate]
    }


def split_symbols(kind: str) -> tuple[tuple[str, ...], ...]:
    """The HF shapes (symbols) of the tensors :func:`split_grouped` makes of a "qkvz" or "ba" projection."""
    return (("GC", "E"), ("GV", "E")) if kind == "qkvz" else (("GVH", "E"), ("GVH", "E"))


def split_grouped(kind: str, w: np.ndarray, spec: ModelSpec) -> list[np.ndarray]:
    """A grouped projection's HF-oriented rows [out, E] (MaxText's packing) -> the split tensors.

    "qkvz": per key head [q (Dk), k (Dk), v (p Dv), z (p Dv)], p = value heads per key head ->
    [in_proj_qkv = q (all heads) | k | v, in_proj_z]; "ba": per key head [b (p), a (p)] -> [in_proj_b, in_proj_a].
    """
    hk, dk, dv = spec.gdn_num_key_heads, spec.gdn_key_head_dim, spec.gdn_value_head_dim
    per = spec.gdn_num_value_heads // hk
    rows = w.reshape(hk, -1, w.shape[-1])
    if kind == "ba":
        return [np.ascontiguousarray(rows[:, :per].reshape(-1, w.shape[-1])),
                np.ascontiguousarray(rows[:, per:].reshape(-1, w.shape[-1]))]
    q, k = rows[:, :dk], rows[:, dk : 2 * dk]
    v, z = rows[:, 2 * dk : 2 * dk + per * dv], rows[:, 2 * dk + per * dv :]
    flat = lambda a: a.reshape(-1, w.shape[-1])  # noqa: E731
    return [np.ascontiguousarray(np.concatenate([flat(q), flat(k), flat(v)])), np.ascontiguousarray(flat(z))]


def join_split(kind: str, parts: list[np.ndarray], spec: ModelSpec) -> np.ndarray:
    """The inverse of :func:`split_grouped`: the split HF tensors -> the grouped rows [out, E]."""
    hk, dk, dv = spec.gdn_num_key_heads, spec.gdn_key_head_dim, spec.gdn_value_head_dim
    per = spec.gdn_num_value_heads // hk
    e = parts[0].shape[-1]
    if kind == "ba":
        b, a = (p.reshape(hk, per, e) for p in parts)
        return np.ascontiguousarray(np.concatenate([b, a], axis=1).reshape(-1, e))
    qkv, z = parts
    keys = hk * dk
    q, k = qkv[:keys].reshape(hk, dk, e), qkv[keys : 2 * keys].reshape(hk, dk, e)
    v, z = qkv[2 * keys :].reshape(hk, per * dv, e), z.reshape(hk, per * dv, e)
    return np.ascontiguousarray(np.concatenate([q, k, v, z], axis=1).reshape(-1, e))
