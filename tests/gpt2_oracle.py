"""Shared test helper: a random-weight Hugging Face GPT-2 (the oracle) and its refimpl twin.

`hf_gpt2(config, seed=...)` builds `transformers.GPT2LMHeadModel` from a refimpl
`GPT2Config` with a fixed seed, in eval mode, and randomizes EVERY parameter (HF's own
init sets biases to 0 and LayerNorm gains to 1, which would leave bias and gain bugs
invisible). `hf_to_params(model, dtype)` converts its state dict to `GPT2Params` through
`GPT2Params.from_named_tensors` (Hugging Face names without the `transformer.` prefix;
the tied `lm_head.weight` is dropped). No download, no network.

Other test files may import it:

    from gpt2_oracle import oracle_pair, SMALL_CONFIGS
    hf, params = oracle_pair(config, seed=0, dtype=np.float32)
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.gpt2 import GPT2Config, GPT2Params

torch = pytest.importorskip("torch", reason="the Hugging Face oracle needs torch (pip install -e .[oracle])")
transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face oracle needs transformers (pip install -e .[oracle])")

# The oracle models are tiny: one torch thread. On a loaded 2-core machine torch's OpenMP
# threads spin-wait and make HF `generate` 10-25x slower (measured: 1.3 s -> 0.08 s per call).
torch.set_num_threads(1)

__all__ = ["hf_gpt2", "hf_to_params", "oracle_pair", "hf_logits", "max_rel_diff", "ONE_HEAD", "WIDE_HEADS",
           "TINY", "ODD", "SMALL_CONFIGS", "GPT2_SMALL"]

# Named configs. ODD: 3 heads of 32, 5 layers, vocabulary 1000.
TINY = GPT2Config(vocab_size=97, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                  bos_token_id=96, eos_token_id=96)
ODD = GPT2Config(vocab_size=1000, n_positions=64, n_embd=96, n_layer=5, n_head=3,
                 bos_token_id=999, eos_token_id=999)
ONE_HEAD = GPT2Config(vocab_size=211, n_positions=40, n_embd=24, n_layer=3, n_head=1,
                      bos_token_id=0, eos_token_id=0)
WIDE_HEADS = GPT2Config(vocab_size=500, n_positions=48, n_embd=80, n_layer=2, n_head=5,
                        bos_token_id=499, eos_token_id=499)
SMALL_CONFIGS = {"tiny": TINY, "odd_3x32_5L_V1000": ODD, "one_head": ONE_HEAD, "5_heads_of_16": WIDE_HEADS}
GPT2_SMALL = GPT2Config()  # V=50257, n_positions=1024, C=768, 12 layers, 12 heads

_TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def hf_gpt2(config: GPT2Config, *, seed: int = 0, dtype=np.float32, wte_std: float = 0.02, weight_std: float = 0.02):
    """A random GPT2LMHeadModel (eval mode, eager attention) with the shapes of `config`.

    Every parameter is drawn from a seeded normal: wte N(0, wte_std^2), the other matrices
    (wpe and the linear weights) N(0, weight_std^2), biases N(0, 0.02^2), LayerNorm gains
    1 + N(0, 0.1^2) and biases N(0, 0.05^2). The defaults are HF's scale; larger stds (0.3)
    give peaked, varied next-token distributions, which decoding tests want.
    """
    hf_config = transformers.GPT2Config(
        attn_implementation="eager", vocab_size=config.vocab_size, n_positions=config.n_positions,
        n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
        layer_norm_epsilon=config.layer_norm_epsilon,
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(hf_config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if name.endswith("wte.weight"):
                p.copy_(noise * wte_std)
            elif ".ln_" in name or name.endswith("ln_f.weight") or name.endswith("ln_f.bias"):
                p.copy_(1.0 + 0.1 * noise if name.endswith("weight") else 0.05 * noise)
            else:
                p.copy_((weight_std if p.ndim == 2 else 0.02) * noise)
    model = model.to(_TORCH_DTYPE[np.dtype(dtype)]).eval()
    model.generation_config.pad_token_id = config.eos_token_id
    return model


def hf_to_params(model, config: GPT2Config, *, dtype=np.float32) -> GPT2Params:
    """Convert an HF GPT2LMHeadModel's state dict to GPT2Params (drops `transformer.`, lm_head)."""
    tensors = {}
    for name, t in model.state_dict().items():
        if not name.startswith("transformer."):
            continue  # lm_head.weight is tied to wte
        short = name[len("transformer."):]
        if short.endswith(".attn.bias") or short.endswith(".attn.masked_bias"):
            continue  # causal-mask buffers in older transformers versions
        tensors[short] = t.detach().cpu().numpy()
    return GPT2Params.from_named_tensors(tensors, config, dtype=dtype)


def oracle_pair(config: GPT2Config, *, seed: int = 0, dtype=np.float32, wte_std: float = 0.02):
    """(hf_model, params): the same random weights in Hugging Face and in refimpl."""
    model = hf_gpt2(config, seed=seed, dtype=dtype, wte_std=wte_std)
    return model, hf_to_params(model, config, dtype=dtype)


def hf_logits(model, ids, attention_mask=None) -> np.ndarray:
    """HF logits [B, T, V] as a NumPy array (position ids derived from the mask as HF does)."""
    ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    kwargs = {}
    if attention_mask is not None:
        am = torch.as_tensor(np.asarray(attention_mask, dtype=np.int64))
        pos = am.cumsum(-1) - 1
        pos = pos.masked_fill(am == 0, 1)
        kwargs = {"attention_mask": am, "position_ids": pos}
    with torch.no_grad():
        return model(ids_t, use_cache=False, **kwargs).logits.numpy()


def max_rel_diff(a, b) -> float:
    """max|a - b| / max|b|: the largest error relative to the reference's scale."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
