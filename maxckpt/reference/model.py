"""The model the reference forward runs: a ModelSpec with its family record, hashable for `jax.jit`.

ModelSpec (:mod:`maxckpt.layouts.base`) is maxckpt's one model record; the family
registry (:mod:`maxckpt.families`) adds what is a property of the family's
MaxText code rather than of one model: how the layers are stacked, the attention
and MoE module names, whether YaRN reads interleaved pairs, gpt-oss's SwiGLU clamp.
:class:`Model` joins the two and reads like the spec (`model.rms_norm_eps`); it
hashes by value, so a layer function can take it as a static argument of `jax.jit`
(ModelSpec itself holds dicts).

>>> model = Model.of(spec)                 # doctest: +SKIP
>>> model.layer_types[:2], model.scan      # doctest: +SKIP
(('sliding_attention', 'full_attention'), 'blocks')
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from maxckpt.errors import ConfigError
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES, Family

#: gpt-oss's SwiGLU, gate * sigmoid(alpha * gate) * (up + 1): alpha is fixed by the activation (HF GptOssExperts).
SWIGLU_OAI_ALPHA = 1.702


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


class Model:
    """A ModelSpec and its family record, with what the forward derives from them.

    Attribute access falls through to the spec; equality and hash are by the
    spec's values, so equal specs share one compiled layer.
    """

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.family: Family = FAMILIES[spec.family]
        self._key = tuple((f.name, _frozen(getattr(spec, f.name))) for f in dataclasses.fields(spec))

    @classmethod
    def of(cls, spec: ModelSpec | Model) -> Model:
        """The Model of `spec`, checked: ConfigError when its routing cannot run on its experts."""
        if isinstance(spec, Model):
            return spec
        model = cls(spec)
        model.check()
        return model

    def __getattr__(self, name: str) -> Any:
        if name in ("spec", "family", "_key"):  # not set yet (copy, unpickling): no recursion through self.spec
            raise AttributeError(name)
        return getattr(self.spec, name)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Model) and self._key == other._key

    # ---------------------------------------------------------- derived

    @property
    def scan(self) -> str:
        """How MaxText stacks the layers: "layers", "pairs", "blocks" or "dense_moe" (Family.maxtext_scan)."""
        return self.family.maxtext_scan

    @property
    def attention_module(self) -> str:
        """The attention module's name inside a MaxText layer (`self_attention`, `GptOssAttention`)."""
        return self.family.maxtext_attention

    @property
    def moe_module(self) -> str | None:
        """The routed experts' module path inside a MaxText layer (None: a dense family)."""
        return self.family.maxtext_moe

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (deepseek3)."""
        return self.family.attention == "mla"

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.spec.rope_scaling or {})

    @property
    def rope_interleave(self) -> bool:
        """Whether YaRN rotates interleaved pairs (x0,x1),(x2,x3)... (deepseek3, HF `rope_interleave`)."""
        return bool(self.family.hf_config_extra.get("rope_interleave", False))

    @property
    def swiglu_limit(self) -> float | None:
        """gpt-oss's clamp of gate and up (HF `swiglu_limit`); None for a plain activation."""
        if self.spec.activation != "swiglu_oai":
            return None
        return float(self.family.hf_config_extra.get("swiglu_limit", 7.0))

    @property
    def layer_types(self) -> tuple[str, ...]:
        """HF-style attention type of each layer: with sliding_window_pattern n, layer i is full iff i % n == n - 1."""
        n = self.spec.sliding_window_pattern
        if not n:
            return ("full_attention",) * self.spec.num_layers
        return tuple("full_attention" if i % n == n - 1 else "sliding_attention" for i in range(self.spec.num_layers))

    def check(self) -> None:
        """Raise ConfigError when the spec's routing cannot run on its experts."""
        spec = self.spec
        if spec.num_experts and not 0 < spec.num_experts_per_tok <= spec.num_experts:
            raise ConfigError(
                f"num_experts_per_tok={spec.num_experts_per_tok} must be between 1 and "
                f"num_experts={spec.num_experts} (no tensor shows it: pass the value the model "
                "was trained with, e.g. --set num_experts_per_tok=2)"
            )
        if spec.n_group > 1 and (spec.num_experts % spec.n_group or not 0 < spec.topk_group <= spec.n_group):
            raise ConfigError(
                f"group-limited routing needs n_group ({spec.n_group}) to divide num_experts "
                f"({spec.num_experts}) and 1 <= topk_group ({spec.topk_group}) <= n_group"
            )


__all__ = ["SWIGLU_OAI_ALPHA", "Model"]
