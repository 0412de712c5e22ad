"""A small JAX forward pass of MaxText's Llama-family decoder, for checking conversions.

It reproduces MaxText's own logits on the fixtures in shared/fixtures (see
tests/test_fixtures_logits.py) and is what `maxckpt verify --logits` runs on
the source side. It materialises the whole model: meant for checking, not
for serving.
"""

from maxckpt.reference.forward import decoder_layer, forward, maxtext_params, rms_norm, rope_timescales

__all__ = ["decoder_layer", "forward", "maxtext_params", "rms_norm", "rope_timescales"]
