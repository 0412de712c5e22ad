"""Quantized HF checkpoints maxckpt does not read are refused with one message; FP8 block and MXFP4 convert.

Read as they are, the codes would pass through as weights (FP8 codes are
thousands of times too large) and their scales would be dropped. maxckpt reads
FP8 block (quant_method 'fp8' with a weight_block_size) and MXFP4 dequantized
(tests/test_formats/test_quantized_hub.py); every other method (AutoAWQ/AutoGPTQ int32
`qweight`s, bitsandbytes, compressed-tensors, nvfp4, an unknown quant_method),
FP8 whose config.json states no block size, and codes with missing scales or
scales of the wrong shape or dtype are refused: convert, verify and diff stop
with one `error:` line naming the method and a tensor, leave the file tree
untouched, and inspect still lists the checkpoint.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cli_runner import run_cli
from conversion_models import tiny_spec
from hostile_tools import fails_cleanly
from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.errors import UnsupportedModelError
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.hf.config import config_json
from maxckpt.formats.hf.quantization import quantization
from maxckpt.tensors import TensorInfo
from quantized_models import BF16, FP8, gpt_oss_mxfp4, qwen3_bf16, qwen3_fp8, random_tensors, write_hf

FP8_METHOD = "FP8 block, quant_method 'fp8', e4m3, weight_block_size [128, 128]"
MXFP4_METHOD = "MXFP4, quant_method 'mxfp4'"
WAY_OUT = (
    "maxckpt reads FP8 block (quant_method 'fp8' with a weight_block_size, e4m3) and MXFP4 (quant_method 'mxfp4') checkpoints",
    "dequantize others to bfloat16 first",
)
DOWN = "model.layers.0.mlp.down_proj.weight"
DOWN_FP8 = f"tensor {DOWN} is float8_e4m3fn [32, 160]"
OSS_DOWN = "model.layers.0.mlp.experts.down_proj"


def edited(build, edit_tensors=None, edit_config=None):
    """A builder of `build`'s checkpoint with its tensors and/or config.json changed (a damaged or foreign export)."""

    def make(root: Path) -> Path:
        build(root)
        if edit_tensors is not None:
            with SafetensorsReader(root) as r:
                tensors = {n: r.read(n) for n in r.tensors()}
            edit_tensors(tensors)
            config = json.loads((root / "config.json").read_text()) if (root / "config.json").is_file() else None
            shutil.rmtree(root)
            write_hf(root, tensors, config)
        if edit_config is not None:
            config = json.loads((root / "config.json").read_text())
            edit_config(config["quantization_config"])
            (root / "config.json").write_text(json.dumps(config))
        return root

    return make


def _set(d: dict, **values):
    d.update(values)


def int4_packed(root: Path, method: str) -> Path:
    """AutoAWQ (`qweight` [in, out/8]) or AutoGPTQ (`qweight` [in/8, out], `g_idx`): int32-packed 4-bit, group 128."""
    spec, group = replace(tiny_spec("llama2"), emb_dim=128, mlp_dim=256), 128
    rng = np.random.default_rng(2)
    shapes = hfl.expected_tensors(spec)
    linears = {n: s for n, s in shapes.items() if n.startswith("model.layers.") and n.endswith("_proj.weight")}
    tensors = random_tensors({n: s for n, s in shapes.items() if n not in linears})
    for name, (out_dim, in_dim) in linears.items():
        base = name[: -len(".weight")]
        packed = (in_dim, out_dim // 8) if method == "awq" else (in_dim // 8, out_dim)
        tensors[base + ".qweight"] = rng.integers(0, 2**31, packed, dtype=np.int32)
        tensors[base + ".qzeros"] = rng.integers(0, 2**31, (in_dim // group, out_dim // 8), dtype=np.int32)
        tensors[base + ".scales"] = np.full((in_dim // group, out_dim), 0.01, np.float16)
        if method == "gptq":
            tensors[base + ".g_idx"] = (np.arange(in_dim) // group).astype(np.int32)
    config = config_json(spec, np.dtype(np.float16))
    config["quantization_config"] = {
        "quant_method": method,
        "bits": 4,
        "group_size": group,
        "desc_act": False,
        **({"version": "gemm", "zero_point": True} if method == "awq" else {"sym": True}),
    }
    return write_hf(root, tensors, config)




# (builder, expected method text, the rest of the message: the tensor it names and why)
CASES = {
    "awq": (
        lambda root: int4_packed(root, "awq"),
        "quant_method 'awq'",
        "tensor model.layers.0.mlp.down_proj.qweight is int32 [256, 16]), which maxckpt cannot convert",
    ),
    "gptq": (
        lambda root: int4_packed(root, "gptq"),
        "quant_method 'gptq'",
        "tensor model.layers.0.mlp.down_proj.qweight is int32 [32, 128]), which maxckpt cannot convert",
    ),
    "fp8-without-quantization_config": (
        lambda root: qwen3_fp8(root, quantization_config=False),
        "FP8 block: float8_e4m3fn weights with *_scale_inv block scales; config.json states no quantization_config",
        DOWN_FP8 + "), which maxckpt cannot convert",
    ),
    "fp8-without-config.json": (
        lambda root: qwen3_fp8(root, config=False),
        "FP8 block: float8_e4m3fn weights with *_scale_inv block scales; config.json states no quantization_config",
        DOWN_FP8 + "), which maxckpt cannot convert",
    ),
    "unknown-quant_method": (
        edited(qwen3_fp8, edit_config=lambda qc: _set(qc, quant_method="fbgemm_fp8")),
        "quant_method 'fbgemm_fp8'",
        DOWN_FP8 + "), which maxckpt cannot convert",
    ),
    "fp8-scales-missing": (
        edited(qwen3_fp8, edit_tensors=lambda t: t.pop(DOWN + "_scale_inv")),
        FP8_METHOD,
        DOWN_FP8 + f"), but its block scales {DOWN}_scale_inv are missing",
    ),
    "fp8-scales-wrong-shape": (
        edited(qwen3_fp8, edit_tensors=lambda t: t.update({DOWN + "_scale_inv": np.ones((2, 2), np.float32)})),
        FP8_METHOD,
        DOWN_FP8 + f"), but its scales {DOWN}_scale_inv have shape [2, 2], not [1, 2]",
    ),
    "fp8-scales-wrong-dtype": (
        edited(qwen3_fp8, edit_tensors=lambda t: t.update({DOWN + "_scale_inv": t[DOWN + "_scale_inv"].astype(np.float16)})),
        FP8_METHOD,
        DOWN_FP8 + f"), but its scales {DOWN}_scale_inv are float16, not float32",
    ),
    "fp8-scales-of-a-bf16-weight": (
        edited(qwen3_fp8, edit_tensors=lambda t: t.update({"model.embed_tokens.weight_scale_inv": np.ones((1, 1), np.float32)})),
        FP8_METHOD,
        "tensor model.embed_tokens.weight is bfloat16 [128, 32], scales model.embed_tokens.weight_scale_inv), "
        "but FP8 block scales belong to float8_e4m3fn codes",
    ),
    "fp8-without-block-size": (
        edited(qwen3_fp8, edit_config=lambda qc: qc.pop("weight_block_size")),
        "FP8, quant_method 'fp8', e4m3",
        "weight_block_size None), but maxckpt reads FP8 with [rows, cols] block scales only",
    ),
    "fp8-e5m2": (
        edited(qwen3_fp8, edit_config=lambda qc: _set(qc, fmt="e5m2")),
        "FP8 block, quant_method 'fp8', e5m2, weight_block_size [128, 128]",
        "fmt 'e5m2'), but maxckpt reads e4m3 FP8 codes only",
    ),
    "fp8-static-activation-scales": (
        edited(qwen3_fp8, edit_tensors=lambda t: t.update({"model.layers.0.mlp.down_proj.input_scale": np.ones((), np.float32)})),
        FP8_METHOD,
        "tensor model.layers.0.mlp.down_proj.input_scale is float32 []), but that tensor is none of its codes or scales",
    ),
    "mxfp4-scales-missing": (
        edited(gpt_oss_mxfp4, edit_tensors=lambda t: t.pop(OSS_DOWN + "_scales")),
        MXFP4_METHOD,
        f"tensor {OSS_DOWN}_blocks is uint8 [4, 64, 2, 16]), but its scales {OSS_DOWN}_scales are missing",
    ),
    "mxfp4-scales-wrong-shape": (
        edited(gpt_oss_mxfp4, edit_tensors=lambda t: t.update({OSS_DOWN + "_scales": t[OSS_DOWN + "_scales"][:, :, :1].copy()})),
        MXFP4_METHOD,
        f"tensor {OSS_DOWN}_blocks is uint8 [4, 64, 2, 16]), but its scales {OSS_DOWN}_scales have shape [4, 64, 1], not [4, 64, 2]",
    ),
    "mxfp4-scales-wrong-dtype": (
        edited(gpt_oss_mxfp4, edit_tensors=lambda t: t.update({OSS_DOWN + "_scales": t[OSS_DOWN + "_scales"].astype(np.float32)})),
        MXFP4_METHOD,
        f"tensor {OSS_DOWN}_blocks is uint8 [4, 64, 2, 16]), but its scales {OSS_DOWN}_scales are float32, not uint8 E8M0 exponents",
    ),
    "mxfp4-blocks-wrong-dtype": (
        edited(gpt_oss_mxfp4, edit_tensors=lambda t: t.update({OSS_DOWN + "_blocks": t[OSS_DOWN + "_blocks"].view(np.int8)})),
        MXFP4_METHOD,
        f"tensor {OSS_DOWN}_blocks is int8 [4, 64, 2, 16]), but MXFP4 expert codes are uint8",
    ),
}
FULL_MATRIX = ("awq", "gptq", "fp8-without-quantization_config", "fp8-scales-missing", "mxfp4-scales-wrong-shape")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    paths = {name: build(root / name) for name, (build, _, _) in CASES.items()}
    paths["bf16"] = qwen3_bf16(root / "bf16")
    return paths


@pytest.fixture
def work(built, tmp_path):
    for name, path in built.items():
        shutil.copytree(path, tmp_path / name)
    return tmp_path


def commands(ckpt: Path, other: Path, out: Path) -> dict[str, list]:
    return {
        "convert-maxtext": ["convert", ckpt, out, "--to", "maxtext", "-q"],
        "convert-hf": ["convert", ckpt, out, "--to", "hf", "-q"],
        "convert-megatron": ["convert", ckpt, out, "--to", "megatron", "--megatron-spec", "local", "-q"],
        "verify": ["verify", ckpt, other],
        "verify-reversed": ["verify", other, ckpt],
        "diff": ["diff", ckpt, other],
    }


# ----------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    "case, command",
    [(c, cmd) for c in FULL_MATRIX for cmd in commands(Path(), Path(), Path())]
    + [(c, "convert-maxtext") for c in CASES if c not in FULL_MATRIX],
)
def test_quantized_hf_sources_maxckpt_does_not_read_are_refused_with_one_message(work, capsys, case, command):
    _, method, rest = CASES[case]
    ckpt, out = work / case, work / "out"
    argv = commands(ckpt, work / "bf16", out)[command]
    message = fails_cleanly(argv, capsys, work, f"{ckpt}: quantized HF checkpoint ({method}; {rest}", *WAY_OUT)
    assert not out.exists() and not list(work.glob("out.tmp-*")), message


def test_two_refused_checkpoints_are_not_diffed_code_by_code(work, capsys):
    shutil.copytree(work / "awq", work / "awq-copy")
    fails_cleanly(["diff", work / "awq", work / "awq-copy"], capsys, work, "quantized HF checkpoint", "quant_method 'awq'")
    # --native compares the stored tensors (codes and scales) by name, as asked
    code, _, err = run_cli(["diff", work / "awq", work / "awq-copy", "--native"], capsys)
    assert code == 0, err


def test_the_python_api_raises_the_same_error(work):
    from maxckpt.conversion import convert, open_checkpoint

    with pytest.raises(UnsupportedModelError, match=r"quantized HF checkpoint \(quant_method 'gptq'"):
        convert(work / "gptq", work / "out", to="maxtext")
    assert not (work / "out").exists()
    with open_checkpoint(work / "fp8-scales-missing") as ckpt:  # listing is fine; settling the model is not
        assert ckpt.tensors()["model.layers.0.mlp.up_proj.weight_scale_inv"].shape == (2, 1)
        with pytest.raises(UnsupportedModelError, match="are missing"):
            ckpt.hf_tensors()


@pytest.mark.parametrize("case", ["awq", "fp8-without-config.json", "mxfp4-scales-wrong-dtype"])
def test_inspect_lists_a_refused_checkpoint_and_says_why(work, capsys, case):
    code, out, err = run_cli(["inspect", work / case], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "qweight" in flat or "_scale_inv" in flat or "_blocks" in flat
    assert f"note: {work / case}: quantized HF checkpoint ({CASES[case][1]}" in flat, flat


def test_a_bf16_checkpoint_still_converts(work, capsys):
    for to in ("maxtext", "hf"):
        code, _, err = run_cli(["convert", work / "bf16", work / f"out-{to}", "--to", to, "-q"], capsys)
        assert code == 0, err
    code, out, err = run_cli(["verify", work / "bf16", work / "out-hf"], capsys)
    assert code == 0, err + out
    code, out, err = run_cli(["inspect", work / "bf16"], capsys)
    assert code == 0 and "quantized" not in out, out


def info(name: str, shape: tuple[int, ...], dtype) -> tuple[str, TensorInfo]:
    return name, TensorInfo(name, shape, np.dtype(dtype))


@pytest.mark.parametrize(
    "tensors, config, method, tensor",
    [
        # int8 weights without any config (e.g. a stripped SmoothQuant / W8A8 export)
        (
            [info("model.layers.0.mlp.up_proj.weight", (64, 32), np.int8)],
            None,
            "integer: int8 weights",
            "model.layers.0.mlp.up_proj.weight",
        ),
        # compressed-tensors FP8 with per-tensor scales, config stripped
        (
            [info("a.q_proj.weight", (8, 8), FP8), info("a.q_proj.weight_scale", (1,), np.float32)],
            {},
            "FP8: float8_e4m3fn weights",
            "a.q_proj.weight",
        ),
        # modelopt NVFP4: uint8 packed weights, F8_E4M3 block scales, float32 global scale
        (
            [
                info("a.q_proj.weight", (8, 4), np.uint8),
                info("a.q_proj.weight_scale", (8, 1), FP8),
                info("a.q_proj.weight_scale_2", (), np.float32),
            ],
            {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}},
            "quant_method 'modelopt'",
            "a.q_proj.weight",
        ),
        # bitsandbytes 4-bit: the weights are uint8 and a quant_state rides along
        (
            [
                info("a.q_proj.weight", (32, 1), np.uint8),
                info("a.q_proj.weight.absmax", (1,), np.float32),
                info("a.q_proj.weight.quant_state.bitsandbytes__nf4", (10,), np.uint8),
            ],
            {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
            "quant_method 'bitsandbytes'",
            "a.q_proj.weight",
        ),
        # compressed-tensors' older config key
        (
            [info("a.q_proj.weight_packed", (8, 1), np.int32)],
            {"compression_config": {"quant_method": "compressed-tensors"}},
            "quant_method 'compressed-tensors'",
            "a.q_proj.weight_packed",
        ),
        # bf16 weights but scale tensors beside them, no config: still refused
        (
            [info("a.q_proj.weight", (8, 8), BF16), info("a.q_proj.input_scale", (), np.float32)],
            None,
            "scaled (compressed-tensors / modelopt); config.json states no quantization_config",
            "a.q_proj.input_scale",
        ),
        # a config that says quantized, tensors that do not look it: refused, and said so
        (
            [info("a.q_proj.weight", (8, 8), BF16)],
            {"quantization_config": {"quant_method": "nvfp4"}},
            "quant_method 'nvfp4'",
            None,
        ),
        (
            [info("a.q_proj.weight", (8, 8), BF16)],
            {"quantization_config": {"bits": 4}},
            "config.json has a quantization_config without a quant_method",
            None,
        ),
    ],
)
def test_quantization_is_recognised_from_the_config_or_the_tensors_alone(tensors, config, method, tensor):
    q = quantization(dict(tensors), config)
    assert q is not None and q.method.startswith(method) and q.tensor == tensor, q


def test_full_precision_tensors_and_integer_buffers_are_not_quantization():
    infos = dict(
        [
            info("model.layers.0.mlp.up_proj.weight", (64, 32), BF16),
            info("model.embed_tokens.weight", (8, 4), np.float32),
            info("model.position_ids", (1, 64), np.int64),
            info("model.layers.0.self_attn.rotary_emb.inv_freq", (8,), np.float32),
        ]
    )
    assert quantization(infos, {"model_type": "llama"}) is None
    assert quantization(infos, {"quantization_config": None}) is None
    assert quantization(infos, None) is None
