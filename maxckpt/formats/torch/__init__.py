"""The plain `torch.save` format (HF names): its options."""
