"""refimpl.batch.Batch: the tokens a forward reads with their padding, positions and the rows wanted.

The public entry points take attention_mask= and positions= as keywords and hand hidden_states one
Batch; these tests show the two spellings are the same forward (bit for bit) in both families, and
that a Batch refuses what it cannot mean.
"""

from __future__ import annotations

import numpy as np
import pytest

from accel.steps import tiny_model
from refimpl.batch import Batch
from refimpl.gpt2 import model as gpt2_model
from refimpl.llama import model as llama_model


def test_a_batch_refuses_what_it_cannot_mean():
    ids = np.array([[1, 2, 3]])
    with pytest.raises(TypeError, match="inside the Batch, not beside it"):
        Batch.of(Batch(ids), attention_mask=np.ones((1, 3), dtype=bool))
    with pytest.raises(TypeError, match="last_only must be True or False; got int 1"):
        Batch(ids, last_only=1)
    with pytest.raises(TypeError, match="not another Batch"):
        Batch(Batch(ids))
    assert Batch.of(ids).ids is ids and Batch.of(b := Batch(ids)) is b


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3_text"])
def test_keywords_at_the_door_and_a_batch_are_the_same_forward(family):
    """forward(ids, attention_mask=m, positions=p) == lm_head(hidden_states(Batch(ids, m, p))), bit for bit, with and
    without a cache; Batch(..., last_only=True) gives the last row of the same h (GPT-2's last block computes that
    row alone, so there it is checked against the same Batch run through a cache, which fills the same keys)."""
    params, config = tiny_model(family, np.float64, seed=0)
    mod = gpt2_model if family == "gpt2" else llama_model

    def head(h):
        return gpt2_model.lm_head(h, params) if family == "gpt2" else llama_model.lm_head(h, params, config)

    ids = np.random.default_rng(1).integers(0, config.vocab_size, (2, 6))
    mask = np.ones((2, 6), dtype=bool)
    mask[1, :2] = False
    positions = np.arange(6) + 3
    for m, p in ((None, None), (mask, None), (None, positions)):
        z = mod.forward(params, config, ids, attention_mask=m, positions=p)
        assert np.array_equal(z, head(mod.hidden_states(params, config, Batch(ids, m, p))))
        cache = mod.KVCache.allocate(config, 2, 8, dtype=np.float64)
        h = mod.hidden_states(params, config, Batch(ids, m, p), cache)
        assert cache.length == 6 and np.array_equal(head(h), z)
    last = mod.hidden_states(params, config, Batch(ids, mask, last_only=True))
    assert last.shape == (2, 1, h.shape[-1])
    if family != "gpt2":  # (the LLaMA family norms the last row of the same x)
        assert np.array_equal(last, mod.hidden_states(params, config, Batch(ids, mask))[:, -1:])
    cache = mod.KVCache.allocate(config, 2, 8, dtype=np.float64)
    assert np.array_equal(last, mod.hidden_states(params, config, Batch(ids, mask, last_only=True), cache))
