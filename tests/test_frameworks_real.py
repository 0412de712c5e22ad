"""The converted checkpoints in the real frameworks: Megatron-Core and TorchTitan models on CPU.

Marker `frameworks`; these tests never skip. megatron-core 0.16.1 comes from
the `megatron` extra (`pip install -e '.[all]'`, Python 3.11); TorchTitan 0.3.0
is installed by the tests themselves on first use (the `torchtitan` fixture,
tests/torchtitan_env.py: requirements/torchtitan-cpu.txt with --no-deps into
.cache/torchtitan, beside torch 2.13.0). A framework that cannot be imported
or installed fails the test with the reason; see docs/pytorch_bridges.md.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_reference import hf_arrays, hf_logits, lazy, lazy_from_reader, spec_of, tiny_hf_model, write_all

from maxckpt.conversion.options import SourceOptions
from maxckpt.containers.dcp import DcpReader, DcpWriter

pytestmark = [pytest.mark.frameworks, pytest.mark.slow, pytest.mark.filterwarnings("ignore")]


@pytest.fixture
def megatron(tmp_path, monkeypatch):
    """Megatron-Core on CPU: a gloo process group of one rank, TP = PP = 1 (fails, never skips, without it)."""
    try:
        import megatron.core as core
    except ImportError as exc:
        pytest.fail(
            f"megatron-core does not import ({exc}): the `megatron` extra of `pip install -e '.[all]'` installs "
            "megatron-core 0.16.x on Python 3.11 (the release these tests are written for)", pytrace=False,
        )
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    # Megatron asks CUDA for the current device even on CPU-only paths.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(0, inference_rng_tracker=True)
        yield core
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def _te_structured_specs(monkeypatch):
    """Megatron-Core's own TE layer specs (`get_gpt_layer_with_transformer_engine_spec`, the TE path of
    `get_gpt_decoder_block_spec`), built on CPU: TESpecProvider's modules become local modules carrying what
    the TE ones name and save - TENorm (te.pytorch.RMSNorm, in TE 2 a fusible op) a `weight` and an
    `_extra_state`, TELayerNormColumnParallelLinear its norm as `layer_norm_weight` - so the sharded keys
    of the model are those of the TE spec's module tree, without a key map. Returns gpt_layer_specs."""
    import megatron.core.models.gpt.gpt_layer_specs as specs
    import megatron.core.transformer.transformer_block as block
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP

    def rms(x, weight, eps):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)

    class TENorm(torch.nn.Module):
        def __init__(self, config, hidden_size, eps=1e-5):
            super().__init__()
            self.weight, self.eps = torch.nn.Parameter(torch.ones(hidden_size)), eps

        def forward(self, x):
            return rms(x, self.weight, self.eps)

        def get_extra_state(self):
            return None

        def set_extra_state(self, state):
            assert state is None

    class TELayerNormColumnParallelLinear(ColumnParallelLinear):
        def __init__(self, input_size, output_size, *, config, **kwargs):
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size))

        def forward(self, x, *args, **kwargs):
            return super().forward(rms(x, self.layer_norm_weight, self.config.layernorm_epsilon), *args, **kwargs)

    class TESpecProvider:  # megatron/core/extensions/transformer_engine_spec_provider.py, module for module
        def linear(self):
            return ColumnParallelLinear  # TELinear's place (MLA's down projections)

        def column_parallel_linear(self):
            return ColumnParallelLinear

        def row_parallel_linear(self):
            return RowParallelLinear

        def fuse_layernorm_and_linear(self):
            return True

        def column_parallel_layer_norm_linear(self):
            return TELayerNormColumnParallelLinear

        def layer_norm(self, rms_norm=False, for_qk=False):
            return TENorm

        def core_attention(self):
            return DotProductAttention

        def grouped_mlp_modules(self, moe_use_grouped_gemm, moe_use_legacy_grouped_gemm):
            return SequentialMLP, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)

        def activation_func(self):
            return None

    monkeypatch.setattr(specs, "TESpecProvider", TESpecProvider, raising=False)
    monkeypatch.setattr(specs, "TENorm", TENorm, raising=False)
    monkeypatch.setattr(block, "LayerNormImpl", TENorm)  # the final norm of a block built from one layer spec
    return specs


def _megatron_model(spec, layout, te_structured=None):
    """The local-spec GPTModel, or (te_structured: `_te_structured_specs`) the TE spec's module tree."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=spec.num_layers, hidden_size=spec.emb_dim, num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads, kv_channels=spec.head_dim, ffn_hidden_size=spec.mlp_dim,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps, add_bias_linear=False, qk_layernorm=spec.qk_norm,
        use_cpu_initialization=True, params_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False,
    )
    return GPTModel(
        cfg, te_structured.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_norm) if te_structured
        else get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=spec.qk_norm),
        vocab_size=layout.padded_vocab_size(spec.vocab_size), max_sequence_length=64,
        position_embedding_type="rope", rotary_base=int(spec.rope_theta),
        rope_scaling=bool(spec.rope_scaling), rope_scaling_factor=float((spec.rope_scaling or {}).get("factor", 8.0)),
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
    ).eval()


def _megatron_logits(model, tokens):
    s = len(tokens)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)  # True = masked
    with torch.no_grad():
        return model(torch.tensor([tokens]), torch.arange(s)[None], mask)[0]


def _maxtext_run(tmp_path, family, *, tied=False, vocab=250):
    """A tiny random MaxText run (GQA: 4 query heads, 2 groups) saved by Orbax, and its JAX reference logits."""
    from conversion_models import TOKENS, random_maxtext_params, save_maxtext_run, tiny_spec

    from maxckpt.reference import forward

    spec = tiny_spec(family, tied=tied, vocab=vocab)
    params = random_maxtext_params(spec)
    run = save_maxtext_run(tmp_path / "run", params, step=6).parent
    return run, spec, forward(params, spec, TOKENS)[0], TOKENS[0]


@pytest.mark.parametrize("family,tied", [("llama", False), ("llama", True), ("qwen3", False)])
def test_megatron_core_loads_the_conversion_and_matches_transformers_logits(megatron, tmp_path, family, tied):
    from megatron.core import dist_checkpointing

    from maxckpt.formats.megatron.files import find_megatron_checkpoint, write_megatron_sidecars
    from maxckpt.formats.megatron.layout import MegatronLayout

    hf = tiny_hf_model(family, tied=tied, head_dim=32 if family == "qwen3" else 16)
    spec = spec_of(hf)
    layout = MegatronLayout(spec="local")
    root = tmp_path / "mega"
    with DcpWriter(root / "iter_0000001") as w:
        write_all(w, layout.from_hf(lazy(hf_arrays(hf)), spec))
        for name, obj in layout.extra_state(spec).items():
            w.write_object(name, obj)
    write_megatron_sidecars(root, spec, layout, iteration=1)

    model = _megatron_model(spec, layout)
    ckpt_dir, _ = find_megatron_checkpoint(root)
    assert dist_checkpointing.check_is_distributed_checkpoint(str(ckpt_dir))
    # As Megatron-LM's load_checkpoint does: model keys under "model", default strictness.
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt_dir))
    assert state["checkpoint_version"] == 3.0 and state["iteration"] == 1  # common.pt merged in
    model.load_state_dict(state["model"], strict=True)

    logits = _megatron_logits(model, [1, 5, 9, 13, 17, 21, 25, 29])
    assert (logits[:, : spec.vocab_size] - hf_logits(hf)).abs().max().item() < 1e-4


@pytest.mark.parametrize("family,megatron_spec", [("llama3.1", "local"), ("qwen3", "te")])
def test_megatron_core_loads_what_maxckpt_convert_writes_from_a_maxtext_run(megatron, tmp_path, capsys, monkeypatch, family, megatron_spec):
    """`maxckpt convert RUN DST --to megatron` as a user runs it, then Megatron-LM's load path on CPU.

    The TE spec's checkpoint only adds `core_attention._extra_state` items; the
    local-spec model used here must accept them as unexpected keys.
    """
    from megatron.core import dist_checkpointing

    from maxckpt.cli.main import main
    from maxckpt.formats.megatron.files import find_megatron_checkpoint
    from maxckpt.formats.megatron.layout import MegatronLayout

    run, spec, expected, tokens = _maxtext_run(tmp_path, family, tied=family == "qwen3")
    with pytest.raises(SystemExit) as info:
        main(["convert", str(run), str(tmp_path / "mega"), "--to", "megatron", "--model", family,
              "--megatron-spec", megatron_spec, "-q"])
    assert info.value.code in (0, None), capsys.readouterr().err
    ckpt_dir, iteration = find_megatron_checkpoint(tmp_path / "mega")
    assert iteration == 7  # MaxText checkpoint 6 holds step 7
    model = _megatron_model(spec, MegatronLayout(spec="local"))
    strict = "assume_ok_unexpected" if megatron_spec == "te" else "raise_all"
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt_dir), strict=strict)
    assert state["iteration"] == 7 and state["args"].padded_vocab_size == 256
    model.load_state_dict(state["model"], strict=True)
    logits = _megatron_logits(model, tokens)[:, : spec.vocab_size].numpy()
    assert np.abs(logits - expected).max() < 1e-4  # Megatron-Core vs maxckpt's JAX reference of MaxText
    if megatron_spec == "te":  # the TE spec's own module tree (CPU stand-ins): every _extra_state it asks for is there
        from megatron.core.dist_checkpointing import ShardedObject

        te_model = _megatron_model(spec, MegatronLayout(spec="te"), _te_structured_specs(monkeypatch))
        sd = te_model.sharded_state_dict()
        assert "decoder.final_layernorm._extra_state/shard_0_1" in {v.unique_key for v in sd.values() if isinstance(v, ShardedObject)}
        state = dist_checkpointing.load({"model": sd}, str(ckpt_dir), strict="raise_unexpected")
        te_model.load_state_dict(state["model"], strict=True)
        assert np.abs(_megatron_logits(te_model, tokens)[:, : spec.vocab_size].numpy() - expected).max() < 1e-4


def test_megatron_without_extra_state_needs_relaxed_strictness(megatron, tmp_path):
    from megatron.core import dist_checkpointing

    from maxckpt.formats.megatron.files import write_megatron_sidecars
    from maxckpt.formats.megatron.layout import MegatronLayout

    hf = tiny_hf_model("llama")
    spec = spec_of(hf)
    layout = MegatronLayout(spec="local")
    it_dir = tmp_path / "mega" / "iter_0000001"
    with DcpWriter(it_dir) as w:
        write_all(w, layout.from_hf(lazy(hf_arrays(hf)), spec))
    write_megatron_sidecars(tmp_path / "mega", spec, layout, iteration=1)
    model = _megatron_model(spec, layout)
    with pytest.raises(BaseException, match="_extra_state"):  # DCP's CheckpointException is a BaseException
        dist_checkpointing.load({"model": model.sharded_state_dict()}, str(it_dir))
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(it_dir), strict="log_unexpected")
    model.load_state_dict(state["model"], strict=True)


def test_maxckpt_reads_what_megatron_core_saves(megatron, tmp_path):
    """The reverse direction on a checkpoint Megatron itself wrote (stacked and per-layer keys)."""
    from megatron.core import dist_checkpointing

    from maxckpt.layouts.base import ModelSpec
    from maxckpt.formats.megatron.layout import MegatronLayout

    spec = ModelSpec(family="llama3", num_layers=2, emb_dim=64, num_heads=4, num_kv_heads=2, head_dim=16,
                     mlp_dim=128, vocab_size=256)
    layout = MegatronLayout(spec="local")
    model = _megatron_model(spec, layout)
    sd = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    for singleton in (False, True):
        out = tmp_path / f"saved_{singleton}"
        out.mkdir()
        # Megatron's save path calls torch.cuda.synchronize, which CPU-only torch lacks.
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
            dist_checkpointing.save(model.sharded_state_dict(metadata={"singleton_local_shards": singleton}), str(out))
        reader = DcpReader(out)
        assert any(k.startswith("decoder.layers.0.") for k in reader.tensors()) == singleton
        hf = layout.to_hf(lazy_from_reader(reader), spec)
        for i in range(spec.num_layers):
            qkv = sd[f"decoder.layers.{i}.self_attention.linear_qkv.weight"].numpy()
            got = np.concatenate([
                hf[f"model.layers.{i}.self_attn.{p}_proj.weight"].read().reshape(2, -1, 64) for p in "qkv"
            ], axis=1)  # regroup per kv head: [q of g; k_g; v_g]
            assert np.array_equal(got.reshape(qkv.shape), qkv)
            fc1 = sd[f"decoder.layers.{i}.mlp.linear_fc1.weight"].numpy()
            assert np.array_equal(hf[f"model.layers.{i}.mlp.gate_proj.weight"].read(), fc1[:128])
            assert np.array_equal(hf[f"model.layers.{i}.mlp.up_proj.weight"].read(), fc1[128:])
            assert np.array_equal(
                hf[f"model.layers.{i}.input_layernorm.weight"].read(),
                sd[f"decoder.layers.{i}.input_layernorm.weight"].numpy(),
            )
        # The same directory through `maxckpt convert`: Megatron's own save states no head counts, so one flag does.
        from maxckpt.containers.safetensors import SafetensorsReader
        from maxckpt.conversion import convert

        report = convert(out, tmp_path / f"hf_{singleton}", to="hf", model="llama3", source=SourceOptions(overrides={"head_dim": 16}))
        assert report.source_format == "megatron" and (report.spec.num_heads, report.spec.num_kv_heads) == (4, 2)
        converted = SafetensorsReader(tmp_path / f"hf_{singleton}")
        for name in converted.tensors():
            assert np.array_equal(converted.read(name), hf[name].read()), name


@pytest.mark.parametrize("tied", [False, True])
def test_torchtitan_llama3_loads_the_conversion_and_matches_transformers_logits(torchtitan, tmp_path, tied):
    from maxckpt.formats.torchtitan.files import step_dir_name, write_train_state
    from maxckpt.formats.torchtitan.layout import TorchTitanLayout

    hf = tiny_hf_model("llama", tied=tied)
    spec = spec_of(hf)
    step = tmp_path / "checkpoint" / step_dir_name(3)
    with DcpWriter(step) as w:
        write_all(w, TorchTitanLayout().from_hf(lazy(hf_arrays(hf)), spec))
        write_train_state(w, 3)

    tokens = [(7 * i + 1) % spec.vocab_size for i in range(128)]
    logits = _torchtitan_logits(spec, step, tokens, tied=tied)
    assert (logits - hf_logits(hf, tokens)).abs().max().item() < 1e-4


def _torchtitan_logits(spec, step_dir, tokens, *, tied):
    """Build TorchTitan 0.3.0's Llama3Model for `spec`, load `step_dir` model-only as TorchTitan does, run it."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    dim, vocab = spec.emb_dim, spec.vocab_size
    scaling = dict(spec.rope_scaling or {})
    rope = ComplexRoPE.Config(
        dim=spec.head_dim, max_seq_len=256, theta=spec.rope_theta,
        **({"scaling": "llama", "scaling_factor": scaling["factor"], "low_freq_factor": scaling["low_freq_factor"],
            "high_freq_factor": scaling["high_freq_factor"],
            "original_max_position_embeddings": scaling["original_max_position_embeddings"]} if scaling else {}),
    )
    cfg = Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim, eps=spec.rms_norm_eps),
        lm_head=Linear.Config(in_features=dim, out_features=vocab),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=spec.num_layers, dim=dim, n_heads=spec.num_heads,
            n_kv_heads=spec.num_kv_heads, hidden_dim=spec.mlp_dim, attn_backend="flex", rope=rope,
        ),
    )
    model = cfg.build()
    model.init_weights(buffer_device=torch.device("cpu"))  # the RoPE cache is a non-persistent buffer
    # TorchTitan's model-only load (initial_load_model_only): dcp.load into ModelWrapper's state dict.
    wrapper = ModelWrapper(model)
    state = wrapper.state_dict()
    dcp.load(state, checkpoint_id=str(step_dir))
    wrapper.load_state_dict(state)
    model.eval()
    # FlexAttention's eager CPU path needs a full 128-token block: shorter inputs give garbage.
    assert len(tokens) == 128
    pos = torch.arange(len(tokens))[None]
    with torch.no_grad():
        return model(torch.tensor([tokens]), pos, model.get_attention_masks(pos))[0]


def test_torchtitan_loads_what_maxckpt_convert_writes_from_a_maxtext_run(torchtitan, tmp_path, capsys):
    """`maxckpt convert RUN DST --to torchtitan` for a llama3.1 run (interleaved rotary, llama rope scaling)."""
    import dataclasses

    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    from maxckpt.cli.main import main
    from maxckpt.reference import forward

    # TorchTitan's Llama 3 builder takes head_dim = dim / n_heads (64 / 4 = 16), as in real Llama models.
    spec = dataclasses.replace(tiny_spec("llama3.1", vocab=250), emb_dim=64)
    params = random_maxtext_params(spec)
    run = save_maxtext_run(tmp_path / "run", params, step=6).parent
    with pytest.raises(SystemExit) as info:
        main(["convert", str(run), str(tmp_path / "titan"), "--to", "torchtitan", "--model", "llama3.1-8b", "-q"])
    assert info.value.code in (0, None), capsys.readouterr().err
    step_dir = tmp_path / "titan" / "step-7"  # MaxText checkpoint 6 holds step 7
    tokens = [(7 * i + 1) % spec.vocab_size for i in range(128)]
    logits = _torchtitan_logits(spec, step_dir, tokens, tied=False).numpy()
    expected = forward(params, spec, [tokens])[0]
    assert np.abs(logits - expected).max() < 1e-4  # TorchTitan vs maxckpt's JAX reference of MaxText
