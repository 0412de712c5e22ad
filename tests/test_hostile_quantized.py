"""Quantized HF checkpoints (FP8 block, MXFP4, awq/gptq, ...) are refused with one message until maxckpt dequantizes.

Read as they are, their codes would pass through as weights (FP8 codes are
thousands of times too large) and their scales would be dropped. Each case
builds a tiny checkpoint in the Hub's own layout (FORMATS.md section 8:
Qwen3-FP8 and DeepSeek-V3 `F8_E4M3` weights with float32 `*_scale_inv` of
shape [ceil(out/128), ceil(in/128)], gpt-oss `*_blocks`/`*_scales` uint8,
AutoAWQ/AutoGPTQ int32 `qweight`s) and checks that convert, verify and diff
refuse it with one `error:` line naming the method, a tensor and the way out,
leave the file tree untouched, and that inspect still lists it.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from cli_runner import run_cli
from conversion_models import tiny_spec
from hostile_tools import fails_cleanly
from maxckpt.errors import UnsupportedModelError
from maxckpt.layouts import hf as hfl
from maxckpt.layouts.quantization import quantization
from maxckpt.tensors import TensorInfo

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
BLOCK = 128
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]}
FP8_METHOD = "FP8 block, quant_method 'fp8', e4m3, weight_block_size [128, 128]"
WAY_OUT = (
    "Dequantize it to bfloat16 first",
    "FineGrainedFP8Config(dequantize=True)",
    "Mxfp4Config(dequantize=True)",
    "reading FP8 and MXFP4 checkpoints directly is planned",
)


def fp8_block(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(F8_E4M3 codes, float32 scale_inv [ceil(out/128), ceil(in/128)]) with W = codes * scale_inv per 128x128 block."""
    rows, cols = w.shape
    scale_inv = np.empty((math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)), np.float32)
    codes = np.empty(w.shape, FP8)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            block = (slice(i * BLOCK, (i + 1) * BLOCK), slice(j * BLOCK, (j + 1) * BLOCK))
            scale_inv[i, j] = max(float(np.abs(w[block]).max()), 1e-12) / 448.0  # e4m3's largest finite value
            codes[block] = (w[block] / scale_inv[i, j]).astype(FP8)
    return codes, scale_inv


def fp8_quantized(tensors: dict[str, np.ndarray], keep) -> dict[str, np.ndarray]:
    """Every 2-D weight except those `keep(name)` accepts, as FP8 codes plus `<name>_scale_inv`."""
    out = {}
    for name, value in tensors.items():
        if value.ndim == 2 and name.endswith(".weight") and not keep(name):
            out[name], out[name + "_scale_inv"] = fp8_block(value.astype(np.float32))
        else:
            out[name] = value
    return out


def write_hf(root: Path, tensors: dict[str, np.ndarray], config: dict | None) -> Path:
    root.mkdir(parents=True)
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        (root / "config.json").write_text(json.dumps(config, indent=2))
    return root


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        base = 1.0 if "norm" in name else 0.0
        out[name] = (base + rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(BF16)
    return out


# --------------------------------------------------------------- the checkpoints


QWEN3 = replace(tiny_spec("qwen3"), mlp_dim=160)  # 160 = one full and one partial 128-block


def qwen3_bf16(root: Path) -> Path:
    return write_hf(root, random_tensors(hfl.expected_tensors(QWEN3)), hfl.config_json(QWEN3, BF16))


def qwen3_fp8(root: Path, *, config: bool = True, quantization_config: bool = True) -> Path:
    """Qwen3-*-FP8: every linear of the layers in F8_E4M3 with `_scale_inv`; embeddings, norms (and lm_head) not."""
    tensors = fp8_quantized(
        random_tensors(hfl.expected_tensors(QWEN3)), keep=lambda n: not n.startswith("model.layers.")
    )
    cfg = hfl.config_json(QWEN3, BF16)
    if quantization_config:
        cfg["quantization_config"] = dict(FP8_CONFIG)
    return write_hf(root, tensors, cfg if config else None)


def deepseek_v3_fp8(root: Path) -> Path:
    """DeepSeek-V3/R1: MLA, a dense layer then MoE with a shared expert; the router gate and norms stay unquantized."""
    H, heads, q_lora, kv_lora, nope, rope, v, inter, moe_inter, experts, vocab = (
        160,
        2,
        64,
        32,
        16,
        8,
        16,
        192,
        32,
        4,
        64,
    )
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, H),
        "model.norm.weight": (H,),
        "lm_head.weight": (vocab, H),
    }
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_a_proj.weight": (q_lora, H),
            p + "self_attn.q_a_layernorm.weight": (q_lora,),
            p + "self_attn.q_b_proj.weight": (heads * (nope + rope), q_lora),
            p + "self_attn.kv_a_proj_with_mqa.weight": (kv_lora + rope, H),
            p + "self_attn.kv_a_layernorm.weight": (kv_lora,),
            p + "self_attn.kv_b_proj.weight": (heads * (nope + v), kv_lora),
            p + "self_attn.o_proj.weight": (H, heads * v),
        }
        mlps = (
            [p + "mlp."] if i == 0 else [p + f"mlp.experts.{e}." for e in range(experts)] + [p + "mlp.shared_experts."]
        )
        width = inter if i == 0 else moe_inter
        for m in mlps:
            shapes |= {
                m + "gate_proj.weight": (width, H),
                m + "up_proj.weight": (width, H),
                m + "down_proj.weight": (H, width),
            }
        if i == 1:
            shapes |= {p + "mlp.gate.weight": (experts, H)}
    tensors = fp8_quantized(
        random_tensors(shapes),
        keep=lambda n: n in ("model.embed_tokens.weight", "lm_head.weight") or n.endswith("mlp.gate.weight"),
    )
    tensors["model.layers.1.mlp.gate.e_score_correction_bias"] = np.zeros(experts, np.float32)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": H,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "q_lora_rank": q_lora,
        "kv_lora_rank": kv_lora,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v,
        "intermediate_size": inter,
        "moe_intermediate_size": moe_inter,
        "n_routed_experts": experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "quantization_config": dict(FP8_CONFIG),
    }
    return write_hf(root, tensors, config)


def gpt_oss_mxfp4(root: Path) -> Path:
    """gpt-oss: experts' gate_up_proj/down_proj as uint8 `_blocks` [E, out, in/32, 16] and `_scales` [E, out, in/32]."""
    H, inter, experts, heads, kv_heads, head_dim, vocab = 64, 64, 4, 4, 2, 16, 64
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, H),
        "model.norm.weight": (H,),
        "lm_head.weight": (vocab, H),
    }
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (heads * head_dim, H),
            p + "self_attn.q_proj.bias": (heads * head_dim,),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, H),
            p + "self_attn.k_proj.bias": (kv_heads * head_dim,),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, H),
            p + "self_attn.v_proj.bias": (kv_heads * head_dim,),
            p + "self_attn.o_proj.weight": (H, heads * head_dim),
            p + "self_attn.o_proj.bias": (H,),
            p + "self_attn.sinks": (heads,),
            p + "mlp.router.weight": (experts, H),
            p + "mlp.router.bias": (experts,),
            p + "mlp.experts.gate_up_proj_bias": (experts, 2 * inter),
            p + "mlp.experts.down_proj_bias": (experts, H),
        }
    tensors = random_tensors(shapes)
    rng = np.random.default_rng(1)
    for i in range(2):
        p = f"model.layers.{i}.mlp.experts."
        for name, out_dim, in_dim in (("gate_up_proj", 2 * inter, H), ("down_proj", H, inter)):
            tensors[p + name + "_blocks"] = rng.integers(0, 256, (experts, out_dim, in_dim // 32, 16), dtype=np.uint8)
            tensors[p + name + "_scales"] = rng.integers(120, 130, (experts, out_dim, in_dim // 32), dtype=np.uint8)
    config = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": H,
        "intermediate_size": inter,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_local_experts": experts,
        "num_experts_per_tok": 2,
        "experts_per_token": 2,
        "vocab_size": vocab,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
        "rms_norm_eps": 1e-5,
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        },
    }
    return write_hf(root, tensors, config)


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
    config = hfl.config_json(spec, np.dtype(np.float16))
    config["quantization_config"] = {
        "quant_method": method,
        "bits": 4,
        "group_size": group,
        "desc_act": False,
        **({"version": "gemm", "zero_point": True} if method == "awq" else {"sym": True}),
    }
    return write_hf(root, tensors, config)


# (builder, expected method text, the tensor the message names)
CASES = {
    "qwen3-fp8": (qwen3_fp8, FP8_METHOD, "tensor model.layers.0.mlp.down_proj.weight is float8_e4m3fn [32, 160]"),
    "deepseek-v3-fp8": (
        deepseek_v3_fp8,
        FP8_METHOD,
        "tensor model.layers.0.mlp.down_proj.weight is float8_e4m3fn [160, 192]",
    ),
    "gpt-oss-mxfp4": (
        gpt_oss_mxfp4,
        "MXFP4, quant_method 'mxfp4'",
        "tensor model.layers.0.mlp.experts.down_proj_blocks is uint8 [4, 64, 2, 16]",
    ),
    "awq": (
        lambda root: int4_packed(root, "awq"),
        "quant_method 'awq'",
        "tensor model.layers.0.mlp.down_proj.qweight is int32 [256, 16]",
    ),
    "gptq": (
        lambda root: int4_packed(root, "gptq"),
        "quant_method 'gptq'",
        "tensor model.layers.0.mlp.down_proj.qweight is int32 [32, 128]",
    ),
    "fp8-without-quantization_config": (
        lambda root: qwen3_fp8(root, quantization_config=False),
        "FP8 block: float8_e4m3fn weights with *_scale_inv block scales; config.json states no quantization_config",
        "tensor model.layers.0.mlp.down_proj.weight is float8_e4m3fn [32, 160]",
    ),
    "fp8-without-config.json": (
        lambda root: qwen3_fp8(root, config=False),
        "FP8 block: float8_e4m3fn weights with *_scale_inv block scales; config.json states no quantization_config",
        "tensor model.layers.0.mlp.down_proj.weight is float8_e4m3fn [32, 160]",
    ),
}


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


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", list(commands(Path(), Path(), Path())))
def test_quantized_hf_sources_are_refused_with_one_message(work, capsys, case, command):
    _, method, tensor = CASES[case]
    ckpt, out = work / case, work / "out"
    argv = commands(ckpt, work / "bf16", out)[command]
    message = fails_cleanly(argv, capsys, work, f"{ckpt}: quantized HF checkpoint ({method}; {tensor})", *WAY_OUT)
    assert not out.exists() and not list(work.glob("out.tmp-*")), message


def test_two_quantized_checkpoints_are_not_diffed_code_by_code(work, capsys):
    shutil.copytree(work / "qwen3-fp8", work / "qwen3-fp8-copy")
    fails_cleanly(
        ["diff", work / "qwen3-fp8", work / "qwen3-fp8-copy"], capsys, work, "quantized HF checkpoint", FP8_METHOD
    )
    # --native compares the stored tensors (codes and scales) by name, as asked
    code, _, err = run_cli(["diff", work / "qwen3-fp8", work / "qwen3-fp8-copy", "--native"], capsys)
    assert code == 0, err


def test_the_python_api_raises_the_same_error(work):
    from maxckpt.conversion import convert, open_checkpoint

    with pytest.raises(UnsupportedModelError, match=r"quantized HF checkpoint \(FP8 block"):
        convert(work / "qwen3-fp8", work / "out", to="maxtext")
    assert not (work / "out").exists()
    with open_checkpoint(work / "qwen3-fp8") as ckpt:  # listing is fine; settling the model is not
        assert ckpt.tensors()["model.layers.0.mlp.up_proj.weight_scale_inv"].shape == (2, 1)
        with pytest.raises(UnsupportedModelError, match="MXFP4 checkpoints directly is planned"):
            ckpt.hf_tensors()


@pytest.mark.parametrize("case", ["qwen3-fp8", "gpt-oss-mxfp4", "fp8-without-config.json"])
def test_inspect_lists_a_quantized_checkpoint_and_says_it_is_quantized(work, capsys, case):
    code, out, err = run_cli(["inspect", work / case], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "_scale_inv" in flat or "_blocks" in flat
    assert f"note: {work / case}: quantized HF checkpoint ({CASES[case][1]}" in flat, flat


def test_e8m0_scales_are_listed_then_refused(work, capsys):
    # Some MXFP4 exports store the exponents as F8_E8M0 rather than uint8: readable metadata, refused all the same.
    from safetensors.numpy import load_file

    shard = work / "gpt-oss-mxfp4" / "model.safetensors"
    tensors = load_file(shard)
    for name in [n for n in tensors if n.endswith("_scales")]:
        tensors[name] = tensors[name].view(ml_dtypes.float8_e8m0fnu)
    shard.unlink()
    save_file(tensors, str(shard))
    code, out, err = run_cli(["inspect", work / "gpt-oss-mxfp4"], capsys)
    assert code == 0 and "float8_e8m0fnu" in out, err
    fails_cleanly(
        ["convert", work / "gpt-oss-mxfp4", work / "out", "--to", "maxtext"],
        capsys,
        work,
        "quantized HF checkpoint (MXFP4, quant_method 'mxfp4'; tensor model.layers.0.mlp.experts.down_proj_blocks",
    )


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
