"""The support matrix as tests: every family x framework pair the registry allows, in each direction.

The parameters come from the family registry (`FAMILIES`, each family's `bridges`, `bridge_gap`), so the
support matrix is the test list: `family-target[-spec]-direction`, for each family that reaches
Megatron-Core (layer spec `te` and `local`) or TorchTitan:

- `to`: a MaxText run -> `maxckpt convert --to <target>` -> the framework's own model on CPU, loaded as its
  training loop loads it (strictly; every tensor of the checkpoint asked for) -> its logits are
  transformers' on the HF export of the same run, and MaxText's where maxckpt knows them (its JAX
  reference of a tiny run, or the fixture's own forward). The HF export converts to the same framework
  tensors, and the framework checkpoint converts back to exactly the HF tensors MaxText's gives.
- `from`: the framework's own save of its model (random weights, norms and biases moved off their
  initial values) -> `maxckpt convert --to hf` -> transformers computes the framework's logits, each
  tensor is where transformers expects it, and HF -> framework gives back the framework's own tensors,
  bit for bit.
- every pair the registry rules out (`bridge_gap`): convert refuses it, in either direction, with the
  registry's reason, and writes nothing.

The per-family models, sources and checks are tests/frameworks/ (`FAMILY_MODELS`). Combinations the
matrix does not spell per family are the explicit extra cases at the end: the other embedding tying
(tied llama3, untied qwen3) and a Megatron checkpoint without `_extra_state` items.

Marker `frameworks`; these tests never skip. megatron-core 0.16.1 comes from the `megatron` extra
(`pip install -e '.[all]'`, Python 3.11); TorchTitan 0.3.0 is installed by the tests themselves on first
use (the `torchtitan` fixture, tests/torchtitan_env.py). A framework that cannot be imported or installed
fails the test with the reason; see docs/pytorch_bridges.md.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from frameworks import megatron as mc
from frameworks import torchtitan as tt
from frameworks.models import FAMILY_MODELS, megatron_tokens, source, torchtitan_tokens

from maxckpt.containers.dcp import DcpReader
from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.options import SourceOptions
from maxckpt.errors import UnsupportedModelError
from maxckpt.formats import MegatronOptions
from maxckpt.families import FAMILIES, bridge_gap

pytestmark = [pytest.mark.frameworks, pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

TARGETS = {"megatron": ("te", "local"), "torchtitan": (None,)}
DIRECTIONS = ("to", "from")


def _case_id(*parts):
    return "-".join(p for p in parts if p)


SUPPORTED = [
    pytest.param(family, target, spec, direction, id=_case_id(family, target, spec, direction))
    for family in FAMILIES for target, specs in TARGETS.items() if bridge_gap(target, family) is None
    for spec in specs for direction in DIRECTIONS
]
REFUSED = [
    pytest.param(family, target, direction, id=_case_id(family, target, direction))
    for family in FAMILIES for target in TARGETS if bridge_gap(target, family) is not None
    for direction in DIRECTIONS
]


@pytest.fixture
def megatron_core(tmp_path, monkeypatch):
    """Megatron-Core on CPU: a gloo process group of one rank (tests/frameworks/megatron.py)."""
    with mc.megatron_core(tmp_path, monkeypatch) as core:
        yield core


def test_every_family_a_framework_reaches_has_its_models():
    """A family added to the registry with a framework in its bridges needs its models in tests/frameworks."""
    for family in FAMILIES:
        for target in TARGETS:
            if bridge_gap(target, family) is None:
                entry = FAMILY_MODELS.get(family)
                assert entry is not None and getattr(entry, target) is not None, (
                    f"{family} reaches {target} (its bridges): add its {target} model to tests/frameworks/models.py")


@pytest.mark.parametrize("family,target,megatron_spec,direction", SUPPORTED)
def test_the_framework_loads_what_maxckpt_writes_and_maxckpt_reads_what_it_saves(
        request, maxtext_fixtures, tmp_path, monkeypatch, family, target, megatron_spec, direction):
    request.getfixturevalue("megatron_core" if target == "megatron" else "torchtitan")
    check = {("megatron", "to"): megatron_to, ("megatron", "from"): megatron_from,
             ("torchtitan", "to"): torchtitan_to, ("torchtitan", "from"): torchtitan_from}[target, direction]
    check(family, tmp_path, maxtext_fixtures, monkeypatch, megatron_spec=megatron_spec)


# The MaxText-written fixture of each family (shared/fixtures/maxtext) where its name is not `<family>_scan`
# with dots and dashes as underscores.
_FIXTURE_NAMES = {"mixtral": "mixtral_moe_scan", "deepseek3.2": "deepseek32_scan", "gemma4-small": "gemma4_e2b_unscan_a"}


def _fixture_of(family):
    return _FIXTURE_NAMES.get(family, family.replace(".", "_").replace("-", "_") + "_scan")


def _as_the_framework_saves_it(root):
    """Without what maxckpt adds: its model record and the run args in Megatron's common.pt."""
    for record in root.rglob("maxckpt_model.json"):
        record.unlink()
    for common in root.rglob("common.pt"):
        state = torch.load(common, weights_only=False)
        state.pop("args", None)
        torch.save(state, common)


@pytest.mark.parametrize("family,target,direction", REFUSED)
def test_convert_refuses_the_pairs_the_registry_rules_out(maxtext_fixtures, tmp_path, family, target, direction):
    """`to`: a run of the family to the framework; `from`: a framework checkpoint read as the family."""
    gap = bridge_gap(target, family)
    model = FAMILIES[family].maxtext_models[0]
    overrides = {"num_experts_per_tok": 2} if FAMILIES[family].hf_experts else {}
    if direction == "to":
        src, dst = maxtext_fixtures / _fixture_of(family) / "checkpoints" / "5" / "items", tmp_path / "out"
    else:  # a checkpoint as the framework saves it (maxckpt's record removed), read as the refused family: the
        # registry answers before any tensor is mapped, so a llama2 checkpoint serves every family
        src, dst = tmp_path / "framework", tmp_path / "hf"
        convert(maxtext_fixtures / "llama2_scan" / "checkpoints" / "5" / "items", src, to=target, model="llama2-7b")
        _as_the_framework_saves_it(src)
    with pytest.raises(UnsupportedModelError) as info:
        convert(src, dst, to=target if direction == "to" else "hf", model=model,
                source=SourceOptions(overrides=overrides if direction == "to" else {"head_dim": 16}))
    assert str(info.value) == f"{family} cannot be converted {direction} {target}: {gap}"
    assert not dst.exists()


# ------------------------------------------------------------------ the four checks


def _run_to(target, src, tmp_path, *flags):
    from maxckpt.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["convert", str(src.path), str(tmp_path / target), "--to", target, "--model", src.model,
              *src.set_flags(), *flags, "-q"])
    assert info.value.code in (0, None)
    report = convert(src.path, tmp_path / "hf", to="hf", model=src.model, source=SourceOptions(overrides=src.overrides))
    src.spec = report.spec
    return report.spec


def _hf_model(path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].numpy()


def _assert_same_tensors(a, b, names=None):
    """Every tensor of reader `a` in reader `b`, bit for bit, and (names None) the same names."""
    if names is None:
        assert set(a.tensors()) == set(b.tensors())
    for n in names or a.tensors():
        assert np.array_equal(a.read(n), b.read(n)), n


def _assert_back_to_the_same_hf(framework_dir, tmp_path, hf_dir):
    """framework -> HF with nothing said (family and settings from maxckpt_model.json) equals `hf_dir`."""
    convert(framework_dir, tmp_path / "hf_back", to="hf")
    _assert_same_tensors(SafetensorsReader(hf_dir), SafetensorsReader(tmp_path / "hf_back"))


def _assert_logits(got, expected, what):
    assert np.abs(got - expected).max() < 1e-4, what


def megatron_to(family, tmp_path, fixtures, monkeypatch, *, megatron_spec, tied=None):
    from maxckpt.formats.megatron.files import find_megatron_checkpoint, read_megatron_common

    entry = FAMILY_MODELS[family]
    src = source(family, tmp_path, fixtures, tied=tied)
    spec = _run_to("megatron", src, tmp_path, "--megatron-spec", megatron_spec)
    ckpt_dir, iteration = find_megatron_checkpoint(tmp_path / "megatron")
    assert iteration == src.step  # MaxText checkpoint N holds step N + 1
    args = read_megatron_common(ckpt_dir)["args"]
    assert args.padded_vocab_size == 256 and args.transformer_impl == (
        "transformer_engine" if megatron_spec == "te" else "local")

    # The local-spec model: a TE-spec checkpoint through the TE key map (its extra `_extra_state` items are
    # unexpected there), a local-spec one with no key left over either way.
    model = entry.megatron(spec, monkeypatch)
    te = megatron_spec == "te"
    state = mc.load(model, ckpt_dir, spec, te_key_map=te, strict="assume_ok_unexpected" if te else "raise_all")
    assert state["checkpoint_version"] == 3.0 and state["iteration"] == src.step  # common.pt merged in
    tokens = megatron_tokens(family, src, spec.vocab_size)
    expected = _hf_logits(_hf_model(tmp_path / "hf"), tokens)
    logits = mc.logits(model, tokens, spec.vocab_size)
    _assert_logits(logits, expected, "Megatron-Core vs transformers")
    maxtext = src.maxtext_logits(tokens)
    if maxtext is not None:
        _assert_logits(logits, maxtext, "Megatron-Core vs MaxText")
    for check in entry.megatron_checks:
        check(model, ckpt_dir, spec, tokens, expected, megatron_spec)
    if te:  # and into the TE spec's own module tree (CPU stand-ins), no key map: every _extra_state is there
        te_model = entry.megatron(spec, monkeypatch, mc.te_structured_specs(monkeypatch))
        mc.assert_te_structure(te_model, spec)
        mc.load(te_model, ckpt_dir, spec, strict="raise_unexpected")  # all it asks for; CPU attention has no TE state
        _assert_logits(mc.logits(te_model, tokens, spec.vocab_size), expected, "TE spec's model vs transformers")

    # The HF export writes the same Megatron tensors; and Megatron -> HF equals MaxText -> HF, bit for bit.
    convert(tmp_path / "hf", tmp_path / "megatron_from_hf", to="megatron", options=MegatronOptions(spec=megatron_spec))
    _assert_same_tensors(DcpReader(ckpt_dir), DcpReader(find_megatron_checkpoint(tmp_path / "megatron_from_hf")[0]))
    _assert_back_to_the_same_hf(tmp_path / "megatron", tmp_path, tmp_path / "hf")


def torchtitan_to(family, tmp_path, fixtures, monkeypatch, *, megatron_spec=None, tied=None):
    from maxckpt.formats.torchtitan.files import find_step_dir

    entry = FAMILY_MODELS[family]
    src = source(family, tmp_path, fixtures, tied=tied)
    spec = _run_to("torchtitan", src, tmp_path)
    step_dir, step = find_step_dir(tmp_path / "torchtitan")
    assert step == src.step and step_dir.name == f"step-{src.step}"
    model = tt.load_model_only(entry.torchtitan(spec, monkeypatch), step_dir)
    hf = _hf_model(tmp_path / "hf")
    if entry.torchtitan_check:
        entry.torchtitan_check(model, hf, spec)
    else:
        tokens = torchtitan_tokens(spec.vocab_size)
        logits = tt.logits(model, tokens)
        _assert_logits(logits, _hf_logits(hf, tokens), "TorchTitan vs transformers")
        maxtext = src.maxtext_logits(tokens)
        if maxtext is not None:
            _assert_logits(logits, maxtext, "TorchTitan vs MaxText")

    convert(tmp_path / "hf", tmp_path / "torchtitan_from_hf", to="torchtitan")
    _assert_same_tensors(DcpReader(step_dir), DcpReader(find_step_dir(tmp_path / "torchtitan_from_hf")[0]))
    _assert_back_to_the_same_hf(tmp_path / "torchtitan", tmp_path, tmp_path / "hf")


def _saved_spec(family, tmp_path, fixtures):
    """The dimensions of the family's source run, for a model the framework builds and saves itself
    (a vocabulary Megatron does not pad, so every saved row is a token's)."""
    import dataclasses

    src = source(family, tmp_path, fixtures)
    if src.spec is None:
        with open_checkpoint(src.path, model=src.model, overrides=dict(src.overrides)) as ckpt:
            src.spec = ckpt.spec
    return src, dataclasses.replace(src.spec, vocab_size=256)


def _perturbed(model, spec):
    """Norms off 1, biases and sinks off 0 (frameworks initialise them so), the routing bias of biased
    sigmoid routing random: a swapped or dropped one shows in the logits."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith(("bias", "softmax_offset", "sinks")):
                p.copy_(torch.randn_like(p) * 0.3)
        if spec.routing == "sigmoid_bias":
            for name, b in model.named_buffers():
                if name.endswith("expert_bias"):
                    b.copy_(torch.randn_like(b) * 0.5)
    return model


def _saved_overrides(src, spec):
    """What the framework's save does not state: top-k, the real vocabulary, head_dim (not MLA's)."""
    overrides = {**src.overrides, "vocab_size": spec.vocab_size}
    if not spec.q_lora_rank and not spec.kv_lora_rank:
        overrides["head_dim"] = spec.head_dim
    return overrides


def _assert_same_dims(got, want, *, tying=True):
    for name in ("num_layers", "emb_dim", "num_heads", "num_kv_heads", "mlp_dim", "vocab_size", "num_experts",
                 "moe_mlp_dim") + (("tie_word_embeddings",) if tying else ()):
        assert getattr(got, name) == getattr(want, name), name


def _assert_megatron_tensors_where_transformers_expects_them(hf, sd, spec):
    """Megatron's own tensors, read off its state dict, under transformers' names: q/k/v regrouped per kv
    head, gate/up split from linear_fc1, the norms; router and experts of each MoE layer; MLA's kv up
    projection and the routing bias."""
    fam = FAMILIES[spec.family]
    E, M = spec.emb_dim, spec.moe_mlp_dim
    for i in range(spec.num_layers):
        p = f"decoder.layers.{i}."
        moe = spec.num_experts and i >= (spec.first_dense_layers or 0)
        norm = sd.get(p + "input_layernorm.weight", sd.get(p + "self_attention.linear_qkv.layer_norm_weight"))
        if not spec.kv_lora_rank:  # MHA
            assert np.array_equal(hf.read(f"model.layers.{i}.input_layernorm.weight"), norm.numpy())
            if not fam.settings.get("attention_bias"):
                qkv = sd[p + "self_attention.linear_qkv.weight"].numpy()
                got = np.concatenate([hf.read(f"model.layers.{i}.self_attn.{x}_proj.weight").reshape(
                    spec.num_kv_heads, -1, E) for x in "qkv"], axis=1)  # regroup per kv head: [q of g; k_g; v_g]
                assert np.array_equal(got.reshape(qkv.shape), qkv)
        else:
            assert np.array_equal(hf.read(f"model.layers.{i}.self_attn.kv_b_proj.weight"),
                                  sd[p + "self_attention.linear_kv_up_proj.weight"].numpy())
        if not moe:
            fc1 = sd[p + "mlp.linear_fc1.weight"].numpy()
            F = fc1.shape[0] // 2
            assert np.array_equal(hf.read(f"model.layers.{i}.mlp.gate_proj.weight"), fc1[:F])
            assert np.array_equal(hf.read(f"model.layers.{i}.mlp.up_proj.weight"), fc1[F:])
            continue
        if spec.routing == "sigmoid_bias":
            assert np.array_equal(hf.read(f"model.layers.{i}.mlp.gate.e_score_correction_bias"),
                                  sd[p + "mlp.router.expert_bias"].numpy())
        names = [n for n in (("block_sparse_moe", "w1", "w3", "w2"), ("mlp", "gate_proj", "up_proj", "down_proj"))
                 if f"model.layers.{i}.{n[0]}.experts.0.{n[1]}.weight" in hf.tensors()]  # mixtral's, per expert
        if not names:  # gpt-oss: fused experts, checked by the logits and the round trip
            continue
        ((block, gate, up, down),) = names
        assert np.array_equal(hf.read(f"model.layers.{i}.{block}.gate.weight"), sd[p + "mlp.router.weight"].numpy())
        for e in range(spec.num_experts):
            fc1 = sd[f"{p}mlp.experts.local_experts.{e}.linear_fc1.weight"].numpy()
            fc2 = sd[f"{p}mlp.experts.local_experts.{e}.linear_fc2.weight"].numpy()
            assert np.array_equal(hf.read(f"model.layers.{i}.{block}.experts.{e}.{gate}.weight"), fc1[:M])
            assert np.array_equal(hf.read(f"model.layers.{i}.{block}.experts.{e}.{up}.weight"), fc1[M:])
            assert np.array_equal(hf.read(f"model.layers.{i}.{block}.experts.{e}.{down}.weight"), fc2)


def megatron_from(family, tmp_path, fixtures, monkeypatch, *, megatron_spec):
    from maxckpt.containers.safetensors import SafetensorsReader
    from maxckpt.formats.megatron.files import find_megatron_checkpoint
    from maxckpt.formats.megatron.layout import MegatronLayout
    from torch_reference import lazy_from_reader

    entry = FAMILY_MODELS[family]
    src, spec = _saved_spec(family, tmp_path, fixtures)
    te = megatron_spec == "te"
    model = _perturbed(entry.megatron(spec, monkeypatch, mc.te_structured_specs(monkeypatch) if te else None), spec)
    sd = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    overrides = _saved_overrides(src, spec)
    per_layer = FAMILIES[family].megatron_table.per_layer
    # Stacked layer keys, and (dense families) Megatron's per-layer ones: maxckpt does not read the per-expert
    # singleton-shard keys (`mlp.experts.experts.{e}.linear_fc1.weight_w`) a MoE model saves that way.
    for singleton in (False,) if spec.num_experts else (False, True):
        out = tmp_path / f"saved_{singleton}"
        mc.save(model, out, singleton_local_shards=singleton)
        reader = DcpReader(out)
        assert any(k.startswith("decoder.layers.0.") for k in reader.tensors()) == (singleton or per_layer)
        # Megatron's own save states no head counts or top-k: the flags do.
        report = convert(out, tmp_path / f"hf_{singleton}", to="hf", model=src.model,
                         source=SourceOptions(overrides=overrides))
        assert report.source_format == "megatron"
        _assert_same_dims(report.spec, spec)
        hf = SafetensorsReader(tmp_path / f"hf_{singleton}")
        _assert_megatron_tensors_where_transformers_expects_them(hf, sd, spec)
        direct = MegatronLayout(spec=megatron_spec).to_hf(lazy_from_reader(reader), report.spec)
        for name in hf.tensors():  # convert gives what the layout maps
            assert np.array_equal(hf.read(name), direct[name].read()), name
    if not spec.num_experts:
        _assert_same_tensors(SafetensorsReader(tmp_path / "hf_False"), SafetensorsReader(tmp_path / "hf_True"))

    tokens = megatron_tokens(family, src, spec.vocab_size)
    expected = mc.logits(model, tokens, spec.vocab_size)
    _assert_logits(_hf_logits(_hf_model(tmp_path / "hf_False"), tokens), expected, "transformers vs Megatron-Core")

    # HF -> Megatron gives Megatron's own tensors back, and -> HF again the same HF tensors, bit for bit.
    convert(tmp_path / "hf_False", tmp_path / "mega", to="megatron", options=MegatronOptions(spec=megatron_spec))
    ckpt_dir, _ = find_megatron_checkpoint(tmp_path / "mega")
    _assert_same_tensors(DcpReader(tmp_path / "saved_False"), DcpReader(ckpt_dir))
    _assert_back_to_the_same_hf(tmp_path / "mega", tmp_path, tmp_path / "hf_False")


def torchtitan_from(family, tmp_path, fixtures, monkeypatch, *, megatron_spec=None):
    import torch.distributed.checkpoint as dcp

    from maxckpt.formats.torchtitan.files import find_step_dir

    entry = FAMILY_MODELS[family]
    src, spec = _saved_spec(family, tmp_path, fixtures)
    model = _perturbed(entry.torchtitan(spec, monkeypatch), spec)
    state = tt.model_state(model)
    dcp.save(state, checkpoint_id=str(tmp_path / "ckpt" / "step-10"))  # as TorchTitan's checkpointer saves it
    report = convert(tmp_path / "ckpt", tmp_path / "hf", to="hf", model=src.model,
                     source=SourceOptions(overrides=_saved_overrides(src, spec)))
    assert report.source_format == "torchtitan"
    _assert_same_dims(report.spec, spec, tying=False)  # a tied model's save holds lm_head too: read as untied
    hf = SafetensorsReader(tmp_path / "hf")
    for i in range(spec.num_layers):  # every expert where transformers expects it
        p = f"layers.{i}.moe."
        if p + "routed_experts.inner_experts.w1_EFD" not in state:
            continue
        assert np.array_equal(hf.read(f"model.layers.{i}.mlp.gate.weight"), state[p + "router.gate.weight"].numpy())
        for e in range(spec.num_experts):
            for key, name in (("w1_EFD", "gate_proj"), ("w3_EFD", "up_proj"), ("w2_EDF", "down_proj")):
                got = hf.read(f"model.layers.{i}.mlp.experts.{e}.{name}.weight")
                assert np.array_equal(got, state[p + "routed_experts.inner_experts." + key][e].numpy())
    hf_model = _hf_model(tmp_path / "hf")
    if entry.torchtitan_check:
        entry.torchtitan_check(model, hf_model, spec)
    else:
        tokens = torchtitan_tokens(spec.vocab_size)
        _assert_logits(_hf_logits(hf_model, tokens), tt.logits(model, tokens), "transformers vs TorchTitan")

    # HF -> TorchTitan gives TorchTitan's own tensors back, and -> HF again the same HF tensors, bit for bit.
    convert(tmp_path / "hf", tmp_path / "titan", to="torchtitan")
    step_dir, _ = find_step_dir(tmp_path / "titan")
    _assert_same_tensors(DcpReader(tmp_path / "ckpt" / "step-10"), DcpReader(step_dir))
    _assert_back_to_the_same_hf(tmp_path / "titan", tmp_path, tmp_path / "hf")


# ------------------------------------------------------------------ explicit extra cases

OTHER_TYING = [  # the tiny runs tie qwen3's output layer (as Qwen3-0.6B does) and no llama's; here the other way
    pytest.param("llama3", "megatron", "local", True, id="llama3-megatron-local-to-tied"),
    pytest.param("qwen3", "megatron", "local", False, id="qwen3-megatron-local-to-untied"),
    pytest.param("llama3", "torchtitan", None, True, id="llama3-torchtitan-to-tied"),
]


@pytest.mark.parametrize("family,target,megatron_spec,tied", OTHER_TYING)
def test_the_other_embedding_tying(request, maxtext_fixtures, tmp_path, monkeypatch, family, target, megatron_spec, tied):
    request.getfixturevalue("megatron_core" if target == "megatron" else "torchtitan")
    (megatron_to if target == "megatron" else torchtitan_to)(
        family, tmp_path, maxtext_fixtures, monkeypatch, megatron_spec=megatron_spec, tied=tied)


def test_megatron_without_extra_state_needs_relaxed_strictness(megatron_core, tmp_path):
    """Megatron-Core's default load refuses a checkpoint lacking the `_extra_state` items its model asks for
    (why maxckpt writes them); with relaxed strictness the tensors load."""
    from megatron.core import dist_checkpointing
    from torch_reference import hf_arrays, lazy, spec_of, tiny_hf_model, write_all

    from maxckpt.containers.dcp import DcpWriter
    from maxckpt.formats.megatron.files import write_megatron_sidecars
    from maxckpt.formats.megatron.layout import MegatronLayout

    hf = tiny_hf_model("llama")
    spec = spec_of(hf)
    layout = MegatronLayout(spec="local")
    it_dir = tmp_path / "mega" / "iter_0000001"
    with DcpWriter(it_dir) as w:
        write_all(w, layout.from_hf(lazy(hf_arrays(hf)), spec))
    write_megatron_sidecars(tmp_path / "mega", spec, layout, iteration=1)
    model = mc.gpt_model(spec, None)
    with pytest.raises(BaseException, match="_extra_state"):  # DCP's CheckpointException is a BaseException
        dist_checkpointing.load({"model": model.sharded_state_dict()}, str(it_dir))
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(it_dir), strict="log_unexpected")
    model.load_state_dict(state["model"], strict=True)


def test_the_matrix_is_the_registry():
    """The ids name each supported pair once per direction (and spec), the refused pairs by the registry."""
    ids = {p.id for p in SUPPORTED}
    assert "llama3.1-megatron-te-to" in ids and "qwen3-moe-torchtitan-from" in ids
    assert not any(re.match(r"(mixtral|gemma\d)-torchtitan", i) for i in ids)
    assert {p.id for p in REFUSED} >= {"gemma2-megatron-to", "mixtral-torchtitan-from"}
