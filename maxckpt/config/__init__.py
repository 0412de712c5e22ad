"""MaxText base.yml overlays -> one typed, validated checkpoint config."""

from maxckpt.config.loader import bundled_configs_dir, load_config, read_chain
from maxckpt.config.schema import ALIASES, FIELDS, CheckpointConfig

__all__ = ["ALIASES", "FIELDS", "CheckpointConfig", "bundled_configs_dir", "load_config", "read_chain"]
