"""Containers: how tensors are stored on disk (Orbax, safetensors, DCP, torch.save).

Each container module offers about what `safetensors` offers: list tensors
without reading them, read one tensor (or a slice), write tensors one at a
time. Nothing about model layouts lives here.
"""
