"""Pure, exactly invertible transforms the PyTorch framework layouts share.

Megatron fuses q/k/v into one matrix grouped per query group and gate/up into
`linear_fc1`; TorchTitan's Llama stores q/k rows in interleaved-pair rotary
order; Megatron pads the vocabulary. Each function here is a permutation,
concatenation or slice of 2-D `[out, in]` weights (numpy, bfloat16 through
ml_dtypes), so every round trip is bit-exact.

>>> import numpy as np
>>> q, k, v = np.ones((8, 4)), np.full((4, 4), 2.0), np.full((4, 4), 3.0)
>>> qkv = fuse_qkv(q, k, v, num_heads=4, num_kv_heads=2, head_dim=2)
>>> [a.shape for a in split_qkv(qkv, num_heads=4, num_kv_heads=2, head_dim=2)]
[(8, 4), (4, 4), (4, 4)]
"""

from __future__ import annotations

import numpy as np

from maxckpt.layouts.transforms import half_from_interleaved, interleaved_from_half


def _check_heads(num_heads: int, num_kv_heads: int) -> int:
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    return num_heads // num_kv_heads


def fuse_qkv(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, num_heads: int, num_kv_heads: int, head_dim: int
) -> np.ndarray:
    """HF q/k/v `[H*D, E]`, `[G*D, E]`, `[G*D, E]` -> Megatron `linear_qkv` `[G*(H/G+2)*D, E]`.

    Megatron's SelfAttention views the fused output as `[G, (H/G + 2) * D]`:
    per query group g the q heads of g, then k_g, then v_g. Query head h
    belongs to group h // (H/G), as in HF's `repeat_kv`.
    """
    per = _check_heads(num_heads, num_kv_heads)
    e = q.shape[-1]
    qg = q.reshape(num_kv_heads, per * head_dim, e)
    kg = k.reshape(num_kv_heads, head_dim, e)
    vg = v.reshape(num_kv_heads, head_dim, e)
    return np.ascontiguousarray(np.concatenate([qg, kg, vg], axis=1).reshape(-1, e))


def split_qkv(
    qkv: np.ndarray, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Megatron `linear_qkv` -> HF q, k, v; the inverse of :func:`fuse_qkv`."""
    per = _check_heads(num_heads, num_kv_heads)
    rows = (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.shape[0] != rows:
        raise ValueError(
            f"linear_qkv has {qkv.shape[0]} rows, expected (heads {num_heads} + 2 * groups {num_kv_heads}) "
            f"* head_dim {head_dim} = {rows}"
        )
    e = qkv.shape[-1]
    g = qkv.reshape(num_kv_heads, (per + 2) * head_dim, e)
    q = g[:, : per * head_dim].reshape(num_heads * head_dim, e)
    k = g[:, per * head_dim : (per + 1) * head_dim].reshape(num_kv_heads * head_dim, e)
    v = g[:, (per + 1) * head_dim :].reshape(num_kv_heads * head_dim, e)
    return np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v)


def fuse_gate_up(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """HF gate/up `[F, E]` each -> Megatron `linear_fc1` `[2F, E]` = `[gate; up]` (SwiGLU)."""
    return np.ascontiguousarray(np.concatenate([gate, up], axis=0))


def split_gate_up(fc1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Megatron `linear_fc1` `[2F, E]` -> (gate, up); the inverse of :func:`fuse_gate_up`."""
    if fc1.shape[0] % 2:
        raise ValueError(f"linear_fc1 has an odd number of rows ({fc1.shape[0]}); expected [gate; up]")
    f = fc1.shape[0] // 2
    return np.ascontiguousarray(fc1[:f]), np.ascontiguousarray(fc1[f:])


def rotary_rows(w: np.ndarray, num_heads: int, head_dim: int, to: str) -> np.ndarray:
    """Reorder the rows of a q or k weight `[heads*D, E]` within each head.

    `to="half"`: interleaved pairs (2i, 2i+1), as Meta's and TorchTitan's Llama
    store them -> HF rotate-half (evens, then odds); `to="interleaved"`: back.
    Same as TorchTitan's adapter `w.view(h, D//2, 2, E).transpose(1, 2)`.
    """
    if to == "half":
        order = half_from_interleaved(head_dim)
    elif to == "interleaved":
        order = interleaved_from_half(head_dim)
    else:
        raise ValueError(f"to must be 'half' or 'interleaved', got {to!r}")
    if w.shape[0] != num_heads * head_dim:
        raise ValueError(f"weight has {w.shape[0]} rows, expected heads {num_heads} * head_dim {head_dim}")
    return np.ascontiguousarray(w.reshape(num_heads, head_dim, *w.shape[1:])[:, order].reshape(w.shape))


def padded_size(size: int, multiple: int) -> int:
    """`size` rounded up to a multiple (Megatron's padded vocabulary)."""
    return -(-size // multiple) * multiple


def pad_rows(w: np.ndarray, rows: int) -> np.ndarray:
    """`w` with zero rows appended up to `rows` (Megatron's vocabulary padding)."""
    if w.shape[0] > rows:
        raise ValueError(f"cannot pad {w.shape[0]} rows down to {rows}")
    if w.shape[0] == rows:
        return w
    out = np.zeros((rows, *w.shape[1:]), dtype=w.dtype)
    out[: w.shape[0]] = w
    return out
