"""Quantized Hub checkpoints: FP8 block and MXFP4 read dequantized exactly; FP8 and MXFP4 written.

The tiny checkpoints (tests/quantized_models.py: DeepSeek-V3 FP8 with MLA and
MoE, a dense Qwen3-FP8 with partial 128-blocks, gpt-oss MXFP4) are checked
against transformers' own dequantizers, never only against maxckpt's code:
`from_pretrained(quantization_config=FineGrainedFP8Config / Mxfp4Config(dequantize=True))`
on CPU, and for partial blocks (where transformers 5.24's loader takes the
block as shape / scale grid, unlike DeepSeek) its `_dequantize_fp8_weight`,
which follows DeepSeek's definition.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from cli_runner import run_cli
from conversion_models import tiny_spec
from maxckpt.formats import HFOptions
from maxckpt.conversion.options import SourceOptions
from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.formats.hf.quantization import DequantizingReader, dequantization_plan, quantize_fp8_block
from maxckpt.tensors import TensorInfo
from quantized_models import (
    DEEPSEEK3, FP8, FP8_CONFIG, GPT_OSS, MXFP4_CONFIG, deepseek_v3_fp8, gpt_oss_mxfp4, qwen3_fp8, random_tensors,
    write_hf,
)
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.hf.config import config_json

import torch

TOKENS = [[1, 5, 9, 3, 7, 2, 11, 4, 60, 17, 99, 23, 8, 127, 42, 0]]
FAMILY = {"deepseek3": "deepseek3", "qwen3": "qwen3", "gpt-oss": "gpt-oss"}
BUILD = {"deepseek3": deepseek_v3_fp8, "qwen3": qwen3_fp8, "gpt-oss": gpt_oss_mxfp4}
METHOD = {"deepseek3": "fp8-block", "qwen3": "fp8-block", "gpt-oss": "mxfp4"}


@pytest.fixture(autouse=True)
def _fp8_loads_without_accelerate(monkeypatch):
    """transformers' FP8 quantizer asks for accelerate before it dequantizes on CPU, which it does not use then."""
    import transformers.quantizers.quantizer_finegrained_fp8 as fp8

    monkeypatch.setattr(fp8, "is_accelerate_available", lambda: True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    return {name: build(root / name) for name, build in BUILD.items()}


def stored(path: Path) -> dict[str, np.ndarray]:
    with SafetensorsReader(path) as r:
        return {n: r.read(n) for n in r.tensors()}


def transformers_model(path: Path, family: str, dtype=None):
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config, Mxfp4Config

    qc = Mxfp4Config(dequantize=True) if family == "gpt-oss" else FineGrainedFP8Config(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=qc, **({"dtype": dtype} if dtype else {}))
    return model.eval()


def logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(TOKENS)).logits.float().numpy()


def hf_view(ours: dict[str, np.ndarray], name: str, like: np.ndarray) -> np.ndarray:
    """Tensor `name` of transformers' state dict from our per-expert HF tensors (transformers packs MoE experts)."""
    if name in ours:
        return ours[name]
    prefix, _, last = name.rpartition(".")
    parts = [[f"{prefix}.{e}.gate_proj.weight", f"{prefix}.{e}.up_proj.weight"] if last == "gate_up_proj"
             else [f"{prefix}.{e}.down_proj.weight"] for e in range(like.shape[0])]
    return np.stack([np.concatenate([ours[p] for p in ps]) for ps in parts])


# ------------------------------------------------------------------- reading: exact


@pytest.mark.parametrize("family", ["deepseek3", "gpt-oss"])
def test_bf16_export_equals_transformers_dequantization_bit_for_bit(built, tmp_path, family):
    report = convert(built[family], tmp_path / "hf", to="hf")  # --dtype defaults to bfloat16 for a quantized source
    assert any("dequantized to bfloat16" in n for n in report.notes), report.notes
    ours = stored(tmp_path / "hf")
    assert not any(n.endswith(("_scale_inv", "_blocks", "_scales")) for n in ours)
    state = transformers_model(built[family], family).state_dict()
    assert len(state) > 20
    for name, value in state.items():
        want = value.detach().to(torch.float32).numpy()
        got = hf_view(ours, name, want)
        assert got.dtype in (np.float32, ml_dtypes.bfloat16), name  # transformers keeps some (the router) in float32
        assert np.array_equal(got.astype(np.float32), want), name


def test_fp8_partial_blocks_follow_deepseeks_definition_as_transformers_kernels_do(built, tmp_path):
    """Qwen3 mlp_dim 160 = 1.25 blocks: W = code * scale_inv[i // 128, j // 128], the last block cropped."""
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    convert(built["qwen3"], tmp_path / "f32", to="hf", dtype="float32")
    convert(built["qwen3"], tmp_path / "bf16", to="hf")
    src, f32, bf16 = stored(built["qwen3"]), stored(tmp_path / "f32"), stored(tmp_path / "bf16")
    codes = [n for n in src if src[n].dtype == FP8]
    assert len(codes) == 14 and any(src[n].shape[0] % 128 for n in codes) and any(src[n].shape[1] % 128 for n in codes)
    for name in codes:
        c, s = src[name], src[name + "_scale_inv"]
        theirs = _dequantize_fp8_weight(
            torch.from_numpy(c.view(np.uint8).copy()).view(torch.float8_e4m3fn), torch.from_numpy(s), [128, 128], torch.float32
        ).numpy()
        rows, cols = np.indices(c.shape)
        definition = c.astype(np.float32) * s[rows // 128, cols // 128]  # FORMATS.md section 8, element by element
        assert np.array_equal(f32[name], theirs) and np.array_equal(f32[name], definition), name
        assert np.array_equal(bf16[name], theirs.astype(ml_dtypes.bfloat16)), name


def test_a_576_row_weight_streams_row_ranges_with_its_half_block(tmp_path):
    """DeepSeek-V3's kv_a_proj_with_mqa: 576 rows = 4.5 blocks; any row range reads only its rows and scale rows."""
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    w = np.random.default_rng(3).standard_normal((576, 200)).astype(np.float32)
    codes, scale = quantize_fp8_block(w)
    assert scale.shape == (5, 2)
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    root = write_hf(tmp_path / "ckpt", {name: codes, name + "_scale_inv": scale}, None)
    with SafetensorsReader(root) as r:
        infos = r.tensors()
        plan = dequantization_plan(infos, {"quantization_config": FP8_CONFIG}, str(root))
        reader = DequantizingReader(r, plan)
        assert reader.tensors() == {name: TensorInfo(name, (576, 200), np.dtype(np.float32))}
        theirs = _dequantize_fp8_weight(
            torch.from_numpy(codes.view(np.uint8).copy()).view(torch.float8_e4m3fn), torch.from_numpy(scale), [128, 128], torch.float32
        ).numpy()
        assert np.array_equal(reader.read(name), theirs)
        for index in [(slice(500, 576),), (slice(100, 300), slice(150, 200)), (511,), (slice(0, 576, 7),), (slice(5, 5),)]:
            assert np.array_equal(reader.read(name, index), theirs[index]), index
        assert np.abs(theirs - w).max() <= np.abs(w).max() / 16  # e4m3: 3 mantissa bits


@pytest.mark.parametrize("family", ["deepseek3", "qwen3", "gpt-oss"])
def test_maxtext_output_gives_transformers_logits_of_the_quantized_model(built, tmp_path, family, capsys):
    from maxckpt.conversion.verify import maxtext_params
    from maxckpt.reference import reference_logits

    src = built[family]
    convert(src, tmp_path / "mt", to="maxtext", dtype="float32")
    with open_checkpoint(tmp_path / "mt", model=FAMILY[family], hf_config=src / "config.json") as mt:
        ours = reference_logits(maxtext_params(mt), mt.spec, TOKENS)
    if family == "qwen3":
        # transformers 5.24 loads partial blocks with block = shape / scale grid (80 rows here), not DeepSeek's 128:
        # its logits are those of its FP8 kernels' definition, the state dict of _dequantize_fp8_weight.
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).eval()
        raw = stored(src)
        state = {}
        for n, v in raw.items():
            if n.endswith("_scale_inv"):
                continue
            if v.dtype == FP8:
                t = torch.from_numpy(v.view(np.uint8).copy()).view(torch.float8_e4m3fn)
                state[n] = _dequantize_fp8_weight(t, torch.from_numpy(raw[n + "_scale_inv"]), [128, 128], torch.float32)
            else:
                state[n] = torch.from_numpy(v.astype(np.float32))
        model.load_state_dict(state, strict=False)
        model.tie_weights()
        theirs = logits(model)
    else:
        theirs = logits(transformers_model(src, family, torch.float32))
    assert np.abs(theirs).max() > 1
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    # and the CLI's logits check of the MaxText output against the quantized checkpoint read dequantized
    code, out, err = run_cli(["verify", tmp_path / "mt", src, "--model", FAMILY[family], "--hf-config", src / "config.json", "--logits"], capsys)
    assert code == 0, out + err


@pytest.mark.parametrize("family", ["deepseek3", "gpt-oss"])
def test_verify_and_diff_compare_dequantized_values(built, tmp_path, capsys, family):
    src = built[family]
    code, _, err = run_cli(["convert", src, tmp_path / "hf", "--to", "hf", "-q"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["verify", src, tmp_path / "hf"], capsys)
    assert code == 0, out + err
    code, out, err = run_cli(["diff", src, tmp_path / "hf"], capsys)
    assert code == 0 and "unchanged; max |a-b| 0" in out, out
    # one code changed in a copy of the source: verify and diff see it in the dequantized values
    tensors = stored(src)
    name = next(n for n, v in tensors.items() if v.dtype in (FP8, np.uint8))
    tensors[name] = tensors[name].copy()
    tensors[name].reshape(-1).view(np.uint8)[7] ^= 0x01
    write_hf(tmp_path / "changed", tensors, json.loads((src / "config.json").read_text()))
    code, out, err = run_cli(["verify", tmp_path / "changed", tmp_path / "hf"], capsys)
    assert code != 0, out + err
    code, out, err = run_cli(["diff", src, tmp_path / "changed"], capsys)
    assert "1 changed" in out, out


def test_inspect_shows_the_stored_dtype_method_and_block_and_counts_parameters(built, capsys):
    from maxckpt.explore.tree import inspect_checkpoint

    tree = inspect_checkpoint(built["gpt-oss"])
    blocks = next(e for e in tree.entries if e.name == "model.layers.0.mlp.experts.down_proj_blocks")
    assert blocks.dtype == "uint8" and blocks.size == 4 * 64 * 64 and "MXFP4" in blocks.quantization
    expected = sum(int(np.prod(s)) for s in hfl.expected_tensors(GPT_OSS).values())
    assert tree.totals().parameters == expected
    tree = inspect_checkpoint(built["deepseek3"])
    kv = next(e for e in tree.entries if e.name == "model.layers.0.self_attn.kv_a_proj_with_mqa.weight")
    assert kv.dtype == "float8_e4m3fn" and "FP8 block [128, 128]" in kv.quantization
    assert tree.totals().parameters == sum(int(np.prod(s)) for s in hfl.expected_tensors(DEEPSEEK3).values())
    code, out, err = run_cli(["inspect", built["qwen3"]], capsys)
    flat = " ".join(out.split())
    assert code == 0 and "FP8 block [128, 128] scales of" in flat and "read these weights dequantized" in flat, flat


# ------------------------------------------------------------------- writing


@pytest.mark.parametrize("family", ["deepseek3", "qwen3", "gpt-oss"])
def test_unchanged_round_trips_give_back_the_codes_and_scales(built, tmp_path, family):
    """Quantized HF -> MaxText (float32) -> HF --quantize same: codes equal; MXFP4 scales equal, FP8's within 1 ulp."""
    src = built[family]
    convert(src, tmp_path / "mt", to="maxtext", dtype="float32")
    convert(tmp_path / "mt", tmp_path / "q", to="hf", options=HFOptions(quantize=METHOD[family]), source=SourceOptions(hf_config=src / "config.json"), model=FAMILY[family])
    convert(src, tmp_path / "q-direct", to="hf", options=HFOptions(quantize=METHOD[family]))
    convert(src, tmp_path / "mt-bf16", to="maxtext")  # bfloat16: the codes come back, FP8 scales to bf16 precision
    convert(tmp_path / "mt-bf16", tmp_path / "q-bf16", to="hf", options=HFOptions(quantize=METHOD[family]), source=SourceOptions(hf_config=src / "config.json"), model=FAMILY[family])
    a = stored(src)
    for out in ("q", "q-direct", "q-bf16"):
        b = stored(tmp_path / out)
        assert sorted(a) == sorted(b) or family == "qwen3" and sorted(set(b) - set(a)) == ["lm_head.weight"]
        for name, x in a.items():
            y = b[name]
            # (via MaxText, --quantize writes what it leaves unquantized as bfloat16: DeepSeek's float32 routing bias too)
            assert (x.dtype, x.shape) == (y.dtype, y.shape) or out != "q-direct" and name.endswith("e_score_correction_bias"), name
            if name.endswith("_scale_inv") and out == "q-bf16":
                assert np.abs(y / x - 1).max() <= 2**-8, name
            elif name.endswith("_scale_inv"):
                assert np.abs(x.view(np.int32).astype(np.int64) - y.view(np.int32)).max() <= 1, name
            elif x.dtype in (FP8, np.uint8):
                assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), name
        config = json.loads((tmp_path / out / "config.json").read_text())
        assert config["quantization_config"] == (MXFP4_CONFIG if family == "gpt-oss" else FP8_CONFIG)


LLAMA = replace(tiny_spec("llama3.1"), emb_dim=256, mlp_dim=512, head_dim=64)  # dense, every dim a multiple of 128
# logits error of the quantized output vs the bf16 model, rms(diff) / rms(logits), on these tiny random models
# (README: measured 0.10 llama, 0.12-0.17 Qwen3-MoE, 0.26-0.28 DeepSeek MoE where top-k routing flips, 0.18-0.27 MXFP4)
QUANTIZATION_RMS = {"llama3.1": 0.15, "qwen3-moe": 0.4, "deepseek3": 0.4, "gpt-oss": 0.4}
QWEN3_MOE = replace(tiny_spec("qwen3-moe"), emb_dim=128, mlp_dim=256, num_experts=4, num_experts_per_tok=2, moe_mlp_dim=128)


@pytest.mark.parametrize("family", ["llama3.1", "qwen3-moe", "deepseek3", "gpt-oss"])
def test_quantized_outputs_load_in_transformers_close_to_the_bf16_export(tmp_path, family, capsys):
    spec = {"llama3.1": LLAMA, "qwen3-moe": QWEN3_MOE, "deepseek3": DEEPSEEK3, "gpt-oss": GPT_OSS}[family]
    src = write_hf(tmp_path / "bf16", random_tensors(hfl.expected_tensors(spec), seed=5), config_json(spec, np.dtype(ml_dtypes.bfloat16)))
    method = METHOD.get(family, "fp8-block")
    code, _, err = run_cli(["convert", src, tmp_path / "q", "--to", "hf", "--quantize", method, "-q"], capsys)
    assert code == 0, err
    written = stored(tmp_path / "q")
    quantized = {n for n, v in written.items() if v.dtype in (FP8, np.uint8)}
    # what the releases leave unquantized: embeddings, norms, lm_head, the router, biases, sinks
    assert not any("embed" in n or "norm" in n or "lm_head" in n or "gate.weight" in n or "router" in n or "bias" in n
                   or "sinks" in n for n in quantized), quantized
    expected = {n for n in hfl.expected_tensors(spec) if n.endswith(("_proj.weight", "_proj_with_mqa.weight", "experts.gate_up_proj", "experts.down_proj"))
                and n.startswith("model.layers.")}
    if family == "gpt-oss":
        assert quantized == {n + s for n in expected if "experts" in n for s in ("_blocks", "_scales")}
    else:
        assert quantized == expected
    config = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    if family == "qwen3-moe":  # its router is an nn.Linear in transformers: said unquantized, as Qwen3-*-FP8 do
        assert config == {**FP8_CONFIG, "modules_to_not_convert": ["lm_head", "mlp.gate"]}
    else:
        assert config == (MXFP4_CONFIG if family == "gpt-oss" else FP8_CONFIG)
    model = transformers_model(tmp_path / "q", family, torch.float32)
    from transformers import AutoModelForCausalLM

    reference = logits(AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval())
    got = logits(model)
    rms = float(np.sqrt(((got - reference) ** 2).mean() / (reference**2).mean()))
    assert 0 < rms < QUANTIZATION_RMS[family], rms  # FP8 e4m3 / FP4 e2m1 rounding of the weights, nothing more
    # ... and exactly the model of the codes written: transformers' loader gives maxckpt's dequantization
    convert(tmp_path / "q", tmp_path / "dequantized", to="hf", dtype="float32")
    np.testing.assert_allclose(logits(AutoModelForCausalLM.from_pretrained(tmp_path / "dequantized", dtype=torch.float32).eval()), got, atol=1e-5, rtol=0)
    code, out, msg = run_cli(["inspect", tmp_path / "q"], capsys)
    assert code == 0 and "read these weights dequantized" in " ".join(out.split()), out + msg


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--to", "hf", "--quantize", "mxfp4"], "--quantize mxfp4 writes gpt-oss's experts as OpenAI ships them; qwen3 has no such experts"),
        (["--to", "maxtext", "--quantize", "fp8-block"], "--quantize fp8-block writes an HF checkpoint; it cannot be used with --to maxtext"),
        (["--to", "hf", "--quantize", "int4"], "quantize must be one of fp8-block, mxfp4, got 'int4'"),
    ],
)
def test_quantize_options_that_cannot_be_written_are_one_error(built, tmp_path, capsys, argv, message):
    from hostile_tools import fails_cleanly

    shutil.copytree(built["qwen3"], tmp_path / "src")
    fails_cleanly(["convert", tmp_path / "src", tmp_path / "out", *argv], capsys, tmp_path, message)


def test_fp8_block_is_refused_for_gpt_oss(built, tmp_path, capsys):
    from hostile_tools import fails_cleanly

    shutil.copytree(built["gpt-oss"], tmp_path / "src")
    fails_cleanly(["convert", tmp_path / "src", tmp_path / "out", "--to", "hf", "--quantize", "fp8-block"], capsys, tmp_path,
                  "gpt-oss's experts are 3-D tensors", "use --quantize mxfp4")


# ------------------------------------------------------------------- every source place

from object_stores import bucket_url, object_stores  # noqa: E402,F401


def test_quantized_checkpoints_read_from_a_bucket_and_a_sharded_index(built, tmp_path, bucket_url):
    """FP8 written sharded to gs:// / s3:// with --quantize, read back from there: the same dequantized model."""
    from maxckpt.storage import objects

    src = built["deepseek3"]
    convert(src, tmp_path / "local", to="hf")
    convert(src, f"{bucket_url}/fp8", to="hf", options=HFOptions(quantize="fp8-block", max_shard_size="200KB"))
    assert objects.exists(f"{bucket_url}/fp8/model.safetensors.index.json")
    convert(f"{bucket_url}/fp8", tmp_path / "from-bucket", to="hf")
    local, back = stored(tmp_path / "local"), stored(tmp_path / "from-bucket")
    assert sorted(local) == sorted(back) and all(np.array_equal(local[n], back[n]) for n in local)


def test_e8m0_typed_scales_read_like_uint8_ones(built, tmp_path):
    """Some MXFP4 exports store the exponents as F8_E8M0 rather than uint8: the same values."""
    tensors = stored(built["gpt-oss"])
    for name in [n for n in tensors if n.endswith("_scales")]:
        tensors[name] = tensors[name].view(ml_dtypes.float8_e8m0fnu)
    write_hf(tmp_path / "e8m0", tensors, json.loads((built["gpt-oss"] / "config.json").read_text()))
    convert(tmp_path / "e8m0", tmp_path / "a", to="hf", dtype="float32")
    convert(built["gpt-oss"], tmp_path / "b", to="hf", dtype="float32")
    a, b = stored(tmp_path / "a"), stored(tmp_path / "b")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)
