"""Layouts: what tensors are called and how they are shaped, per framework and model family.

HF naming and shapes are the hub: every layout maps to and from HF, so a new
framework costs one mapping, not one per pair.
"""
