"""Adding a family is adding one file under maxckpt/families/: a llama variant converts in every direction.

The test writes one module (its own family name, MaxText model name, dims and rope) into a folder appended to
``maxckpt.families.__path__``, re-discovers the registry, and converts a random transformers model of that
variant HF -> MaxText -> HF bit-exact, MaxText -> Megatron / TorchTitan / torch -> MaxText exact, and the
reference forward on the MaxText copy matches transformers. Nothing but that one file is added, and the
registry is as before afterwards.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import maxckpt
import maxckpt.families as families

import torch
import transformers

FAMILY_NAME = "llamalike"
MODEL_NAME = "llamalike-1b"
MODULE = "llamalike"
ROPE_THETA = 250_000.0
ROPE_SCALING = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256}
# The one file a new family is: a dense llama variant with interleaved MaxText rotary (as llama3.1's).
FAMILY_FILE = textwrap.dedent(f'''
    """A llama variant: its own name, MaxText model name, dims and rope (the test's new family)."""

    from maxckpt.families.base import Family

    FAMILY = Family(
        name={FAMILY_NAME!r},
        hf_model_type="llama",
        hf_architecture="LlamaForCausalLM",
        maxtext_rotary="interleaved",
        maxtext_query_scale=True,
        qk_norm=False,
        rope_theta={ROPE_THETA!r},
        rope_scaling={ROPE_SCALING!r},
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,
        bos_token_id=3,
        eos_token_id=4,
        maxtext_models=({MODEL_NAME!r},),
        hf_config_extra={{"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}},
    )
''')
TOKENS = [[1, 5, 9, 13, 17, 21, 25, 29, 33, 37]]


def _tree(root: Path) -> dict[str, int]:
    """Every file below `root` (bytecode caches aside) and its size: what a test may have added."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture
def new_family(tmp_path):
    """The registry with the one-file family added; restored (path, modules, registry) afterwards."""
    shipped = _tree(Path(maxckpt.__file__).parent)
    folder = tmp_path / "more_families"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(FAMILY_FILE)
    before = (dict(families.FAMILIES), dict(families.MAXTEXT_MODELS), list(families.__path__))
    families.__path__.append(str(folder))
    try:
        families.discover()
        yield folder, shipped
    finally:
        families.__path__[:] = before[2]
        sys.modules.pop(f"maxckpt.families.{MODULE}", None)
        families.discover()
        assert families.FAMILIES == before[0] and list(families.FAMILIES) == list(before[0])
        assert families.MAXTEXT_MODELS == before[1]


def _same_tensors(a, b, names=None) -> None:
    names = sorted(a.tensors()) if names is None else names
    assert sorted(b.tensors()) == sorted(a.tensors())
    for name in names:
        x, y = a.read(name), b.read(name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name


def test_a_new_dense_family_is_one_file_and_converts_in_every_direction(new_family, tmp_path):
    folder, shipped = new_family
    from maxckpt.containers.orbax import OrbaxReader
    from maxckpt.containers.safetensors import SafetensorsReader
    from maxckpt.conversion import convert
    from maxckpt.conversion.verify import verify, verify_logits

    package = Path(maxckpt.__file__).parent
    record = families.resolve_model(MODEL_NAME)
    from maxckpt.families.registry import _FIRST

    later = [n for n in families.FAMILIES if n not in _FIRST]  # after the first families, in name order
    assert record.name == FAMILY_NAME and FAMILY_NAME in later and later == sorted(later)
    assert families.MAXTEXT_MODELS[MODEL_NAME] == FAMILY_NAME
    assert MODEL_NAME in families.model_help()

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
        num_hidden_layers=2, vocab_size=300, tie_word_embeddings=False, max_position_embeddings=2048,
        rope_theta=ROPE_THETA, rope_scaling=dict(ROPE_SCALING), rms_norm_eps=1e-6, bos_token_id=3, eos_token_id=4,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = model(torch.tensor(TOKENS)).logits.numpy()

    # HF -> MaxText -> HF: bit-exact; the config.json it writes says what the source's did.
    report = convert(tmp_path / "hf", tmp_path / "mt", to="maxtext", model=MODEL_NAME)
    spec = report.spec
    assert spec.family == FAMILY_NAME and spec.maxtext_rotary == "interleaved" and spec.head_dim == 64
    assert spec.rope_theta == ROPE_THETA and spec.rope_scaling["factor"] == 4.0
    convert(tmp_path / "mt", tmp_path / "hf2", to="hf", model=MODEL_NAME)
    _same_tensors(SafetensorsReader(tmp_path / "hf"), SafetensorsReader(tmp_path / "hf2"))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf2").eval()
    with torch.no_grad():
        np.testing.assert_array_equal(reloaded(torch.tensor(TOKENS)).logits.numpy(), expected)

    # The reference forward (MaxText's) on the MaxText copy gives transformers' logits.
    logits = verify_logits(tmp_path / "mt", tmp_path / "hf", tokens=TOKENS, model=MODEL_NAME, atol=1e-4)
    assert logits.ok and logits.max_abs_diff <= 1e-4, logits.max_abs_diff
    np.testing.assert_allclose(logits.logits_b, expected, atol=1e-5, rtol=0)

    # MaxText -> X -> MaxText, exact, for every other format (each records the model: no --model on the way back;
    # a torch directory carries config.json, a lone model.pt file could not).
    mt = OrbaxReader(tmp_path / "mt")
    for fmt, dst in (("megatron", "mega"), ("torchtitan", "titan"), ("torch", "torch-dir")):
        assert families.bridge_gap(fmt, FAMILY_NAME) is None
        convert(tmp_path / "mt", tmp_path / dst, to=fmt, model=MODEL_NAME)
        back = convert(tmp_path / dst, tmp_path / f"mt_{fmt}", to="maxtext")
        assert back.spec == spec, fmt
        _same_tensors(mt, OrbaxReader(tmp_path / f"mt_{fmt}"),
                      [n for n in mt.tensors() if n.startswith("params/")])
        assert verify(tmp_path / "mt", tmp_path / f"mt_{fmt}", model=MODEL_NAME).ok, fmt

    # The one file was all it took: the package is as shipped, the extra folder holds only that file.
    assert _tree(package) == shipped
    assert list(_tree(folder)) == [f"{MODULE}.py"]
