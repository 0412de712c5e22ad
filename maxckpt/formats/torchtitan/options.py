"""What a TorchTitan target can be asked for: the key generation it is written in, the step."""

from __future__ import annotations

from dataclasses import dataclass

from maxckpt.formats.fields import knob
from maxckpt.formats.recorded_step import RecordedStep


@dataclass(frozen=True, kw_only=True)
class TorchTitanOptions(RecordedStep):
    """The knobs of a TorchTitan output (`convert(..., to="torchtitan", options=TorchTitanOptions(keys="classic"))`)."""

    keys: str = knob(
        "2026", "--torchtitan-keys", type=str, choices=("2026", "classic"), parse=str,
        help="TorchTitan output: key generation, 2026 (torchtitan 0.3+: attention.qkv_linear.wq, lm_head) or classic "
             "(attention.wq, output).",
    )
    """Key generation: "2026" (torchtitan 0.3+: `attention.qkv_linear.wq`, `lm_head`) or "classic" (`attention.wq`)."""
