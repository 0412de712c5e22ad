"""The JAX reference of MaxText's forward: rotary variants, layer layouts, and MaxText's own quirks."""

from __future__ import annotations

import dataclasses

import numpy as np

from conversion_models import TOKENS, random_maxtext_params, tiny_spec
from maxckpt.layouts import transforms as tf
from maxckpt.reference import forward, rope_timescales


def test_llama3_rope_scaling_matches_transformers():
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    spec = dataclasses.replace(tiny_spec("llama3.1", head_dim=128), maxtext_rotary="half")
    config = transformers.LlamaConfig(
        hidden_size=512, num_attention_heads=4, head_dim=128, max_position_embeddings=131072,
        rope_parameters={"rope_theta": spec.rope_theta, **spec.rope_scaling},
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    np.testing.assert_allclose(1.0 / np.asarray(rope_timescales(spec)), inv_freq.numpy(), rtol=1e-5)


def test_interleaved_rotary_equals_rotate_half_on_permuted_q_k():
    spec = tiny_spec("llama3.1")
    params = random_maxtext_params(spec)
    half = dict(params)
    order = tf.half_from_interleaved(spec.head_dim)
    for name in ("decoder/layers/self_attention/query/kernel", "decoder/layers/self_attention/key/kernel"):
        half[name] = params[name][..., order]
    a = forward(params, spec, TOKENS)
    b = forward(half, dataclasses.replace(spec, maxtext_rotary="half"), TOKENS)
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
    c = forward(params, dataclasses.replace(spec, maxtext_rotary="half"), TOKENS)
    assert np.abs(a - c).max() > 1e-2  # the layout matters: same weights, other rotary, other logits


def test_scanned_and_unscanned_parameters_give_the_same_logits():
    spec = tiny_spec("mistral")
    scanned = random_maxtext_params(spec, scanned=True)
    unscanned = {}
    for name, array in scanned.items():
        if name.startswith("decoder/layers/"):
            for i in range(spec.num_layers):
                unscanned[name.replace("decoder/layers/", f"decoder/layers_{i}/")] = np.take(array, i, axis=1)
        else:
            unscanned[name] = array
    np.testing.assert_array_equal(forward(scanned, spec, TOKENS), forward(unscanned, spec, TOKENS))


def test_query_scaling_lives_in_the_kernel_or_at_runtime():
    spec = tiny_spec("llama2", tied=True)
    params = random_maxtext_params(spec)
    unscaled = dict(params)
    unscaled["decoder/layers/self_attention/query/kernel"] = params["decoder/layers/self_attention/query/kernel"] * 4.0
    runtime = dataclasses.replace(spec, maxtext_query_scale=False)  # qwen3's convention
    np.testing.assert_allclose(forward(params, spec, TOKENS), forward(unscaled, runtime, TOKENS), atol=1e-5, rtol=0)


def test_bf16_attend_changes_only_tied_logits_and_only_slightly():
    spec = tiny_spec("qwen3")
    params = random_maxtext_params(spec)
    exact, like_maxtext = forward(params, spec, TOKENS), forward(params, spec, TOKENS, attend_in_bf16=True)
    assert 0 < np.abs(exact - like_maxtext).max() < 1e-2 * np.abs(exact).max()
    untied = tiny_spec("llama2")
    p = random_maxtext_params(untied)
    np.testing.assert_array_equal(forward(p, untied, TOKENS), forward(p, untied, TOKENS, attend_in_bf16=True))
