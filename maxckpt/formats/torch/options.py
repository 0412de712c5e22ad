"""What a torch target can be asked for: the HF model files' knobs (a torch target writes HF names and configs)."""

from __future__ import annotations

from dataclasses import dataclass

from maxckpt.formats.hf.options import HFModelFiles


@dataclass(frozen=True, kw_only=True)
class TorchOptions(HFModelFiles):
    """A torch output's knobs: shard size and tokenizer, as an HF output's (one file when DST ends in .pt/.bin)."""
