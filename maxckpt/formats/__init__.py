"""One package per checkpoint format: maxtext, hf, megatron, torchtitan, torch.

Each will hold its pure layout, its files and its options; today each holds its options class
(the knobs of that target, from which `maxckpt convert` builds its flags). :data:`TARGET_OPTIONS`
names them by format.

>>> TARGET_OPTIONS["megatron"](spec="local").spec
'local'
"""

from __future__ import annotations

from maxckpt.formats.hf.options import HFOptions
from maxckpt.formats.maxtext.options import MaxTextOptions
from maxckpt.formats.megatron.options import MegatronOptions
from maxckpt.formats.torch.options import TorchOptions
from maxckpt.formats.torchtitan.options import TorchTitanOptions

TargetOptions = MaxTextOptions | HFOptions | MegatronOptions | TorchTitanOptions | TorchOptions

# Format name -> the options class of that target (in the order of the registry of formats).
TARGET_OPTIONS: dict[str, type] = {
    "maxtext": MaxTextOptions,
    "hf": HFOptions,
    "megatron": MegatronOptions,
    "torchtitan": TorchTitanOptions,
    "torch": TorchOptions,
}

__all__ = ["HFOptions", "MaxTextOptions", "MegatronOptions", "TARGET_OPTIONS", "TargetOptions", "TorchOptions",
           "TorchTitanOptions"]
