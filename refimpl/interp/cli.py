"""python -m refimpl inspect SUBCOMMAND [--model PATH] [--out DIR] ...: pictures and tables of what a decoder does inside.

    python -m refimpl inspect lens      --text "Friends, Romans, countrymen"      # logit lens
    python -m refimpl inspect attention --text "..."                             # attention heatmaps
    python -m refimpl inspect sinks     --file held_out.txt [--k 1] [--chunks 8] # attention-sink statistics
    python -m refimpl inspect streaming --file held_out.txt [--n-sink 4] [--window W] [--tokens N]
    python -m refimpl inspect steer     [--pos TEXT ...] [--neg TEXT ...] [--prompt TEXT] [--layer L] [--target TOKEN]
    python -m refimpl inspect patch     [--source TEXT --target TEXT --answer-a TOKEN --answer-b TOKEN]
    python -m refimpl inspect encodings                                          # sinusoidal, RoPE, ALiBi

--model PATH is any decoder refimpl.load reads: GPT-2 or a LLaMA-family directory (default:
the GPT-2 shipped with the package); `streaming` is GPT-2's only (learned positions).
Input text comes from --text, --file or --ids ("1 2 3", for models without a tokenizer; steer
takes --pos-ids / --neg-ids / --prompt-ids, patch --source-ids / --target-ids, and a target or
answer token may be given as its id); lens / attention / sinks / steer / patch have built-in
default texts. Every subcommand writes
PNG + JSON files under --out (default ./inspect_out), prints a short table and the paths
written. Errors print one line and return 2.

Speed: `python -m refimpl` runs these with one BLAS thread on a small model (the default one;
refimpl.__main__.blas_threads_for), where threaded OpenBLAS is slower (a 256-token forward of the
4-layer default model: 14 ms with one thread, 369 ms with two on a busy 2-core machine); an
OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS you set wins.

Files written:
    lens       lens.png (top-1 token per layer and position), lens.json (top-k ids, tokens, probs)
    attention  attention.png (L x H heatmaps), attention.json (weights, tokens)
    sinks      sinks.png (share / uniform per layer and head), sinks.json (table rows)
    streaming  streaming.png (running perplexity per method), streaming.json (table rows)
    steer      steer.png (change of log p(target) against alpha), steer.json (effects, generations)
    patch      patch.png (effect per layer and position), patch.json (effects, tokens)
    encodings  sinusoidal.png, rope.png, alibi.png, encodings.json
"""

from __future__ import annotations

import argparse
import math
import json
import sys
from pathlib import Path

import numpy as np

__all__ = ["main", "build_parser"]

# Public-domain text (Shakespeare, Julius Caesar III.ii) used when no input is given.
DEFAULT_TEXT = ("Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him. "
                "The evil that men do lives after them; the good is oft interred with their bones; "
                "so let it be with Caesar. The noble Brutus hath told you Caesar was ambitious: "
                "if it were so, it was a grievous fault, and grievously hath Caesar answer'd it.")
DEFAULT_POS = ["I love thee", "O my sweet love", "My gentle love, my dear", "How I do love thee",
               "Sweet love, kind heart"]
DEFAULT_PROMPT = "My lord, I"
DEFAULT_NEG = ["I hate thee", "O my bitter foe", "My cruel foe, my enemy", "How I do hate thee",
               "Vile hate, cold heart"]
# Patching default: the runs differ in one name; does the model copy it at the end, and through which layers?
DEFAULT_SOURCE = "Good morrow, noble Caesar. Farewell, noble"
DEFAULT_TARGET = "Good morrow, noble Romeo. Farewell, noble"


class _Usage(Exception):
    pass


# ----------------------------------------------------------------------------- shared helpers

def _load(path):
    """The decoder at `path` (refimpl.load): a GPT2Model or a LlamaModel; a BERT encoder is refused."""
    from refimpl.models import load

    from ._family import decoder_of

    try:
        model = load(path)
    except (OSError, ValueError) as e:  # a missing folder, unreadable weights, a malformed config: name the flag
        if path is None:
            raise
        msg = str(e)
        raise _Usage(f"--model {path}: {msg.removeprefix(f'{path}: ')}") from None
    try:
        decoder_of(model)
    except TypeError:
        raise _Usage(f"inspect looks inside decoders (GPT-2, the LLaMA family); {path} holds a "
                     f"{type(model).__name__} (for a BERT encoder see: python -m refimpl embed --help)") from None
    return model


def _context(model, default: int = 10**9) -> int:
    """The most positions one sequence may span (`default` where the model sets no limit)."""
    from ._family import decoder_of

    limit = decoder_of(model).context(model.config)
    return default if limit is None else limit


def _n_layers(model) -> int:
    from ._family import decoder_of

    return decoder_of(model).n_layers(model.config)


def _no_tokenizer(model, path, what: str = "the input", flag: str = "--ids") -> _Usage:
    """The error for text given to a model without a tokenizer: why it has none, and the flag to use instead."""
    from refimpl.llama import LlamaModel

    why = "this model has no tokenizer files"
    if isinstance(model, LlamaModel) and path is not None:
        from refimpl.models import tokenizer_absence

        p = Path(path)
        why = tokenizer_absence(p if p.is_dir() else p.parent) or why
    return _Usage(f"{why}; give {what} as token ids with {flag}")


def _ids(model, args, *, default: str | None = DEFAULT_TEXT, limit: int | None = None,
         flag: str = "--ids") -> np.ndarray:
    """Token ids from --ids (each checked against the vocabulary), --text or --file (else the default text), cut to `limit` tokens."""
    from refimpl.gpt2.model import parse_token_ids

    given = [n for n in ("ids", "text", "file") if getattr(args, n, None) is not None]
    if len(given) > 1:
        raise _Usage(f"give one of --ids, --text, --file; got {', '.join('--' + g for g in given)}")
    if args.ids is not None:
        ids = parse_token_ids(args.ids, model.config.vocab_size, flag=flag)
    else:
        if args.text is not None:
            text = args.text
        elif getattr(args, "file", None) is not None:
            try:
                text = Path(args.file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise _Usage(f"--file {args.file}: cannot read it as UTF-8 text "
                             f"({e.strerror if isinstance(e, OSError) else e})") from None
        elif default is not None:
            text = default
        else:
            raise _Usage("give the input: --file PATH, --text TEXT or --ids '1 2 3'")
        if model.tokenizer is None:
            raise _no_tokenizer(model, getattr(args, "model", None), flag=flag)
        ids = model.tokenizer.encode(text)
    if not ids:
        raise _Usage(f"the input ({_given_flag(args, flag)}) has no tokens; give at least one")
    if limit is not None:
        ids = ids[:limit]
    return np.asarray(ids, dtype=np.int64)


def _given_flag(args, ids_flag: str) -> str:
    """The flag the input came from: the --ids-style flag, --text, --file, or the default text."""
    if getattr(args, "ids", None) is not None:
        return ids_flag
    if getattr(args, "text", None) is not None:
        return getattr(args, "text_flag", None) or "--text"
    return "--file" if getattr(args, "file", None) is not None else "the default text"


def _token(model, text_or_id: str, what: str) -> int:
    """One token id: an integer string in [0, V), or a text that is exactly one token."""
    V = model.config.vocab_size
    try:
        tok = int(text_or_id)
    except ValueError:
        tok = None
    if tok is not None:
        if not 0 <= tok < V:
            raise _Usage(f"{what} {tok} is outside the vocabulary [0, {V})")
        return tok
    if model.tokenizer is None:
        raise _Usage(f"{what} must be a token id (this model has no tokenizer)")
    t = model.tokenizer.encode(text_or_id)
    if len(t) != 1:
        raise _Usage(f"{what} must be one token; {text_or_id!r} is {len(t)} tokens {t}: give a one-token text "
                     "or a token id")
    return t[0]


def _labels(model, ids) -> list[str]:
    from ._plot import token_labels

    return token_labels(model, ids)


def _write_json(out: Path, name: str, data) -> Path:
    from .._files import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    p = out / name  # temp file + rename: a symlink planted at p is replaced, never written through
    write_text_atomic(p, json.dumps(data, indent=1, default=float) + "\n")
    return p


def _table(header: list[str], rows: list[list], widths: list[int] | None = None) -> str:
    from ._plot import number

    cells = [[str(h) for h in header]] + [[number(c) if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = widths or [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c[:w].ljust(w) for c, w in zip(r, widths)) for r in cells)


def _quoted(model, tok: int) -> str:
    """A token for a title or a message: its text in quotes (token_labels' form), or `token ID` without a tokenizer."""
    return f"token {tok}" if getattr(model, "tokenizer", None) is None else f"'{_labels(model, [tok])[0]}'"


def _done(paths) -> None:
    for p in paths:
        print(f"wrote {p}")


# ----------------------------------------------------------------------------- subcommands

def cmd_lens(args) -> int:
    from .logit_lens import MAX_LENS_POSITIONS, lens_top_tokens, logit_lens, plot_logit_lens

    model = _load(args.model)
    V = model.config.vocab_size
    if not 1 <= args.top_k <= V:
        raise _Usage(f"--top-k must lie in 1 .. {V} (the vocabulary size); got {args.top_k}")
    ids = _ids(model, args, limit=min(args.max_tokens, _context(model)))
    lens = logit_lens(model, ids)
    top, prob = lens_top_tokens(lens, args.top_k)
    n_rows = lens.shape[0]
    names = ["embed"] + [f"after block {i}" for i in range(n_rows - 1)]
    data = {"tokens": _labels(model, ids), "ids": ids.tolist(), "rows": names,
            "top_ids": top.tolist(), "top_tokens": [[_labels(model, t) for t in row] for row in top],
            "top_probs": prob.round(6).tolist()}
    out = Path(args.out)
    paths = [plot_logit_lens(model, ids, lens, out / "lens.png"), _write_json(out, "lens.json", data)]
    T, drawn = len(ids), min(len(ids), MAX_LENS_POSITIONS)
    show = list(range(max(0, T - 8), T))
    print(f"top-1 guess per layer at the last {len(show)} of {T} positions; lens.png shows "
          + (f"all {T}" if drawn == T else f"the last {drawn} (at most {MAX_LENS_POSITIONS} fit a picture)")
          + f", lens.json all {T} with the top {args.top_k}")
    print(_table(["layer \\ input"] + [_labels(model, ids)[t] for t in show],
                 [[names[r]] + [data["top_tokens"][r][t][0] for t in show] for r in range(n_rows)]))
    _done(paths)
    return 0


def cmd_attention(args) -> int:
    from .attention_maps import attention_weights, plot_attention_maps

    model = _load(args.model)
    ids = _ids(model, args, limit=min(args.max_tokens, _context(model)))
    w = attention_weights(model, ids)  # [L, H, T, T]
    L, H, T, _ = w.shape
    ent = 0.0 - np.sum(np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0), axis=-1).mean(axis=-1)  # [L, H]
    prev = np.mean([w[:, :, i, i - 1] for i in range(1, T)], axis=0) if T > 1 else np.zeros((L, H))
    first = w[..., 0].mean(axis=-1)
    data = {"tokens": _labels(model, ids), "ids": ids.tolist(), "weights": w.round(5).tolist(),
            "mean_entropy": ent.tolist(), "mean_on_previous": prev.tolist(), "mean_on_first": first.tolist()}
    out = Path(args.out)
    paths = [plot_attention_maps(model, ids, w, out / "attention.png"), _write_json(out, "attention.json", data)]
    print(_table(["layer", "head", "entropy", "on first", "on previous"],
                 [[l, h, float(ent[l, h]), float(first[l, h]), float(prev[l, h])] for l in range(L) for h in range(H)]))
    _done(paths)
    return 0


def cmd_sinks(args) -> int:
    from .attention_maps import attention_weights, plot_sink_statistics, sink_share, sink_table, uniform_sink_share

    model = _load(args.model)
    context = _context(model, default=1024)
    T = context if args.max_tokens is None else min(args.max_tokens, context)
    if args.chunks < 1:
        raise _Usage(f"--chunks must be >= 1; got {args.chunks}")
    ids = _ids(model, args, limit=args.chunks * T)
    n = len(ids)
    if n < args.chunks * T:  # too few tokens for --chunks chunks of T
        if args.max_tokens is None and n >= args.chunks:  # chunk length not asked for: shorten the chunks
            print(f"note: the input has {n} tokens, fewer than --chunks {args.chunks} x {T} (the context); "
                  f"using {args.chunks} chunks of {n // args.chunks} tokens (--max-tokens sets the chunk length)",
                  file=sys.stderr)
            T = n // args.chunks
        elif args.chunks > 1:
            use = max(1, n // min(T, n))
            print(f"note: the input has {n} tokens: {use} chunk(s) of {min(T, n)} tokens, not --chunks "
                  f"{args.chunks} (that needs {args.chunks} x {T} = {args.chunks * T} tokens; give a longer "
                  f"--file, or a smaller --max-tokens)", file=sys.stderr)
    T = min(T, n)
    for k in args.k:  # every --k checked before any work
        if not 1 <= k <= T:
            raise _Usage(f"--k must lie in 1 .. T={T}; got {k}")
    chunks = [ids[c * T:(c + 1) * T] for c in range(len(ids) // T)]
    # share is linear in w, so the mean of the chunks' shares is the share of their mean weights
    w = np.mean([attention_weights(model, c) for c in chunks], axis=0)  # [L, H, T, T]
    out = Path(args.out)
    result = {"tokens_per_chunk": int(T), "chunks": len(chunks), "tables": {}}
    paths = []
    for k in args.k:
        rows = sink_table(w, k)
        result["tables"][str(k)] = rows
        uniform = uniform_sink_share(T, T, k)
        name = "sinks.png" if k == args.k[0] else f"sinks_k{k}.png"
        paths.append(plot_sink_statistics(sink_share(w, k), uniform, out / name, k=k))
        print(f"attention on the first {k} token(s), T={T} ({len(chunks)} chunk(s) averaged); "
              f"a uniform causal head gives {uniform:.4f}")
        print(_table(["layer", "head", "share", "ratio"], [[r["layer"], r["head"], r["share"], r["ratio"]] for r in rows]))
    paths.append(_write_json(out, "sinks.json", result))
    _done(paths)
    return 0


def cmd_streaming(args) -> int:
    from ._plot import pyplot, save
    from .streaming import streaming_perplexity

    from refimpl.gpt2 import GPT2Model

    model = _load(args.model)
    if not isinstance(model, GPT2Model):
        raise _Usage(f"streaming is implemented for GPT-2 (its positions are learned and absolute; "
                     f"refimpl.interp.streaming); {args.model} is a {model.config.model_type} model")
    P = model.config.n_positions
    if args.window is None and not 0 <= args.n_sink < P:
        raise _Usage(f"--n-sink must lie in 0 .. n_positions - 1 = {P - 1} (the window gets the rest of the "
                     f"context); got {args.n_sink}")
    window = P - args.n_sink if args.window is None else args.window
    if args.n_sink < 0 or window < 1 or args.n_sink + window > P:  # checked before the note below
        raise _Usage(f"--n-sink must be >= 0 and --window >= 1 with n_sink + window <= n_positions = {P}; "
                     f"got n_sink {args.n_sink}, window {window}")
    if args.tokens is not None and args.tokens < 1:
        raise _Usage(f"--tokens must be >= 1; got {args.tokens}")
    ids = _ids(model, args, default=None, limit=args.tokens or 4 * P)
    if len(ids) <= args.n_sink + window:
        print(f"note: {len(ids)} tokens fit in the cache of {args.n_sink + window}: nothing is evicted, so the three "
              "methods agree and 'ppl after M' is empty (nan); give more tokens to compare them", file=sys.stderr)
    rows, nlls = streaming_perplexity(model, ids, n_sink=args.n_sink, window=window, return_nll=True)
    M = args.n_sink + window
    out = Path(args.out)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    span = max(1, min(64, len(ids) // 8))
    for name, nll in nlls.items():
        local = np.convolve(nll, np.ones(span) / span, mode="valid")  # mean nll over the last `span` predictions
        ax.plot(np.arange(span, len(nll) + 1), np.exp(local), label=name, lw=1)
    ax.axvline(M, color="gray", ls=":", lw=1)
    ax.set_xlabel(f"tokens predicted (the cache holds M = {M}; n_positions = {P}; dotted: first eviction)")
    ax.set_ylabel(f"perplexity of the last {span} tokens")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("StreamingLLM on GPT-2: sliding window vs sinks + window vs recompute", fontsize=9)
    paths = [save(fig, out / "streaming.png"),
             _write_json(out, "streaming.json", {"n_positions": P, "cache": M, "rows": rows})]
    print(f"{len(ids)} tokens, cache M = {M} (n_positions {P})")
    print(_table(["method", "n_sink", "window", "ppl", "ppl after M", "ms/token"],
                 [[r["method"], r["n_sink"], r["window"], r["ppl"], r["ppl_after_M"], 1e3 * r["seconds_per_token"]]
                  for r in rows]))
    _done(paths)
    return 0


def cmd_steer(args) -> int:
    from ._plot import pyplot, save
    from .steering import steered_generate, steering_effect, steering_vector

    if any(not math.isfinite(a) for a in args.alpha or ()):
        raise _Usage(f"--alpha must be finite; got {args.alpha}")
    if args.max_new_tokens < 0:
        raise _Usage(f"--max-new-tokens must be >= 0; got {args.max_new_tokens}")
    model = _load(args.model)

    def prompts(texts, id_lists, flag):  # each text, then each id list: token ids [T] per prompt
        return ([_ids(model, argparse.Namespace(ids=None, text=t, file=None, model=args.model,
                                                text_flag=flag.removesuffix("-ids")), flag=flag)
                 for t in texts or ()] +
                [_ids(model, argparse.Namespace(ids=i, text=None, file=None), flag=flag) for i in id_lists or ()])

    pos = prompts(args.pos if args.pos or args.pos_ids else DEFAULT_POS, args.pos_ids, "--pos-ids")
    neg = prompts(args.neg if args.neg or args.neg_ids else DEFAULT_NEG, args.neg_ids, "--neg-ids")
    L = _n_layers(model)
    layer = L // 2 if args.layer is None else args.layer
    if not 0 <= layer < L:
        raise _Usage(f"--layer must lie in 0 .. {L - 1} (a block of this {L}-block model); got {layer}")
    d = steering_vector(model, pos, neg, layer=layer)
    if args.prompt is not None and args.prompt_ids is not None:
        raise _Usage("give one of --prompt TEXT or --prompt-ids IDS, not both")
    text = DEFAULT_PROMPT if args.prompt is None and args.prompt_ids is None else args.prompt
    prompt = _ids(model, argparse.Namespace(ids=args.prompt_ids, text=text, file=None, model=args.model,
                                            text_flag="--prompt"), flag="--prompt-ids")
    target = _token(model, args.target, "--target")
    alphas = args.alpha or [0.0, 1.0, 2.0, 4.0, 8.0]
    if 0.0 not in alphas:
        alphas = [0.0, *alphas]
    rows = steering_effect(model, prompt, d, layer=layer, alphas=alphas, target=target)
    gens = {}
    for a in alphas:
        g = steered_generate(model, prompt, d, layer=layer, alpha=a, max_new_tokens=args.max_new_tokens)
        gens[str(a)] = model.tokenizer.decode(g) if model.tokenizer is not None else g
    out = Path(args.out)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["alpha"] for r in rows], [r["delta_logprob"] for r in rows], marker="o")
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xlabel("alpha (multiple of the direction added at layer %d)" % layer)
    ax.set_ylabel(f"change of log p({_quoted(model, target)})")
    ax.set_title("steering by mean-difference direction", fontsize=9)
    data = {"layer": layer, "target": target, "direction_norm": float(np.linalg.norm(d)), "effects": rows,
            "generations": gens, "prompt": prompt.tolist()}
    paths = [save(fig, out / "steer.png"), _write_json(out, "steer.json", data)]
    print(f"direction at blocks.{layer}.resid_pre, |d| = {np.linalg.norm(d):.3f}; target {_quoted(model, target)} "
          f"(id {target})")
    print(_table(["alpha", "log p(target)", "change", "continuation"],
                 [[r["alpha"], r["logprob"], r["delta_logprob"], repr(gens[str(r["alpha"])])[:60]] for r in rows],
                 [6, 13, 8, 60]))
    _done(paths)
    return 0


def cmd_patch(args) -> int:
    from .patching import logit_diff_metric, patch_points, patch_sweep, plot_patching

    model = _load(args.model)

    def seq(text, ids_text, what, default):
        if text is not None and ids_text is not None:
            raise _Usage(f"give one of --{what} TEXT or --{what}-ids IDS, not both")
        if text is None and ids_text is None:
            text = default
        return _ids(model, argparse.Namespace(ids=ids_text, text=text, file=None, model=args.model),
                    flag=f"--{what}-ids")

    src = seq(args.source, args.source_ids, "source", DEFAULT_SOURCE)
    tgt = seq(args.target, args.target_ids, "target", DEFAULT_TARGET)
    if len(src) != len(tgt):
        raise _Usage(f"the source and the target (--source / --source-ids, --target / --target-ids) must have the "
                     f"same number of tokens; got {len(src)} and {len(tgt)}")
    a, b = _token(model, args.answer_a, "--answer-a"), _token(model, args.answer_b, "--answer-b")
    if a == b:
        raise _Usage(f"--answer-a and --answer-b are the same token {_quoted(model, a)} (id {a}): the metric "
                     "z[a] - z[b] would be 0 in every run; give two different tokens")
    metric = logit_diff_metric(a, b)
    effects = patch_sweep(model, src, tgt, metric)
    out = Path(args.out)
    data = {"source": src.tolist(), "target": tgt.tolist(), "answer_a": a, "answer_b": b,
            "rows": patch_points(model), "tokens": _labels(model, tgt), "effects": effects.tolist()}
    paths = [plot_patching(model, tgt, effects, out / "patch.png", source_ids=src,
                           title=f"patching: change of z[{_quoted(model, a)}] - z[{_quoted(model, b)}] "
                                 "at the last position"),
             _write_json(out, "patch.json", data)]
    labels = _labels(model, tgt)
    print(f"metric: logit[{_quoted(model, a)}] - logit[{_quoted(model, b)}] (ids {a}, {b}) at the last target position")
    print(_table(["row \\ position"] + labels[-8:],
                 [[n] + [float(v) for v in effects[r, -8:]] for r, n in enumerate(patch_points(model))]))
    _done(paths)
    return 0


# The largest encodings pictures worth drawing. The sinusoidal heatmap is about 460 pixels tall
# and 600 wide (3/5 of an 11 x 4.2 inch figure at 110 dpi): past 1024 positions or features,
# more than two rows or columns share a pixel and nothing more can be seen, while the P x P
# similarity map drawn beside it grows as P^2 (P = 1024: 8 MiB). ALiBi gets one 2.6-inch panel
# per head, four to a row: 64 heads is already 16 rows, a picture about 4600 pixels tall.
MAX_POSITIONS, MAX_DIM, MAX_HEADS = 1024, 1024, 64


def _check_encodings_args(args) -> None:
    """Each encodings flag within what its picture can show (bounds above), named when it is not."""
    if not 2 <= args.positions <= MAX_POSITIONS:
        raise _Usage(f"--positions must lie in 2 .. {MAX_POSITIONS} (rows of a heatmap about 460 pixels tall); "
                     f"got {args.positions}")
    if not 4 <= args.dim <= MAX_DIM or args.dim % 2:
        raise _Usage(f"--dim must be even and lie in 4 .. {MAX_DIM} (columns of a heatmap about 600 pixels wide); "
                     f"got {args.dim}")
    if not 1 <= args.heads <= MAX_HEADS:
        raise _Usage(f"--heads must lie in 1 .. {MAX_HEADS} (one panel per head, four to a row); got {args.heads}")


def cmd_encodings(args) -> int:
    from ..positional import alibi_slopes, rope_frequencies
    from .pictures import plot_alibi, plot_rope, plot_sinusoidal

    out = Path(args.out)
    p1, pe = plot_sinusoidal(out / "sinusoidal.png", n_positions=args.positions, d=args.dim)
    p2, _ = plot_rope(out / "rope.png", d=args.dim // 4 * 2 or 2, n_positions=args.positions // 2)
    p3, bias = plot_alibi(out / "alibi.png", n_heads=args.heads, T=16)
    data = {"sinusoidal": {"n_positions": args.positions, "d": args.dim, "pe_row_1": pe[1].tolist()},
            "rope": {"d": args.dim // 4 * 2 or 2, "frequencies": rope_frequencies(args.dim // 4 * 2 or 2).tolist()},
            "alibi": {"n_heads": args.heads, "slopes": alibi_slopes(args.heads).tolist(), "bias_row_15": bias[:, 15].tolist()}}
    paths = [p1, p2, p3, _write_json(out, "encodings.json", data)]
    print(_table(["head", "ALiBi slope"], [[h, float(s)] for h, s in enumerate(alibi_slopes(args.heads))]))
    _done(paths)
    return 0


# ----------------------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m refimpl inspect",
                                 description="Pictures and tables of a decoder's insides, GPT-2 or the LLaMA "
                                 "family (refimpl.interp).")
    sub = ap.add_subparsers(dest="sub", required=True)

    def common(p, *, text=True, max_tokens=True):
        p.add_argument("--model", default=None, metavar="PATH", help="GPT-2 or LLaMA-family model to load "
                       "(refimpl.load; default: the shipped GPT-2)")
        p.add_argument("--out", default="inspect_out", metavar="DIR", help="output folder (default ./inspect_out)")
        if text:
            p.add_argument("--text", help="input text")
            p.add_argument("--file", help="read the input text from this file")
            p.add_argument("--ids", help="input token ids, '1 2 3'")
        if max_tokens:
            p.add_argument("--max-tokens", type=int, default=48, help="use at most this many input tokens")

    p = sub.add_parser("lens", help="logit lens: each layer's top next-token guesses")
    common(p)
    p.set_defaults(max_tokens=16)
    p.add_argument("--top-k", type=int, default=5)
    p.set_defaults(func=cmd_lens)

    p = sub.add_parser("attention", help="attention heatmaps per layer and head")
    common(p)
    p.set_defaults(func=cmd_attention, max_tokens=16)

    p = sub.add_parser("sinks", help="attention-sink statistics per layer and head")
    common(p, max_tokens=False)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per chunk, at most (default: the context, shortened so that --chunks N chunks "
                   "fit the input)")
    p.add_argument("--k", type=int, action="append", help="first-k positions counted (repeatable; default 1)")
    p.add_argument("--chunks", type=int, default=1,
                   help="average over this many consecutive chunks of the input (each its own sequence)")
    p.set_defaults(func=cmd_sinks)

    p = sub.add_parser("streaming", help="StreamingLLM perplexity: window vs sinks + window vs recompute")
    common(p, max_tokens=False)
    p.add_argument("--n-sink", type=int, default=4)
    p.add_argument("--window", type=int, help="recent tokens kept (default n_positions - n_sink)")
    p.add_argument("--tokens", type=int, help="tokens of the input used (default 4 x n_positions)")
    p.set_defaults(func=cmd_streaming)

    p = sub.add_parser("steer", help="steering with a mean-difference direction")
    common(p, text=False, max_tokens=False)
    p.add_argument("--pos", action="append", help="prompt of the 'towards' set (repeatable)")
    p.add_argument("--neg", action="append", help="prompt of the 'away from' set (repeatable)")
    p.add_argument("--prompt", help=f"prompt to steer (default {DEFAULT_PROMPT!r})")
    p.add_argument("--pos-ids", action="append", help="a 'towards' prompt as token ids '1 2 3' (repeatable)")
    p.add_argument("--neg-ids", action="append", help="an 'away from' prompt as token ids (repeatable)")
    p.add_argument("--prompt-ids", help="the prompt to steer as token ids")
    p.add_argument("--target", default=" love", help="target token (text of one token, or an id)")
    p.add_argument("--layer", type=int, help="block whose input is steered (default: number of blocks // 2)")
    p.add_argument("--alpha", type=float, action="append", help="steering strength (repeatable)")
    p.add_argument("--max-new-tokens", type=int, default=20)
    p.set_defaults(func=cmd_steer)

    p = sub.add_parser("patch", help="activation patching over layers x positions")
    common(p, text=False, max_tokens=False)
    p.add_argument("--source", help=f"source (clean) text (default {DEFAULT_SOURCE!r})")
    p.add_argument("--target", help=f"target (corrupted) text, same token count (default {DEFAULT_TARGET!r})")
    p.add_argument("--source-ids", help="source as token ids")
    p.add_argument("--target-ids", help="target as token ids")
    p.add_argument("--answer-a", default=" Caesar", help="token whose logit counts + (text or id; default ' Caesar')")
    p.add_argument("--answer-b", default=" Romeo", help="token whose logit counts - (text or id; default ' Romeo')")
    p.set_defaults(func=cmd_patch)

    p = sub.add_parser("encodings", help="pictures of sinusoidal, RoPE and ALiBi encodings")
    p.add_argument("--out", default="inspect_out", metavar="DIR")
    p.add_argument("--positions", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.set_defaults(func=cmd_encodings)
    return ap


def main(argv: list[str]) -> int:
    """Run `inspect` with the arguments that follow it; returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        parser.print_usage(sys.stderr)
        print(f"error: give a subcommand first, one of: {', '.join(subs)} (python -m refimpl inspect --help); "
              f"got {'nothing' if not argv else argv[0]}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        if getattr(args, "max_tokens", 1) is not None and getattr(args, "max_tokens", 1) < 1:
            raise _Usage(f"--max-tokens must be >= 1; got {args.max_tokens}")
        if args.sub == "sinks":
            args.k = args.k or [1]
        if args.sub == "encodings":
            _check_encodings_args(args)
        return args.func(args)
    except (_Usage, ValueError, TypeError, OSError) as e:  # OSError: FileExistsError for --out, ...
        if isinstance(e, BrokenPipeError):
            raise  # refimpl.__main__ ends quietly
        out = getattr(args, "out", None)
        if isinstance(e, OSError) and out is not None and e.filename is not None and \
                Path(e.filename).resolve().is_relative_to(Path(out).resolve()):
            e = f"--out {out}: cannot write {e.filename} ({e.strerror})"
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
