"""Per-layer views for the notebooks: bytes per layer (metadata only) and weight norms across steps."""

from __future__ import annotations

import numpy as np
import pytest

from conversion_models import tiny_spec
from explore_builders import FAMILY, demo_model_run, shared_formats
from maxckpt.conversion.options import SourceOptions
from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.explore import layer_bytes, layer_norms
from maxckpt.explore.layers import layer_part


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    return shared_formats(tmp_path_factory)


def test_layer_part():
    assert layer_part("model.layers.12.self_attn.k_proj.weight") == (12, "attention")
    assert layer_part("model.layers.0.self_attn.q_norm.weight") == (0, "norms")
    assert layer_part("model.layers.3.mlp.gate_proj.weight") == (3, "mlp")
    assert layer_part("model.layers.3.input_layernorm.weight") == (3, "norms")
    assert layer_part("model.embed_tokens.weight") == (None, "embedding")


@pytest.mark.parametrize("fmt", ["maxtext", "megatron"])
def test_layer_bytes(formats, fmt):
    spec = tiny_spec(FAMILY)
    e, h, g, d, f, v = spec.emb_dim, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.mlp_dim, spec.vocab_size
    per_layer = 4 * (2 * e * h * d + 2 * e * g * d + 3 * e * f + 2 * e)  # float32
    rows = layer_bytes(formats[fmt], model=FAMILY)
    assert [(r.label, r.layer, r.bytes) for r in rows] == [
        ("embedding", None, 4 * v * e),
        ("final norm", None, 4 * e),
        ("lm_head", None, 4 * v * e),
        ("layer 0", 0, per_layer),
        ("layer 1", 1, per_layer),
    ]
    assert sum(r.parameters for r in rows) * 4 == sum(r.bytes for r in rows)


def test_layer_norms_across_steps(tmp_path):
    run = demo_model_run(tmp_path / "run", steps=(0, 2))
    rows = layer_norms(run, model=FAMILY)
    assert sorted({r.step for r in rows}) == [0, 2]
    assert sorted({r.layer for r in rows}) == [0, 1, 2, 3] and sorted({r.part for r in rows}) == ["attention", "mlp", "norms"]
    # Check step 2's layer 1 MLP against an HF export read with the safetensors container.
    import maxckpt

    hf = tmp_path / "hf"
    maxckpt.convert(run / "checkpoints" / "2", hf, to="hf", model=FAMILY, source=SourceOptions(overrides={"bos_token_id": 0, "eos_token_id": 1}))
    tensors = SafetensorsReader(hf)
    expected = np.sqrt(sum(
        float(np.sum(tensors.read(f"model.layers.1.mlp.{w}.weight").astype(np.float64) ** 2)) for w in ("gate_proj", "up_proj", "down_proj")
    ))
    (got,) = [r.norm for r in rows if (r.step, r.layer, r.part) == (2, 1, "mlp")]
    assert got == pytest.approx(expected, rel=1e-12)
    assert layer_norms(run, model=FAMILY, steps=[2]) == [r for r in rows if r.step == 2]
