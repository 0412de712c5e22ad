"""The TorchTitan DCP format: its options."""
