"""Megatron-Core torch_dist layout: HF -> Megatron -> HF bit-exact, stock DCP loads, logits, sidecars."""

from __future__ import annotations

import functools
import json

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch_reference import (
    hf_arrays,
    hf_logits,
    lazy,
    lazy_from_reader,
    megatron_forward,
    megatron_shapes,
    spec_of,
    tiny_hf_model,
    write_all,
)

from maxckpt.containers.dcp import DcpReader
from maxckpt.errors import CheckpointNotFoundError, ShapeMismatchError
from maxckpt.formats.megatron.args import spec_fields_from_megatron_args
from maxckpt.formats.megatron.files import (
    find_megatron_checkpoint,
    iteration_dir_name,
    open_megatron_writer,
    read_megatron_common,
    write_megatron_sidecars,
)
from maxckpt.formats.megatron.layout import MegatronLayout
from maxckpt.layouts.torch_transforms import fuse_qkv, split_qkv

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# (family, heads, kv heads, head_dim, hidden, tied, vocab, divisible_by)
CONFIGS = {
    "gqa-untied-padded": ("llama", 4, 2, 16, 64, False, 250, 128),
    "mha-tied": ("llama", 4, 4, 16, 64, True, 256, 128),
    "mqa-unpadded": ("llama", 8, 1, 8, 64, False, 100, 1),
    "gqa4-padded-by-64": ("llama", 8, 2, 8, 48, True, 130, 64),
    "qwen3-qk-norm": ("qwen3", 4, 2, 32, 64, False, 250, 128),
}


@functools.lru_cache(maxsize=None)
def _model(key: str, dtype: torch.dtype = torch.float32):
    fam, h, g, d, e, tied, vocab, _ = CONFIGS[key]
    return tiny_hf_model(fam, heads=h, kv_heads=g, head_dim=d, hidden=e, tied=tied, vocab=vocab, dtype=dtype)


def _convert(model, layout: MegatronLayout, root, iteration=1):
    spec = spec_of(model)
    with open_megatron_writer(root, spec, layout, iteration) as w:
        write_all(w, layout.from_hf(lazy(hf_arrays(model)), spec))
    write_megatron_sidecars(root, spec, layout, iteration)
    return root / iteration_dir_name(iteration), spec


def _expected_shapes(spec, layout) -> dict[str, tuple[int, ...]]:
    return megatron_shapes(spec, layout.padded_vocab_size(spec.vocab_size))


@pytest.mark.parametrize("key", list(CONFIGS))
def test_stock_dcp_load_hf_tensors_and_logits(tmp_path, key):
    model = _model(key)
    layout = MegatronLayout(spec="local", make_vocab_size_divisible_by=CONFIGS[key][7])
    it_dir, spec = _convert(model, layout, tmp_path / "mega")

    # Stock torch.distributed.checkpoint.load, no process group, into the expected keys and shapes.
    shapes = _expected_shapes(spec, layout)
    sd = {k: torch.empty(s) for k, s in shapes.items()}
    sd.update({k: None for k in layout.extra_state(spec)})
    dcp.load(sd, checkpoint_id=str(it_dir), no_dist=True)
    assert all(sd[k] == [None] for k in layout.extra_state(spec))
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    vp = layout.padded_vocab_size(spec.vocab_size)
    assert not tensors["embedding.word_embeddings.weight"][spec.vocab_size : vp].any()  # zero padding

    # The HF tensors recomputed from what torch loaded equal transformers' own, exactly.
    back = layout.to_hf(lazy({k: v.numpy() for k, v in tensors.items()}), spec)
    original = hf_arrays(model)
    assert set(back) == set(original)
    for name, arr in original.items():
        assert np.array_equal(back[name].read(), arr), name

    # A forward written on Megatron's layout gives transformers' logits.
    diff = (megatron_forward(tensors, spec) - hf_logits(model)).abs().max().item()
    assert diff < 1e-4


@pytest.mark.parametrize("key", ["gqa-untied-padded", "gqa4-padded-by-64", "qwen3-qk-norm"])
def test_round_trip_through_the_dcp_reader_is_bit_exact_in_bfloat16(tmp_path, key):
    model = _model(key, torch.bfloat16)
    layout = MegatronLayout(spec="te", make_vocab_size_divisible_by=CONFIGS[key][7])
    it_dir, spec = _convert(model, layout, tmp_path / "mega")
    reader = DcpReader(it_dir)
    assert reader.tensors()["decoder.layers.self_attention.linear_qkv.weight"].chunk_shape[0] == 1  # a chunk per layer
    back = layout.to_hf(lazy_from_reader(reader), spec)
    for name, arr in hf_arrays(model).items():
        got = back[name].read()
        assert got.dtype == np.dtype(ml_dtypes.bfloat16)
        assert np.array_equal(got.view(np.uint16), arr.view(np.uint16)), name


def test_reading_accepts_per_layer_keys_and_local_norm_names():
    model = _model("gqa-untied-padded")
    spec = spec_of(model)
    layout = MegatronLayout()
    stacked = {k: v.read() for k, v in layout.from_hf(lazy(hf_arrays(model)), spec).items()}
    per_layer = {}
    for name, arr in stacked.items():
        if not name.startswith("decoder.layers."):
            per_layer[name] = arr
            continue
        suffix = name.removeprefix("decoder.layers.")
        suffix = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight"}.get(suffix, suffix)
        for i in range(spec.num_layers):
            if suffix == "mlp.linear_fc1.weight":  # singleton_local_shards split: weight_w = gate, weight_v = up
                gate, up = np.split(arr[i], 2)
                per_layer[f"decoder.layers.{i}.mlp.linear_fc1.weight_w"] = gate
                per_layer[f"decoder.layers.{i}.mlp.linear_fc1.weight_v"] = up
            else:
                per_layer[f"decoder.layers.{i}.{suffix}"] = arr[i]
    back = layout.to_hf(lazy(per_layer), spec)
    for name, arr in hf_arrays(model).items():
        assert np.array_equal(back[name].read(), arr), name


def test_norm_keys_option_and_extra_state_per_spec():
    model = _model("gqa-untied-padded")
    spec = spec_of(model)
    local = MegatronLayout(norm_keys="local").from_hf(lazy(hf_arrays(model)), spec)
    assert "decoder.layers.input_layernorm.weight" in local
    assert "decoder.layers.pre_mlp_layernorm.weight" in local
    assert "decoder.layers.self_attention.linear_qkv.layer_norm_weight" not in local
    te_extra = MegatronLayout(spec="te").extra_state(spec)
    local_extra = MegatronLayout(spec="local").extra_state(spec)
    assert "decoder.layers.self_attention.linear_qkv._extra_state/shard_1_2" in local_extra
    assert len(local_extra) == 4 * spec.num_layers
    # TE adds TEDotProductAttention's and the final TENorm's (TE 2's norms are fusible ops with extra state).
    assert set(te_extra) - set(local_extra) == {
        f"decoder.layers.self_attention.core_attention._extra_state/shard_{i}_2" for i in range(2)
    } | {"decoder.final_layernorm._extra_state/shard_0_1"}


def test_sidecars_as_megatron_lm_writes_them(tmp_path):
    model = _model("gqa-untied-padded")
    layout = MegatronLayout(spec="local")
    it_dir, spec = _convert(model, layout, tmp_path / "mega", iteration=1)
    root = tmp_path / "mega"
    assert it_dir.name == "iter_0000001"
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert json.loads((it_dir / "metadata.json").read_text()) == {
        "sharded_backend": "torch_dist",
        "sharded_backend_version": 1,
        "common_backend": "torch",
        "common_backend_version": 1,
    }
    common = read_megatron_common(it_dir)
    assert common["checkpoint_version"] == 3.0 and common["iteration"] == 1
    args = common["args"]
    assert (args.num_layers, args.hidden_size, args.num_attention_heads, args.num_query_groups) == (2, 64, 4, 2)
    assert args.padded_vocab_size == 256 and args.untie_embeddings_and_output_weights
    fields = spec_fields_from_megatron_args(args)
    for f, v in fields.items():
        assert getattr(spec, f) == v, f
    assert find_megatron_checkpoint(root) == (it_dir, 1)
    assert find_megatron_checkpoint(it_dir) == (it_dir, 1)


def test_release_checkpoint(tmp_path):
    model = _model("mha-tied")
    it_dir, spec = _convert(model, MegatronLayout(), tmp_path / "mega", iteration=None)
    assert it_dir.name == "release"
    assert (tmp_path / "mega" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert find_megatron_checkpoint(tmp_path / "mega") == (it_dir, None)


def test_clear_errors(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="latest_checkpointed_iteration.txt"):
        find_megatron_checkpoint(tmp_path)
    model = _model("gqa-untied-padded")
    spec = spec_of(model)
    tensors = MegatronLayout().from_hf(lazy(hf_arrays(model)), spec)
    wrong = spec.__class__(**{**spec.__dict__, "num_kv_heads": 4})
    with pytest.raises(ShapeMismatchError, match="linear_qkv"):
        MegatronLayout().to_hf(tensors, wrong)
    tensors.pop("output_layer.weight")
    with pytest.raises(ShapeMismatchError, match="untied"):
        MegatronLayout().to_hf(tensors, spec)


def test_qkv_fusion_groups_query_heads_with_their_kv_head():
    H, G, D, E = 4, 2, 1, 1
    q = np.arange(H * D, dtype=np.float32).reshape(H * D, E)  # heads 0..3
    k = 10 + np.arange(G * D, dtype=np.float32).reshape(G * D, E)
    v = 20 + np.arange(G * D, dtype=np.float32).reshape(G * D, E)
    fused = fuse_qkv(q, k, v, H, G, D)
    assert fused.ravel().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert all(np.array_equal(a, b) for a, b in zip(split_qkv(fused, H, G, D), (q, k, v)))


class _AttnBackend(__import__("enum").Enum):
    """Stands in for the Megatron enums Megatron-LM pickles into common.pt's args."""

    auto = 5


class _RunsCode:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_common_pt_with_foreign_classes_is_read_without_importing_or_running_them(tmp_path):
    import argparse

    it_dir = tmp_path / "iter_0000010"
    it_dir.mkdir()
    marker = tmp_path / "PWNED"
    args = argparse.Namespace(
        num_layers=2, hidden_size=64, num_attention_heads=4, group_query_attention=True, num_query_groups=2,
        kv_channels=16, ffn_hidden_size=128, params_dtype=torch.bfloat16, attention_backend=_AttnBackend.auto,
        rotary_base=500000, use_rope_scaling=True, rope_scaling_factor=8.0, swiglu=True, normalization="RMSNorm",
    )
    torch.save({"args": args, "iteration": 10, "rerun_state_machine": _RunsCode(marker)}, it_dir / "common.pt")
    common = read_megatron_common(it_dir)
    assert not marker.exists()
    assert common["iteration"] == 10 and common["args"].params_dtype == torch.bfloat16
    assert repr(common["args"].attention_backend).startswith("<opaque test_layouts_megatron._AttnBackend")
    fields = spec_fields_from_megatron_args(common["args"])
    assert (fields["num_heads"], fields["num_kv_heads"], fields["head_dim"], fields["family"]) == (4, 2, 16, "llama3.1")
    assert fields["rope_scaling"]["factor"] == 8.0 and fields["rope_theta"] == 500000.0


@pytest.mark.parametrize("damage", ["not-a-zip", "deflated-garbage"])
def test_a_damaged_common_pt_is_a_clear_error(tmp_path, damage):
    import pickle
    import zipfile

    from maxckpt.errors import CorruptCheckpointError

    it_dir = tmp_path / "iter_0000010"
    it_dir.mkdir()
    if damage == "not-a-zip":
        (it_dir / "common.pt").write_bytes(b"\x00" * 64)
    else:  # a zip whose data.pkl does not inflate (zlib.error, not a zipfile error)
        payload = pickle.dumps({"args": np.random.default_rng(0).bytes(2000)}, protocol=2)
        with zipfile.ZipFile(it_dir / "common.pt", "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("archive/data.pkl", payload)
        raw = bytearray((it_dir / "common.pt").read_bytes())
        raw[100:110] = b"\xff" * 10  # inside the compressed stream
        (it_dir / "common.pt").write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match="common.pt: not a readable torch.save file"):
        read_megatron_common(it_dir)


def test_megatron_cli_flags_describe_the_model():
    from maxckpt.layouts.base import ModelSpec
    from maxckpt.families import LLAMA3_ROPE_SCALING
    from maxckpt.formats.megatron.args import megatron_cli_flags

    llama31 = ModelSpec("llama3.1", 2, 64, 4, 2, 16, 128, 250, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING)
    flags = " ".join(megatron_cli_flags(llama31, MegatronLayout(spec="local", make_vocab_size_divisible_by=64)))
    for flag in ("--num-query-groups 2", "--kv-channels 16", "--rotary-base 500000", "--use-rope-scaling",
                 "--rope-scaling-factor 8", "--untie-embeddings-and-output-weights",
                 "--make-vocab-size-divisible-by 64", "--transformer-impl local"):
        assert flag in flags, flag
    qwen = ModelSpec("qwen3", 2, 64, 4, 4, 16, 128, 250, tie_word_embeddings=True, qk_norm=True)
    flags = megatron_cli_flags(qwen, MegatronLayout())
    assert "--qk-layernorm" in flags and "--group-query-attention" not in flags
    assert "--untie-embeddings-and-output-weights" not in flags and "--transformer-impl transformer_engine" in flags


# Layer 0 (dense) and layer 3 (MoE) of a DeepSeek-V3 GPTModel as Megatron-Core 0.16.1 itself saves it
# (local spec, `moe_layer_freq` a list, so per-layer keys): the names `dist_checkpointing.save` wrote for
# tests/test_families/test_frameworks_matrix.py's model, with 4 experts.
_DEEPSEEK_DENSE_LAYER = {
    "input_layernorm.weight", "pre_mlp_layernorm.weight",
    "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_up_proj.weight",
    "self_attention.linear_kv_down_proj.weight", "self_attention.linear_kv_up_proj.weight",
    "self_attention.q_layernorm.weight", "self_attention.kv_layernorm.weight", "self_attention.linear_proj.weight",
    "mlp.linear_fc1.weight", "mlp.linear_fc2.weight",
} | {f"{m}._extra_state/shard_0_1" for m in (
    "self_attention.linear_proj", "self_attention.linear_q_down_proj", "self_attention.linear_q_up_proj",
    "self_attention.linear_kv_down_proj", "self_attention.linear_kv_up_proj", "mlp.linear_fc1", "mlp.linear_fc2")}
_DEEPSEEK_MOE_LAYER = (
    {n for n in _DEEPSEEK_DENSE_LAYER if not n.startswith("mlp.")}
    | {"mlp.router.weight", "mlp.router.expert_bias", "mlp.experts.experts.linear_fc1.weight",
       "mlp.experts.experts.linear_fc2.weight", "mlp.shared_experts.linear_fc1.weight",
       "mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.linear_fc1._extra_state/shard_0_1",
       "mlp.shared_experts.linear_fc2._extra_state/shard_0_1"}
    | {f"mlp.experts.experts.linear_fc{j}._extra_state/shard_{e}_4" for j in (1, 2) for e in range(4)}
)

# The same layers under the Transformer-Engine spec (megatron-core 0.16.1's
# get_gpt_layer_with_transformer_engine_spec(multi_latent_attention=True, qk_layernorm=True)):
# input_layernorm is a TENorm; q/kv norms live in the up projections (TELayerNormColumnParallelLinear); a
# dense layer's pre-MLP norm is fused into linear_fc1, a MoE layer keeps its TENorm; every TE module and
# TENorm saves an _extra_state (TEDotProductAttention's is asked for by earlier releases).
_DEEPSEEK_TE_DENSE_LAYER = {
    "input_layernorm.weight",
    "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_up_proj.weight",
    "self_attention.linear_q_up_proj.layer_norm_weight", "self_attention.linear_kv_down_proj.weight",
    "self_attention.linear_kv_up_proj.weight", "self_attention.linear_kv_up_proj.layer_norm_weight",
    "self_attention.linear_proj.weight", "mlp.linear_fc1.weight", "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc2.weight",
} | {f"{m}._extra_state/shard_0_1" for m in (
    "input_layernorm", "self_attention.linear_proj", "self_attention.linear_q_down_proj", "self_attention.linear_q_up_proj",
    "self_attention.linear_kv_down_proj", "self_attention.linear_kv_up_proj", "self_attention.core_attention",
    "mlp.linear_fc1", "mlp.linear_fc2")}
_DEEPSEEK_TE_MOE_LAYER = (
    {n for n in _DEEPSEEK_TE_DENSE_LAYER if not n.startswith("mlp.")}
    | {"pre_mlp_layernorm.weight", "pre_mlp_layernorm._extra_state/shard_0_1"}
    | {n for n in _DEEPSEEK_MOE_LAYER if n.startswith("mlp.")}
)


def _deepseek(maxtext_fixtures):
    from maxckpt.conversion import open_checkpoint

    src = maxtext_fixtures / "deepseek3_scan" / "checkpoints" / "5" / "items"
    ckpt = open_checkpoint(src, model="deepseek3-671b", overrides={"num_experts_per_tok": 2})
    return ckpt, ckpt.spec


@pytest.mark.parametrize("megatron_spec", ["local", "te"])
def test_deepseek3_keys_shapes_args_and_flags_are_megatron_cores(maxtext_fixtures, tmp_path, megatron_spec):
    from maxckpt.formats.megatron.args import megatron_args, megatron_cli_flags
    from maxckpt.formats.megatron.support import check_supported_args

    ckpt, spec = _deepseek(maxtext_fixtures)
    layout = MegatronLayout(spec=megatron_spec)
    te = megatron_spec == "te"
    with ckpt:
        mega = layout.from_hf(ckpt.hf_tensors(None), spec)
        names = set(mega) | set(layout.extra_state(spec))
        dense, moe = (_DEEPSEEK_TE_DENSE_LAYER, _DEEPSEEK_TE_MOE_LAYER) if te else (_DEEPSEEK_DENSE_LAYER, _DEEPSEEK_MOE_LAYER)
        for i, want in ((0, dense), (3, moe)):
            assert {n[len(f"decoder.layers.{i}."):] for n in names if n.startswith(f"decoder.layers.{i}.")} == want
        assert not any(n.startswith("decoder.layers.self_attention") for n in names)  # nothing stacked
        assert ("decoder.final_layernorm._extra_state/shard_0_1" in names) == te
        X, M, E = spec.num_experts, spec.moe_mlp_dim, spec.emb_dim
        assert mega["decoder.layers.3.mlp.experts.experts.linear_fc1.weight"].shape == (X, 2 * M, E)
        assert len(mega["decoder.layers.3.mlp.experts.experts.linear_fc1.weight"].pieces) == X  # one expert a piece
        assert mega["decoder.layers.3.mlp.shared_experts.linear_fc1.weight"].shape == (2 * M * spec.num_shared_experts, E)
        H = spec.num_heads
        assert mega["decoder.layers.0.self_attention.linear_kv_up_proj.weight"].shape == (
            H * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank)
        # Megatron names -> HF names again, same tensors.
        back = layout.to_hf(mega, spec)
        hf = ckpt.hf_tensors(None)
        assert set(back) == set(hf)
        for n in ("model.layers.3.mlp.experts.2.up_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                  "model.layers.4.mlp.gate.e_score_correction_bias", "model.layers.1.self_attn.q_b_proj.weight"):
            assert np.array_equal(back[n].read(), hf[n].read()), n

    args = megatron_args(spec, layout)
    check_supported_args(args)
    fields = spec_fields_from_megatron_args(args)
    for key in ("family", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "num_experts", "num_experts_per_tok", "moe_mlp_dim", "num_shared_experts", "first_dense_layers",
                "routing", "routed_scaling_factor", "rope_scaling", "mlp_dim", "qk_norm"):
        assert fields[key] == getattr(spec, key), key
    flags = " ".join(megatron_cli_flags(spec, layout))
    for flag in ("--multi-latent-attention", f"--q-lora-rank {spec.q_lora_rank}", f"--qk-head-dim {spec.qk_nope_head_dim}",
                 f"--qk-pos-emb-head-dim {spec.qk_rope_head_dim}", f"--v-head-dim {spec.v_head_dim}", "--rope-type yarn",
                 "--rotary-scaling-factor 40", "--moe-layer-freq '([0]*3+[1]*2)'", "--moe-router-score-function sigmoid",
                 "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor 2.5",
                 f"--moe-shared-expert-intermediate-size {spec.moe_mlp_dim}", f"--kv-channels {spec.v_head_dim}"):
        assert flag in flags, flag
    impl = "transformer_engine" if te else "local"
    assert f"--transformer-impl {impl}" in flags and ("--moe-grouped-gemm" in flags) == te
    assert args.moe_grouped_gemm == te and args.transformer_impl == impl


def test_deepseek3_dims_from_megatron_shapes_alone(maxtext_fixtures):
    """A checkpoint Megatron-Core saved itself has no args: the shapes tell every MLA and MoE width."""
    from maxckpt.tensors import TensorInfo

    ckpt, spec = _deepseek(maxtext_fixtures)
    layout = MegatronLayout(spec="local")
    with ckpt:
        infos = {n: TensorInfo(n, t.shape, t.dtype) for n, t in layout.from_hf(ckpt.hf_tensors(None), spec).items()}
    dims = layout.infer_dims(infos)
    assert dims.pop("_family") == "deepseek3"
    for key in ("num_layers", "emb_dim", "num_heads", "mlp_dim", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "num_experts", "moe_mlp_dim", "num_shared_experts", "first_dense_layers"):
        assert dims[key] == getattr(spec, key), key


def test_deepseek3_refusals_name_what_is_wrong(maxtext_fixtures):
    from dataclasses import replace

    from maxckpt.errors import UnsupportedModelError

    ckpt, spec = _deepseek(maxtext_fixtures)
    with ckpt:
        hf = ckpt.hf_tensors(None)
        odd = replace(spec, rope_scaling={**spec.rope_scaling, "beta_fast": 16.0})
        for megatron_spec in ("te", "local"):
            with pytest.raises(UnsupportedModelError, match="beta_fast=16.0.*fixes it at 32"):
                MegatronLayout(spec=megatron_spec).from_hf(hf, odd)


def test_gpt_oss_keys_args_flags_and_dims(maxtext_fixtures):
    """gpt-oss in Megatron's stacked names (biases, sinks), its args read back to the same spec, its flags,
    and the dims Megatron's shapes alone tell."""
    from maxckpt.conversion import open_checkpoint
    from maxckpt.formats.megatron.args import megatron_args, megatron_cli_flags
    from maxckpt.formats.megatron.support import check_supported_args
    from maxckpt.tensors import TensorInfo

    src = maxtext_fixtures / "gpt_oss_scan" / "checkpoints" / "5" / "items"
    layout = MegatronLayout(spec="local")
    with open_checkpoint(src, model="gpt-oss-20b", overrides={"num_experts_per_tok": 2}) as ckpt:
        spec = ckpt.spec
        hf = ckpt.hf_tensors(None)
        mega = layout.from_hf(hf, spec)
        L, X, M, E, H = spec.num_layers, spec.num_experts, spec.moe_mlp_dim, spec.emb_dim, spec.num_heads
        want = {  # what Megatron-Core 0.16.1's GPTModel saved for this configuration
            "decoder.layers.self_attention.core_attention.softmax_offset": (L, H),
            "decoder.layers.self_attention.linear_qkv.bias": (L, (H + 2 * spec.num_kv_heads) * spec.head_dim),
            "decoder.layers.self_attention.linear_proj.bias": (L, E),
            "decoder.layers.mlp.router.bias": (L, X),
            "decoder.layers.mlp.experts.experts.linear_fc1.weight": (L, X, 2 * M, E),
            "decoder.layers.mlp.experts.experts.linear_fc1.bias": (L, X, 2 * M),
            "decoder.layers.mlp.experts.experts.linear_fc2.bias": (L, X, E),
        }
        for name, shape in want.items():
            assert mega[name].shape == shape, name
        # HF's interleaved gate/up columns become Megatron's [gate; up] rows.
        gu = hf["model.layers.1.mlp.experts.gate_up_proj"].read()[2]  # expert 2: [E, 2M]
        fc1 = mega["decoder.layers.mlp.experts.experts.linear_fc1.weight"].read((1, 2))
        assert np.array_equal(fc1[:M], gu[:, 0::2].T) and np.array_equal(fc1[M:], gu[:, 1::2].T)
        back = layout.to_hf(mega, spec)
        assert set(back) == set(hf)
        for n in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.gate_up_proj_bias",
                  "model.layers.0.self_attn.k_proj.bias", "model.layers.3.self_attn.sinks", "model.layers.2.mlp.router.bias"):
            assert np.array_equal(back[n].read(), hf[n].read()), n
        infos = {n: TensorInfo(n, t.shape, t.dtype) for n, t in mega.items()}

    args = megatron_args(spec, layout)
    check_supported_args(args)
    assert args.window_size == (127, 0) and args.window_attn_skip_freq == 2  # HF's 128 keys = Megatron's 127 + itself
    fields = spec_fields_from_megatron_args(args)
    for key in ("family", "attention_sinks", "attention_bias", "router_bias", "expert_bias", "num_experts",
                "moe_mlp_dim", "sliding_window", "sliding_window_pattern", "rope_scaling", "head_dim", "num_kv_heads"):
        assert fields[key] == getattr(spec, key), key
    flags = " ".join(megatron_cli_flags(spec, layout))
    for flag in ("--quick-geglu", "--glu-linear-offset 1", "--activation-func-clamp-value 7", "--softmax-type learnable",
                 "--add-qkv-bias", "--window-size 127,0", "--window-attn-skip-freq 2", "--position-embedding-type yarn",
                 "--yarn-rotary-scaling-factor 32", "--no-yarn-correction-range-round-to-int"):
        assert flag in flags, flag
    assert "--disable-bias-linear" not in flags and "--swiglu" not in flags
    dims = layout.infer_dims(infos)
    assert dims["_family"] == "gpt-oss" and dims["num_heads"] == H and dims["num_experts"] == X
    assert dims["attention_bias"] and dims["router_bias"] and dims["expert_bias"]


def test_runs_outside_the_mapped_deepseek3_and_gpt_oss_are_refused_by_their_args(maxtext_fixtures):
    from maxckpt.conversion import open_checkpoint
    from maxckpt.errors import UnsupportedModelError
    from maxckpt.formats.megatron.args import megatron_args
    from maxckpt.formats.megatron.support import check_supported_args

    layout = MegatronLayout(spec="local")
    root = maxtext_fixtures / "{}" / "checkpoints" / "5" / "items"
    with open_checkpoint(str(root).format("deepseek3_scan"), model="deepseek3-671b", overrides={"num_experts_per_tok": 2}) as c:
        deepseek = vars(megatron_args(c.spec, layout))
    with open_checkpoint(str(root).format("gpt_oss_scan"), model="gpt-oss-20b", overrides={"num_experts_per_tok": 2}) as c:
        oss = vars(megatron_args(c.spec, layout))
    # Group-limited routing is mapped (HF n_group / topk_group) where Megatron scores groups as DeepSeek does:
    from maxckpt.formats.megatron.args import spec_fields_from_megatron_args

    grouped = {**deepseek, "moe_router_num_groups": 2, "moe_router_group_topk": 1}
    check_supported_args(grouped)
    assert {k: spec_fields_from_megatron_args(grouped)[k] for k in ("n_group", "topk_group")} == {"n_group": 2, "topk_group": 1}
    with pytest.raises(UnsupportedModelError, match="moe_router_num_groups=8, moe_router_group_topk=4 and moe_router_topk=2"):
        spec_fields_from_megatron_args({**deepseek, "moe_router_num_groups": 8, "moe_router_group_topk": 4})
    for args, key, value, match in (
        (deepseek, "moe_router_score_function", "softmax", "softmax routing after the top-k"),
        (deepseek, "moe_router_score_function", "sqrtsoftplus", "moe_router_score_function='sqrtsoftplus'"),
        (oss, "activation_func_clamp_value", 10.0, "activation_func_clamp_value=10.0"),
        (oss, "window_size", (127, 4), "right 0"),
    ):
        with pytest.raises(UnsupportedModelError, match=match):
            check_supported_args({**args, key: value})
    # DeepSeek-V2's MLA without a query LoRA and its top-k of the softmax over every expert are mapped (deepseek2)
    v2 = {**deepseek, "q_lora_rank": None, "moe_router_score_function": "softmax", "moe_router_pre_softmax": True,
          "moe_router_enable_expert_bias": False}
    check_supported_args(v2)
    fields = spec_fields_from_megatron_args(v2)
    assert (fields["family"], fields["q_lora_rank"], fields["routing"], fields["norm_topk_prob"]) == (
        "deepseek2", 0, "softmax_greedy", False)


def test_deepseek3_reads_the_te_specs_fused_norm_names(maxtext_fixtures):
    """Megatron-Core's TE spec for MLA fuses q/kv layernorms into linear_q_up_proj / linear_kv_up_proj and the
    dense layers' pre-MLP norm into linear_fc1 (gpt_layer_specs.py, 0.16.1): the same HF tensors come out."""
    ckpt, spec = _deepseek(maxtext_fixtures)
    layout = MegatronLayout(spec="local")
    renames = {
        "self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
        "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight",
    }
    with ckpt:
        hf = ckpt.hf_tensors(None)
        te = {}
        for name, t in layout.from_hf(hf, spec).items():
            i = int(name.split(".")[2]) if name.startswith("decoder.layers.") else None
            suffix = name.split(".", 3)[3] if i is not None else ""
            if suffix in renames:
                name = f"decoder.layers.{i}.{renames[suffix]}"
            elif suffix == "pre_mlp_layernorm.weight" and i < spec.first_dense_layers:
                name = f"decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight"
            te[name] = t
        back = layout.to_hf(te, spec)
        for n in ("model.layers.0.self_attn.q_a_layernorm.weight", "model.layers.4.self_attn.kv_a_layernorm.weight",
                  "model.layers.1.post_attention_layernorm.weight", "model.layers.3.post_attention_layernorm.weight"):
            assert np.array_equal(back[n].read(), hf[n].read()), n


@pytest.mark.parametrize("name,model", [("mixtral_moe_scan", "mixtral-8x7b"), ("qwen3_moe_scan", "qwen3-30b-a3b"),
                                        ("gpt_oss_scan", "gpt-oss-20b")])
def test_moe_under_the_te_spec_keeps_its_pre_mlp_norm_and_reads_back_bit_exactly(maxtext_fixtures, name, model):
    """The TE spec's MoE layer (megatron-core 0.16.1): `pre_mlp_layernorm` is its own TENorm (the local spec's
    key map writes it as mlp.linear_fc1.layer_norm_weight), the input norm stays fused in linear_qkv; the
    TENorms' and TEDotProductAttention's _extra_state are added; the experts' keys are the local spec's."""
    from maxckpt.conversion import open_checkpoint
    from maxckpt.formats.megatron.args import megatron_args, megatron_cli_flags

    te, local = MegatronLayout(spec="te"), MegatronLayout(spec="local")
    with open_checkpoint(maxtext_fixtures / name / "checkpoints" / "5" / "items", model=model,
                         overrides={"num_experts_per_tok": 2}) as ckpt:
        spec, hf = ckpt.spec, ckpt.hf_tensors(None)
        ours, theirs = te.from_hf(hf, spec), local.from_hf(hf, spec)
        assert set(ours) - set(theirs) == {"decoder.layers.pre_mlp_layernorm.weight"}
        assert set(theirs) - set(ours) == {"decoder.layers.mlp.linear_fc1.layer_norm_weight"}
        assert "decoder.layers.self_attention.linear_qkv.layer_norm_weight" in ours
        L = spec.num_layers
        modules = {"self_attention.core_attention", "pre_mlp_layernorm"}
        modules |= {"self_attention.q_layernorm", "self_attention.k_layernorm"} if spec.qk_norm else set()
        te_extra, local_extra = set(te.extra_state(spec)), set(local.extra_state(spec))
        assert local_extra < te_extra
        assert te_extra - local_extra == {f"decoder.layers.{m}._extra_state/shard_{i}_{L}" for m in modules for i in range(L)} | {
            "decoder.final_layernorm._extra_state/shard_0_1"}
        for layout, mega in ((te, ours), (local, theirs)):  # either spec's names read back, bit for bit
            back = layout.to_hf(mega, spec)
            assert set(back) == set(hf)
            for n in hf:
                assert np.array_equal(back[n].read(), hf[n].read()), n
        assert MegatronLayout(spec="local").to_hf(ours, spec).keys() == hf.keys()  # reading needs no spec
    for layout, impl in ((te, "transformer_engine"), (local, "local")):
        flags = megatron_cli_flags(spec, layout)
        assert f"--transformer-impl {impl}" in flags and ("--moe-grouped-gemm" in flags) == (layout is te)
        assert megatron_args(spec, layout).moe_grouped_gemm == (layout is te)
