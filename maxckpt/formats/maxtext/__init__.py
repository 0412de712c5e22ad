"""The MaxText format (Orbax checkpoints of MaxText's parameter tree): its options."""
