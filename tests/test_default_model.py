"""The shipped default model (refimpl/data/default, made by scripts/train_default.py).

Proof: it loads with no path, generates Shakespeare-like text from "ROMEO:",
and its held-out loss beats a bigram model counted on the same training tokens by a clear
margin (both in nats per token, printed).
"""

import json
import math
from pathlib import Path

import pytest

from refimpl import gpt2

from train_script import train_default

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model():
    return gpt2.load()


def test_default_model_loads_with_no_path(model):
    card = (gpt2.DEFAULT_MODEL_DIR / "MODEL_CARD.md").read_text()
    assert model.tokenizer is not None
    cfg = json.loads((gpt2.DEFAULT_MODEL_DIR / "config.json").read_text())
    assert (model.config.n_layer, model.config.n_embd, model.config.vocab_size) == (
        cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"])
    assert model.params.nbytes() <= 15e6, "the shipped weights must stay small"
    assert "train_default.py" in card


def test_default_model_continues_romeo_with_english(model):
    g = gpt2.generate(model, "ROMEO:", max_new_tokens=60, do_sample=True, temperature=0.8, top_k=40, seed=0,
                      eos_token_id=None)
    print("\nROMEO:" + g.text)
    words = [w.strip(".,;:!?'\"-").lower() for w in g.text.split()]
    words = [w for w in words if w]
    common = {"the", "and", "i", "to", "of", "a", "my", "you", "that", "is", "in", "not", "it", "me", "with",
              "be", "your", "his", "for", "this", "he", "thou", "thy", "have", "but", "what", "so", "will", "thee",
              "as", "we", "our", "her", "shall", "him", "all", "do", "no", "by", "are", "o", "lord", "sir", "good"}
    assert len(words) >= 20
    share = sum(w in common for w in words) / len(words)
    print(f"share of the most common English words: {share:.2f}")
    assert share >= 0.15, "a continuation of Shakespeare-like English has many function words"
    assert sum(c.isalpha() or c.isspace() or c in ".,;:!?'-\n" for c in g.text) / len(g.text) > 0.95


def test_held_out_loss_beats_bigram_baseline(model):
    """The model against an add-k bigram model counted on the training plays, on the same held-out predictions:
    the evaluation's windows and every held-out prediction (scripts/train_default.py --baselines prints these)."""
    td = train_default()
    data = td._fetch_data()
    train_w, val_w, _ = td.load_works(data)
    tok = model.tokenizer
    val_ids = td.encode_works(tok, val_w)
    train_ids = td.encode_works(tok, train_w)
    bigram, k = td.bigram_baseline(train_ids, val_ids, model.config.vocab_size)
    same = td.same_token_losses(model.params, model.config, train_ids, val_ids, td.SETTINGS, k)
    for name, r in same.items():
        print(f"\n{name}: {r['predictions']:,} predictions, model {r['model']:.3f} nats/token (perplexity "
              f"{math.exp(r['model']):.1f}), bigram (k={k}) {r['bigram']:.3f} ({math.exp(r['bigram']):.1f})")
        assert r["model"] < r["bigram"] - 0.3
    # every held-out prediction but the last few
    assert same["all_held_out"]["bigram"] == pytest.approx(bigram, abs=0.01)
