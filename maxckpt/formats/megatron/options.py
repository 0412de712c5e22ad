"""What a Megatron target can be asked for: the layer spec and vocabulary padding of the run that loads it, the step."""

from __future__ import annotations

from dataclasses import dataclass

from maxckpt.formats.fields import knob
from maxckpt.formats.recorded_step import RecordedStep


@dataclass(frozen=True, kw_only=True)
class MegatronOptions(RecordedStep):
    """The knobs of a Megatron output (`convert(..., to="megatron", options=MegatronOptions(spec="local"))`).

    `spec` and `make_vocab_size_divisible_by` must match the Megatron run that loads the output.
    """

    spec: str = knob(
        "te", "--megatron-spec", type=str, choices=("te", "local"),
        help="Megatron output: layer spec of the run that loads it, te (Transformer Engine, Megatron-LM's default: "
             "--transformer-impl transformer_engine) or local (--transformer-impl local). Every family goes to both; "
             "they differ in the norm names of MoE and MLA layers (te: MoE layers keep pre_mlp_layernorm, MLA fuses "
             "the q/kv norms into linear_q_up_proj/linear_kv_up_proj) and in the _extra_state items. Reading takes "
             "either.",
    )
    """Layer spec of the loading run: "te" (Transformer Engine, Megatron-LM's default) or "local"."""

    make_vocab_size_divisible_by: int = knob(
        128, "--make-vocab-size-divisible-by", type=int, minimum=1, parse=int,
        help="Megatron output: pad the vocabulary to a multiple of N (pass the same N to Megatron-LM).",
    )
    """Pad the vocabulary to a multiple of this, >= 1 (Megatron-LM's flag of the same name)."""
