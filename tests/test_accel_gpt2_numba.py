"""GPT-2 on the `numba` backend (accel.numba_cpu.gpt2.OPS) equals GPT-2 on NumPy.

The backend runs refimpl's own model code with Numba kernels for layer_norm, the fused bias +
GELU and attention over the KV cache, so in exact arithmetic every logit is the same; in
float32 they differ by rounding (the kernels' registry tolerances), far below the gap between
the top two logits of a random model with weights of scale 0.3, hence greedy decoding picks
the same token at every step. Each test prints the max logit difference and the smallest
top-1 / top-2 margin it met, so a reader can see the identity is not luck.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="the numba backend needs numba (pip install -e .[numba])")

from accel.numba_cpu.gpt2 import OPS, _structure  # noqa: E402
from refimpl.gpt2 import GPT2Config, GPT2Model, GPT2Params, generate, generate_batch, logits  # noqa: E402
from refimpl.masks import causal_mask  # noqa: E402

CONFIG = GPT2Config(vocab_size=97, n_positions=64, n_embd=48, n_layer=2, n_head=4,
                    bos_token_id=None, eos_token_id=None)


def _model(seed: int = 0, scale: float = 0.3, dtype=np.float32) -> GPT2Model:
    rng = np.random.default_rng(seed)
    tensors = {n: scale * rng.standard_normal(s) for n, s in GPT2Params.expected_shapes(CONFIG).items()}
    return GPT2Model(CONFIG, GPT2Params.from_named_tensors(tensors, CONFIG, dtype=dtype))


def _margin(z: np.ndarray) -> float:
    top2 = np.sort(z, axis=-1)[..., -2:]
    return float((top2[..., 1] - top2[..., 0]).min())


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
def test_logits_match_numpy(dtype, tol):
    """logits(numba) == logits(numpy) within rounding, for a left-padded batch (causal & padding mask)."""
    model = _model(dtype=dtype)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, CONFIG.vocab_size, (3, 13))
    mask = np.ones((3, 13), dtype=bool)
    mask[1, :4] = False  # left padding
    ref = logits(model, ids, attention_mask=mask)
    out = logits(model, ids, attention_mask=mask, backend=OPS)
    assert out.dtype == ref.dtype == dtype
    real = mask[:, :, None] & np.ones_like(ref, dtype=bool)  # pad positions' outputs are meaningless
    d = float(np.abs(out - ref)[real].max())
    print(f"GPT-2 numba vs numpy logits ({np.dtype(dtype).name}): max abs diff {d:.3e}")
    assert d <= tol * float(np.abs(ref[real]).max())


def test_greedy_generation_is_token_identical():
    """Greedy decoding (prefill, then one token at a time over the KV cache) gives the same 40 tokens."""
    model = _model()
    prompt = [5, 17, 3, 88, 42, 1]
    ref = generate(model, prompt, max_new_tokens=40)
    out = generate(model, prompt, max_new_tokens=40, backend=OPS)
    full = logits(model, np.array(prompt + ref.ids[:-1]))
    print(f"greedy: {len(ref.ids)} tokens; smallest top-2 logit margin along the path {_margin(full):.3e}")
    assert out.ids == ref.ids


def test_greedy_batch_with_padding_is_token_identical():
    """generate_batch left-pads ragged prompts: prefill uses causal & padding, decode uses padding only."""
    model = _model(seed=2)
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5, 4, 3], [50]]
    ref = generate_batch(model, prompts, max_new_tokens=20)
    out = generate_batch(model, prompts, max_new_tokens=20, backend=OPS)
    assert [g.ids for g in out] == [g.ids for g in ref]


def test_mask_structure_is_read_back_exactly():
    """_structure recovers (causal, key_mask) from the masks the model builds, and refuses any other mask."""
    B, T, S = 2, 3, 5
    key = np.array([[False, True, True, True, True], [True] * 5])
    assert _structure(None, B, T, S) == (False, None)
    causal, km = _structure(causal_mask(T, S), B, T, S)
    assert causal and km is None
    causal, km = _structure(key[:, None, None, :], B, 1, S)
    assert not causal and np.array_equal(km, key)
    causal, km = _structure(causal_mask(T, S) & key[:, None, None, :], B, T, S)
    assert causal and np.array_equal(km, key)
    odd = causal_mask(T, S).copy()
    odd[0, 0] = False
    with pytest.raises(ValueError, match="causal_mask"):
        _structure(odd, B, T, S)
    with pytest.raises(ValueError, match="one mask for all heads"):
        _structure(np.ones((B, 4, T, S), dtype=bool), B, T, S)


def test_backend_name_resolves_to_these_ops():
    """refimpl.gpt2's backend table maps "numba" to accel.numba_cpu.gpt2.OPS (generate(..., backend="numba"))."""
    from refimpl.gpt2.model import get_ops

    assert get_ops("numba") is OPS
