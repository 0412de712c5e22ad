"""maxckpt: the checkpoint toolkit for JAX/Orbax in the MaxText world.

Light to import: heavy parts (JAX, Orbax, torch) load on first use, so the
CLI's `--help` and `config show` stay instant.
"""

from __future__ import annotations

from maxckpt.lazy import lazy_attributes

from maxckpt.config import CheckpointConfig, load_config
from maxckpt.errors import (
    CheckpointNotFoundError,
    CheckpointSaveError,
    ConfigError,
    ConversionError,
    CorruptCheckpointError,
    MaxckptError,
    RunDirBusyError,
    ShapeMismatchError,
    StorageError,
    TensorNotFoundError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

# Public names that live in heavier modules: name -> module.
_LAZY: dict[str, str] = {
    "CheckpointManager": "maxckpt.manager.checkpoint_manager",
    "convert": "maxckpt.conversion",
    "SourceOptions": "maxckpt.conversion.options",
    "Distributed": "maxckpt.conversion.options",
    "MaxTextOptions": "maxckpt.formats",
    "HFOptions": "maxckpt.formats",
    "MegatronOptions": "maxckpt.formats",
    "TorchTitanOptions": "maxckpt.formats",
    "TorchOptions": "maxckpt.formats",
    "open_checkpoint": "maxckpt.conversion",
    "OrbaxReader": "maxckpt.containers.orbax",
    "SafetensorsReader": "maxckpt.containers.safetensors",
    "DcpReader": "maxckpt.containers.dcp",
    "TorchFileReader": "maxckpt.containers.torch_file",
    "verify": "maxckpt.conversion.verify",
    "verify_logits": "maxckpt.conversion.verify",
    "list_steps": "maxckpt.explore",
    "inspect_checkpoint": "maxckpt.explore",
    "diff_checkpoints": "maxckpt.explore",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "CheckpointConfig",
    "CheckpointNotFoundError",
    "CheckpointSaveError",
    "ConfigError",
    "ConversionError",
    "CorruptCheckpointError",
    "MaxckptError",
    "RunDirBusyError",
    "ShapeMismatchError",
    "StorageError",
    "TensorNotFoundError",
    "UnsupportedModelError",
    "__version__",
    "load_config",
    *_LAZY,
]
