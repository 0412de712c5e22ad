"""HF layout: expected tensors, dims from shapes, and config.json both ways (transformers 4.x and 5.x forms)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conversion_models import FAMILY_NAMES, tiny_spec
from maxckpt.conversion.spec import build_spec
from maxckpt.errors import CorruptCheckpointError
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.hf.config import config_json, hints_from_config
from maxckpt.formats.hf.files import config_hints
from maxckpt.formats.hf.layout import HFLayout
from maxckpt.tensors import TensorInfo

import transformers


def infos_for(spec):
    return {n: TensorInfo(n, s, np.dtype(np.float32)) for n, s in hfl.expected_tensors(spec).items()}


def test_expected_tensors_follow_transformers_names():
    spec = tiny_spec("qwen3")
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config_json(spec)))
    state = {n: tuple(p.shape) for n, p in model.state_dict().items() if n != "lm_head.weight"}  # tied
    assert state == hfl.expected_tensors(spec)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_config_json_loads_in_transformers_with_the_same_rope(family, tmp_path):
    spec = tiny_spec(family)
    (tmp_path / "config.json").write_text(json.dumps(config_json(spec)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path)
    assert cfg.architectures == [{"qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}.get(family, "LlamaForCausalLM")]
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 4, 2, 16)
    assert cfg.rope_parameters["rope_theta"] == spec.rope_theta
    assert cfg.rope_parameters["rope_type"] == ("llama3" if family == "llama3.1" else "default")
    assert cfg.tie_word_embeddings == spec.tie_word_embeddings
    # ...and reading it back gives the same spec
    dims = HFLayout().infer_dims(infos_for(spec))
    again, notes = build_spec(dims, hints=hints_from_config(json.loads((tmp_path / "config.json").read_text())))
    assert again == spec and not notes


def test_both_rope_config_forms_are_read():
    legacy = {"model_type": "llama", "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    current = {"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}}
    for config in (legacy, current):
        hints = hints_from_config(config)
        assert hints["family"] == "llama3.1" and hints["rope_theta"] == 500000.0
        assert hints["rope_scaling"]["rope_type"] == "llama3" and hints["rope_scaling"]["factor"] == 8.0
    assert hints_from_config({"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})["family"] == "llama2"
    assert hints_from_config({"model_type": "llama", "rope_theta": 500000.0})["family"] == "llama3"


@pytest.mark.parametrize(
    "config, message",
    [
        ([1, 2], "holds a JSON list, not an object"),
        ({"model_type": "llama", "rope_theta": "fast"}, "not a usable HF config \\(ValueError"),
        ({"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": None}}, "not a usable HF config \\(TypeError"),
    ],
)
def test_a_config_json_that_is_not_an_hf_config_is_a_clear_error(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CorruptCheckpointError, match=message):
        config_hints(tmp_path / "config.json")


def test_infer_dims_without_qk_norm_leaves_heads_to_the_config():
    spec = tiny_spec("llama2")
    dims = HFLayout().infer_dims(infos_for(spec))
    assert "num_heads" not in dims and dims["emb_dim"] == 32 and dims["num_layers"] == 2 and dims["mlp_dim"] == 64
    qdims = HFLayout().infer_dims(infos_for(tiny_spec("qwen3")))
    assert (qdims["head_dim"], qdims["num_heads"], qdims["num_kv_heads"]) == (16, 4, 2)


def test_every_layer_structure_maxtext_stacks_has_an_hf_layer_pattern():
    """A family with a new scan style fails here, not with a KeyError in the middle of a conversion."""
    from maxckpt.families import FAMILIES
    from maxckpt.formats.hf.layer_patterns import LAYER_PATTERNS, layer_pattern
    from maxckpt.formats.maxtext.scans import SCANS

    assert set(LAYER_PATTERNS) == set(SCANS)
    for family in FAMILIES.values():
        assert layer_pattern(family) is LAYER_PATTERNS[family.maxtext_scan]
    # the patterns that read layer_types themselves are the ones whose types are not sliding/full alone
    assert {n for n, p in LAYER_PATTERNS.items() if p.reads_layer_types} == {"hybrid", "cycle"}
