"""No tests here any more: the framework tests are the matrix, tests/test_frameworks_matrix.py.

What tests/test_convert_distributed.py still imports from this module (`from test_frameworks_real import
...`), written on tests/frameworks/. Delete this file once that import names tests/frameworks instead.
"""

from __future__ import annotations

import torch
from frameworks.megatron import gpt_model


def _maxtext_run(tmp_path, family, *, tied=False, vocab=250):
    """A tiny random MaxText run (GQA: 4 query heads, 2 groups) saved by Orbax, and its JAX reference logits."""
    from conversion_models import TOKENS, random_maxtext_params, save_maxtext_run, tiny_spec

    from maxckpt.reference import forward

    spec = tiny_spec(family, tied=tied, vocab=vocab)
    params = random_maxtext_params(spec)
    run = save_maxtext_run(tmp_path / "run", params, step=6).parent
    return run, spec, forward(params, spec, TOKENS)[0], TOKENS[0]


def _megatron_model(spec, layout=None):
    """Megatron-Core's local-spec GPTModel for a dense `spec` (tests/frameworks/megatron.py)."""
    return gpt_model(spec, None)


def _megatron_logits(model, tokens):
    """The model's logits for one sequence, padded vocabulary included, as a tensor."""
    s = len(tokens)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)  # True = masked
    with torch.no_grad():
        return model(torch.tensor([tokens]), torch.arange(s)[None], mask)[0]
