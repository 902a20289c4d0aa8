"""python -m refimpl embed [--model PATH] [--similarity] [--raw] [--digits N] TEXT...

Sentence embeddings with the BERT encoder (default: all-MiniLM-L6-v2, fetched by scripts/fetch_data.py).

    python -m refimpl embed "A man is eating." "Someone eats food."          # one vector per line
    python -m refimpl embed --similarity "A man is eating." "Someone eats food." "A cat."
    printf 'one\\ntwo\\n' | python -m refimpl embed --similarity -          # "-": lines of stdin

Without --similarity each text gives one line: the text (its tabs and line breaks printed as
spaces), a tab, then its C numbers; "-" skips blank lines of stdin, an argument "" is embedded. With
--similarity the N x N cosine-similarity matrix is printed (rows and columns in input order).
--raw skips the L2 normalization (the mean-pooled vectors as they are; cosines are unchanged).
Errors (a missing model, no text) print one line on stderr and return 2.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .._threads import one_blas_thread_for

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m refimpl embed",
                                description="Sentence embeddings (mean pooling + L2) with a BERT encoder.")
    p.add_argument("texts", nargs="+", metavar="TEXT", help='sentences to embed; "-" reads one per line from stdin')
    p.add_argument("--model", default=None, metavar="PATH",
                   help="BERT model directory (default: all-MiniLM-L6-v2 from .cache/, fetched by "
                        "scripts/fetch_data.py)")
    p.add_argument("--similarity", action="store_true", help="print the cosine-similarity matrix instead")
    p.add_argument("--raw", action="store_true", help="do not L2-normalize the embeddings")
    p.add_argument("--digits", type=int, default=6, help="decimal places printed (default 6)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default 32)")
    return p


def _one_line(text: str) -> str:
    """The text as printed: tabs, carriage returns and newlines as spaces, so each output line is one
    text followed by a tab and its vector (or a label)."""
    return text.replace("\r\n", " ").translate({ord("\t"): " ", ord("\r"): " ", ord("\n"): " "})


def _texts(args_texts: list[str]) -> list[str]:
    out = []
    for t in args_texts:
        if t == "-":
            out.extend(line.rstrip("\r\n") for line in sys.stdin if line.strip())  # (CRLF input too)
        else:
            out.append(t)
    return out


def main(argv: list[str]) -> int:
    """Run `embed` with the arguments that follow it; returns the exit status (0 ok, 2 bad input)."""
    args = build_parser().parse_args(argv)
    from . import embed, load

    try:
        if args.digits < 0 or args.digits > 12:
            raise ValueError(f"--digits must lie in 0 .. 12; got {args.digits}")
        texts = _texts(args.texts)
        if not texts:
            raise ValueError("no text to embed (stdin was empty)")
        model = load(args.model)
        one_blas_thread_for(model.config)  # python -m refimpl: a small model runs on one BLAS thread
        e = embed(model, texts, batch_size=args.batch_size, normalize=not args.raw)  # [N, C]
    except (ValueError, TypeError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    d = args.digits
    if args.similarity:
        u = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        sim = u @ u.T  # [N, N]
        width = d + 4
        for i, t in enumerate(texts):
            label = _one_line(t)
            label = label if len(label) <= 40 else label[:37] + "..."
            print(f"[{i}] {label}")
        print(" " * 5 + "".join(f"{f'[{j}]':>{width}s}" for j in range(len(texts))))
        for i in range(len(texts)):
            print(f"{f'[{i}]':5s}" + "".join(f"{sim[i, j]:{width}.{d}f}" for j in range(len(texts))))
    else:
        for t, v in zip(texts, e):
            print(_one_line(t) + "\t" + " ".join(f"{x:.{d}f}" for x in v))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
