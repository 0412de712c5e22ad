"""Rotary position embeddings as MaxText computes them for the MoE, MLA and Gemma families.

Two kinds:

- `RotaryEmbedding` (mixtral, qwen3-moe, gemma2, gemma3): timescales
  theta**(2i/d), the rotate-half layout HF uses too; a linear scaling factor
  multiplies the timescales (gemma3's global layers: positions / 8).
- `YarnRotaryEmbedding` (deepseek3, gpt-oss): base frequencies blended
  between f and f/factor over the "correction range" of dimensions, the
  rotation done as a complex product. MaxText reads interleaved pairs
  (deepseek3) or halves (gpt-oss) as (real, imag) but always *writes* halves
  [real..., imag...]; q and k get the same treatment, so dot products are
  those of HF's layout. gpt-oss multiplies the output by
  0.1*ln(factor) + 1 (`rope_attention_scaling`), deepseek3 does not (its
  mscale goes into the softmax scale instead).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax.numpy as jnp


def default_timescale(dim: int, theta: float, linear_factor: float = 1.0) -> jnp.ndarray:
    """MaxText `RotaryEmbedding.timescale`: theta**(2i/dim) for i < dim/2, times the linear factor."""
    fraction = 2 * jnp.arange(0, dim // 2) / dim
    timescale = 1.0 * (theta / 1.0) ** fraction
    if linear_factor != 1.0:
        timescale = timescale * linear_factor
    return timescale


def rotate_half(x: jnp.ndarray, positions: jnp.ndarray, timescale: jnp.ndarray) -> jnp.ndarray:
    """x [B, S, H, D] rotated like MaxText's `RotaryEmbedding` (first half real, second half imaginary)."""
    sinusoid = positions[:, :, None, None].astype(jnp.float32) / timescale
    sin, cos = jnp.sin(sinusoid).astype(x.dtype), jnp.cos(sinusoid).astype(x.dtype)
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def _correction_dim(rotations: float, dim: int, base: float, original: int) -> float:
    return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_frequencies(dim: int, theta: float, scaling: Mapping[str, Any]) -> jnp.ndarray:
    """MaxText `YarnRotaryEmbedding` frequencies [dim/2] (before multiplying by positions).

    Dimensions rotating fast enough (more than beta_fast turns over the
    original context) keep their frequency, slow ones (under beta_slow turns)
    are divided by the factor, a linear ramp in between; `truncate` rounds the
    ramp's ends to whole dimensions (deepseek3) or not (gpt-oss).
    """
    half = dim // 2
    factor = float(scaling["factor"])
    freqs = 1.0 / (theta ** (2.0 * jnp.arange(0, half, dtype=jnp.float32) / dim))
    original = int(scaling.get("original_max_position_embeddings", 4096))
    low = _correction_dim(float(scaling.get("beta_fast", 32.0)), dim, theta, original)
    high = _correction_dim(float(scaling.get("beta_slow", 1.0)), dim, theta, original)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = jnp.clip((jnp.arange(half, dtype=jnp.float32) - low) / (high - low), 0, 1)
    smooth = 1 - ramp
    return freqs / factor * (1 - smooth) + freqs * smooth


def yarn_attention_factor(scaling: Mapping[str, Any]) -> float:
    """The factor YaRN multiplies cos/sin by, with HF's defaults.

    MaxText's `rope_attention_scaling=True` (gpt-oss) is HF's default
    0.1*ln(factor) + 1; deepseek3 (`rope_attention_scaling=False`) has 1.0,
    which HF derives from mscale == mscale_all_dim.
    """
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(float(scaling["mscale"])) / mscale(float(scaling["mscale_all_dim"]))
    return mscale(1.0)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn(x: jnp.ndarray, positions: jnp.ndarray, freqs: jnp.ndarray, *, interleave: bool,
         attention_factor: float = 1.0) -> jnp.ndarray:
    """x [B, S, H, D] rotated like MaxText's `YarnRotaryEmbedding`; output in halves layout."""
    angle = positions.astype(jnp.float32)[:, :, None, None] * freqs  # jnp.outer(t, freqs), then indexed
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    if interleave:
        b, s, h, d = x.shape
        pairs = x.reshape(b, s, h, d // 2, 2)
        real, imag = pairs[..., 0], pairs[..., 1]
    else:
        real, imag = jnp.split(x, 2, axis=-1)
    out = jnp.concatenate([real * cos - imag * sin, real * sin + imag * cos], axis=-1)
    if attention_factor != 1.0:
        out = out * attention_factor
    return out


__all__ = ["default_timescale", "rotate_half", "yarn", "yarn_attention_factor", "yarn_frequencies", "yarn_mscale"]
