"""Per family: the MaxText run the matrix starts from and the framework models that load it.

`FAMILY_MODELS[family]` names, for each family the registry lets reach Megatron-Core or TorchTitan
(`bridges`), the source run (a MaxText-written fixture, or for the dense families a tiny random run saved
by Orbax with a vocabulary that Megatron pads: 250 -> 256), the builders of each framework's model, the
sequence each forward runs on, and the checks that only make sense for that family (routing bias,
sliding window). A family the registry lets reach a framework but that has no entry here fails the matrix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from frameworks import megatron, torchtitan


@dataclass(frozen=True)
class FamilyModels:
    model: str  # the MaxText model name `maxckpt convert --model` gets
    megatron: Callable | None  # (spec, monkeypatch, te_structured=None) -> Megatron-Core GPTModel
    torchtitan: Callable | None  # (spec, monkeypatch) -> TorchTitan model
    fixture: str | None = None  # a MaxText-written run under shared/fixtures/maxtext; None: a tiny random run
    overrides: Mapping[str, Any] = field(default_factory=dict)  # --set KEY=VALUE for the source
    tied: bool = False  # the tiny random run's output layer is the embedding
    head_dim: int = 16  # the tiny random run's (qwen3's head_dim is not emb / heads)
    megatron_tokens: int | None = None  # Megatron's sequence length (None: the fixture's or TOKENS)
    # TorchTitan's check in place of whole-model logits (gpt-oss: CPU torch cannot run its attention)
    torchtitan_check: Callable | None = None
    megatron_checks: tuple[Callable, ...] = ()  # (model, ckpt_dir, spec, tokens, expected) after the load


def _deepseek_megatron_args_and_routing_bias(model, ckpt_dir, spec, tokens, expected, megatron_spec):
    """The args Megatron-LM needs for MLA and biased sigmoid routing; and the routing bias (MaxText's
    nnx_aux) is carried and matters: without it Megatron routes otherwise."""
    from maxckpt.formats.megatron.files import read_megatron_common

    assert spec.first_dense_layers == 3 and spec.num_shared_experts == 1 and spec.q_lora_rank
    args = read_megatron_common(ckpt_dir)["args"]
    assert args.multi_latent_attention and args.moe_layer_freq == [0, 0, 0, 1, 1]
    assert args.moe_router_score_function == "sigmoid" and args.moe_router_enable_expert_bias
    bias = model.decoder.layers[3].mlp.router.expert_bias
    assert bias.abs().max() > 0
    saved = [layer.mlp.router.expert_bias.clone() for layer in model.decoder.layers[3:]]
    for layer in model.decoder.layers[3:]:
        layer.mlp.router.expert_bias.zero_()
    unbiased = megatron.logits(model, tokens, spec.vocab_size)
    assert np.abs(unbiased - expected).max() > 1e-3
    for layer, b in zip(model.decoder.layers[3:], saved):
        layer.mlp.router.expert_bias.copy_(b)


def _gpt_oss_window_is_exact(model, ckpt_dir, spec, tokens, expected, megatron_spec):
    """HF's sliding_window W is Megatron's window_size (W - 1, 0); one more key differs (160 tokens pass
    the 128-token window of the sliding layers)."""
    assert len(tokens) > spec.sliding_window
    for layer in model.decoder.layers:
        softmax = layer.self_attention.core_attention.scale_mask_softmax
        if softmax.window_size is not None:
            softmax.window_size = (softmax.window_size[0] + 1, 0)
    wider = megatron.logits(model, tokens, spec.vocab_size)
    assert np.abs(wider - expected).max() > 1e-2


_MOE = {"num_experts_per_tok": 2}  # the fixtures' runs route to 2 of 4 experts

FAMILY_MODELS: dict[str, FamilyModels] = {
    "llama2": FamilyModels("llama2-7b", megatron.gpt_model, torchtitan.llama3_model),
    "llama3": FamilyModels("llama3-8b", megatron.gpt_model, torchtitan.llama3_model),
    "llama3.1": FamilyModels("llama3.1-8b", megatron.gpt_model, torchtitan.llama3_model),
    "mistral": FamilyModels("mistral-7b", megatron.gpt_model, torchtitan.llama3_model),
    "qwen3": FamilyModels("qwen3-0.6b", megatron.gpt_model, torchtitan.qwen3_model, tied=True, head_dim=32),
    "qwen2.5": FamilyModels("qwen2.5-7b", megatron.gpt_model, None, fixture="qwen2_5_scan"),
    "mixtral": FamilyModels("mixtral-8x7b", megatron.gpt_model, None, fixture="mixtral_moe_scan", overrides=_MOE),
    "qwen3-moe": FamilyModels("qwen3-30b-a3b", megatron.gpt_model, torchtitan.qwen3_moe_model,
                              fixture="qwen3_moe_scan", overrides=_MOE),
    "deepseek3": FamilyModels("deepseek3-671b", megatron.deepseek_model, torchtitan.deepseek_model,
                              fixture="deepseek3_scan", overrides=_MOE, megatron_tokens=32,
                              megatron_checks=(_deepseek_megatron_args_and_routing_bias,)),
    "deepseek2": FamilyModels("deepseek2-16b", megatron.deepseek_model, torchtitan.deepseek_model,
                              fixture="deepseek2_scan", overrides=_MOE, megatron_tokens=32),
    "kimi-k2": FamilyModels("kimi-k2-1t", None, torchtitan.deepseek_model, fixture="kimi_k2_scan", overrides=_MOE),
    "gpt-oss": FamilyModels("gpt-oss-20b", megatron.gpt_oss_model, torchtitan.gpt_oss_model,
                            fixture="gpt_oss_scan", overrides=_MOE, megatron_tokens=160,
                            torchtitan_check=torchtitan.assert_gpt_oss_matches_transformers,
                            megatron_checks=(_gpt_oss_window_is_exact,)),
}


@dataclass
class Source:
    """A MaxText run to convert: where, as which model, and MaxText's logits when maxckpt knows them."""

    path: Path
    model: str
    overrides: Mapping[str, Any]
    step: int  # the step the run's checkpoint holds
    spec: Any = None  # the ModelSpec (a tiny run's; a fixture's is read by the conversion)
    params: Mapping[str, np.ndarray] | None = None
    fixture_logits: tuple[list[int], np.ndarray] | None = None

    def maxtext_logits(self, tokens: list[int]) -> np.ndarray | None:
        """MaxText's logits for `tokens`: maxckpt's JAX reference of a tiny run, or the fixture's own
        forward when `tokens` are the fixture's; None otherwise."""
        if self.params is not None:
            from maxckpt.reference import forward

            return np.asarray(forward(self.params, self.spec, [tokens])[0])
        if self.fixture_logits and self.fixture_logits[0] == list(tokens):
            return self.fixture_logits[1]
        return None

    def set_flags(self) -> list[str]:
        return [arg for k, v in self.overrides.items() for arg in ("--set", f"{k}={v}")]


def source(family: str, tmp_path: Path, fixtures: Path, *, tied: bool | None = None) -> Source:
    """The family's source run (`tied` flips a tiny run's embedding tying)."""
    entry = FAMILY_MODELS[family]
    if entry.fixture:
        items = fixtures / entry.fixture / "checkpoints" / "5" / "items"
        logits = fixtures / "logits" / f"{entry.fixture}_step5.npy"
        tokens = np.load(fixtures / "logits" / f"{entry.fixture}_step5_tokens.npy")[0].tolist()
        return Source(items, entry.model, entry.overrides, 6, fixture_logits=(tokens, np.load(logits)[0]))
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    spec = dataclasses.replace(
        tiny_spec(family, tied=entry.tied if tied is None else tied, vocab=250, head_dim=entry.head_dim), emb_dim=64)
    params = random_maxtext_params(spec)
    run = save_maxtext_run(tmp_path / "run", params, step=6).parent
    return Source(run, entry.model, entry.overrides, 7, spec=spec, params=params)


def megatron_tokens(family: str, src: Source, vocab_size: int) -> list[int]:
    n = FAMILY_MODELS[family].megatron_tokens
    if n is None:
        return src.fixture_logits[0] if src.fixture_logits else [1, 5, 9, 13, 17, 21, 25, 29]
    return [(7 * i + 1) % vocab_size for i in range(n)]


def torchtitan_tokens(vocab_size: int) -> list[int]:
    return [(7 * i + 1) % vocab_size for i in range(128)]
