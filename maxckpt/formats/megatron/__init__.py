"""The Megatron-Core `torch_dist` format: its options."""
