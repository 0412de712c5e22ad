"""The HuggingFace format (safetensors and config.json): its options."""
