"""What a config.json's `layer_types` says, checked against the attention pattern maxckpt converts.

transformers 5.x reads each layer's attention (`full_attention` or `sliding_attention`) from `layer_types`,
and refuses a list whose length is not `num_hidden_layers`. MaxText 0.2.5's own HF export keeps the
full-size model's list (28 entries for a 2-layer qwen2.5 run, 26 for a 4-layer gemma2): the first
`num_hidden_layers` entries are the model's, so they are read and the rest said in a note. What they say
must be the pattern the family computes (every layer full, or layer i full iff i % n == n - 1 for a
sliding_window_pattern n); a sliding layer maxckpt would convert as a full one, or a list too short to
say every layer's type, is refused: either would give other logits without an error.

>>> layer_types_notes({"num_hidden_layers": 2, "layer_types": ["full_attention"] * 28}, 0)[0][:42]
'config.json lists 28 layer_types for its 2'
"""

from __future__ import annotations

from typing import Any, Mapping

from maxckpt.errors import CorruptCheckpointError, UnsupportedModelError

FULL, SLIDING = "full_attention", "sliding_attention"


def expected_layer_types(num_layers: int, pattern: int) -> list[str]:
    """Each layer's attention for a sliding_window_pattern (0: every layer full)."""
    return [FULL if not pattern or i % pattern == pattern - 1 else SLIDING for i in range(num_layers)]


def layer_types_notes(config: Mapping[str, Any], pattern: int, family: str = "this family") -> list[str]:
    """Notes on a config's `layer_types` (empty when it states none or exactly the model's); raises when
    they say an attention pattern other than `pattern`'s, or when too few are listed."""
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
        return []
    types = config.get("layer_types")
    if types is None:
        return _implied_sliding(config, layers, pattern, family)
    if not isinstance(types, list) or not all(t in (FULL, SLIDING) for t in types):
        raise CorruptCheckpointError(
            f"config.json's layer_types must be a list of {FULL!r} and {SLIDING!r}; fix the file")
    if len(types) < layers:
        raise CorruptCheckpointError(
            f"config.json lists {len(types)} layer_types for its {layers} layers, so some layers' attention is "
            "not stated; fix the file (transformers refuses it too)")
    want = expected_layer_types(layers, pattern)
    got = types[:layers]
    if got != want:
        i = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
        raise UnsupportedModelError(
            f"config.json's layer_types make layer {i} {got[i]}, but maxckpt converts {family} with "
            f"{'full attention on every layer' if not pattern else f'every {pattern}th layer full, the others sliding'}"
            f" (layer {i}: {want[i]}); converting it would compute other logits")
    if len(types) > layers:
        return [f"config.json lists {len(types)} layer_types for its {layers} layers (MaxText 0.2.5 exports keep "
                f"the full-size model's list); the first {layers} are the model's, and they agree with its "
                "attention pattern"]
    return []


def _implied_sliding(config: Mapping[str, Any], layers: int, pattern: int, family: str) -> list[str]:
    """Qwen2/Qwen3 configs without layer_types: transformers makes layers from max_window_layers on sliding when
    use_sliding_window is on; a family maxckpt converts with full attention cannot hold those."""
    window, start = config.get("sliding_window"), config.get("max_window_layers")
    if pattern or not config.get("use_sliding_window") or window is None:
        return []
    if isinstance(start, int) and not isinstance(start, bool) and start < layers:
        raise UnsupportedModelError(
            f"config.json turns on use_sliding_window (window {window}) from layer {start} of {layers}, but "
            f"maxckpt converts {family} with full attention on every layer; converting it would compute other "
            "logits")
    return []
