"""The knobs of a target that records a training step (Megatron's `iter_N`, TorchTitan's `step-N`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from maxckpt.errors import ConversionError
from maxckpt.formats.fields import Knobs, knob


@dataclass(frozen=True, kw_only=True)
class RecordedStep(Knobs):
    """Which training step the output records: the source's unless `iteration` says otherwise, none with `release`."""

    iteration: int | None = knob(
        None, "--iteration", "--out-step", type=Optional[int], minimum=0,
        help="Megatron/TorchTitan output: training step to record (iter_N / step-N). Default: the source's step "
             "(MaxText checkpoint N holds step N+1), else none.",
    )
    """The training step to record, >= 0 (None: the source's, else none)."""

    release: bool = knob(
        False, "--release", type=bool,
        help="Megatron/TorchTitan output: record no step (Megatron release/, TorchTitan step-0, model only).",
    )
    """Record no step: Megatron `release/`, TorchTitan `step-0`, the model only."""

    def __post_init__(self) -> None:
        if self.release and self.iteration is not None:
            raise ConversionError(
                f"iteration={self.iteration} and release contradict: a release checkpoint records no step"
            )
        super().__post_init__()
