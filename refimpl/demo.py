"""`python -m refimpl demo`: a short tour of what refimpl computes, each claim checked as it runs.

1. Masks (boolean, True = may attend) drawn as grids.
2. Positions: RoPE scores depend only on m - n; ALiBi's slopes.
3. Attention: grouped-query attention (4 query heads, 2 key/value heads) equals multi-head
   attention on keys and values repeated per group.
4. GPT-2 end to end on a small random-weight model written to disk in our format and read
   back: the weights read back equal those written, KV-cache decoding equals full
   recomputation, greedy continuation printed.
5. The GPT-2 tokenizer, when its ranks file has been fetched (scripts/fetch_data.py): the ids
   of a sample text equal tiktoken's (r50k_base, written down here) and decode back to it.
6. The accel kernels against their refimpl twins, when Numba is installed.
Exit status 0 when every check that ran held; the last line names the sections skipped.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from . import masks
from .attention import grouped_query_attention, scaled_dot_product_attention
from .positional import alibi_slopes, apply_rope

REPO = Path(__file__).resolve().parent.parent


def _grid(m: np.ndarray) -> list[str]:
    return ["".join("#" if v else "." for v in row) for row in m]


def _check(ok: bool, what: str, failures: list) -> None:
    print(f"  [{'ok' if ok else 'FAILED'}] {what}")
    if not ok:
        failures.append(what)


def main() -> int:
    failures: list[str] = []
    skipped: list[str] = []
    rng = np.random.default_rng(0)

    print("1. Masks, T = S = 8 (row = query, column = key, # = may attend)")
    shown = {
        "causal": masks.causal_mask(8),
        "local window 3": masks.local_window_mask(8, window=3),
        "sink 2 + window 3": masks.sink_window_mask(8, n_sink=2, window=3),
        "strided, stride 3": masks.strided_mask(8, stride=3),
    }
    names = list(shown)
    print("   " + "".join(f"{n:<20}" for n in names))
    for r in range(8):
        print("   " + "".join(f"{_grid(shown[n])[r]:<20}" for n in names))
    print("   Queries at the end of a longer key sequence (T=3, S=8), as in cached decoding:")
    for row in _grid(masks.causal_mask(3, 8)):
        print("   " + row)

    print("\n2. Positions")
    q, k = rng.standard_normal(64), rng.standard_normal(64)
    s1 = apply_rope(q[None], np.array([5]))[0] @ apply_rope(k[None], np.array([2]))[0]
    s2 = apply_rope(q[None], np.array([105]))[0] @ apply_rope(k[None], np.array([102]))[0]
    print(f"   RoPE: <rope(q,5), rope(k,2)> = {s1:.6f}, <rope(q,105), rope(k,102)> = {s2:.6f}")
    _check(abs(s1 - s2) < 1e-9 * max(1.0, abs(s1)), "RoPE score depends only on m - n", failures)
    print("   ALiBi slopes, 8 heads:", " ".join(f"{s:g}" for s in alibi_slopes(8)))

    print("\n3. Attention")
    qh = rng.standard_normal((2, 4, 5, 8))  # H = 4 query heads
    kh, vh = rng.standard_normal((2, 2, 7, 8)), rng.standard_normal((2, 2, 7, 8))  # K = 2 key/value heads
    mask = masks.causal_mask(5, 7)
    # Query head h reads key/value head h // (H/K): heads 0, 1 read group 0, heads 2, 3 group 1.
    repeated = [np.repeat(a, 2, axis=1) for a in (kh, vh)]  # [2, 4, 7, 8]: each group's k, v twice
    d = np.abs(grouped_query_attention(qh, kh, vh, mask) - scaled_dot_product_attention(qh, *repeated, mask)).max()
    _check(d < 1e-12, f"GQA (H = 4, K = 2) equals multi-head attention on repeated k, v (max diff {d:.1e})",
           failures)

    print("\n4. GPT-2 end to end (random weights: 2 layers, 4 heads of 16, vocabulary 300)")
    from . import gpt2
    from .gpt2.io import save_weights
    from .gpt2.model import KVCache, forward

    config = gpt2.GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    shapes = gpt2.GPT2Params.expected_shapes(config)
    tensors = {n: (0.02 * rng.standard_normal(s) if n.endswith("weight") and len(s) == 2 else
                   (np.ones(s) if "ln" in n and n.endswith("weight") else 0.02 * rng.standard_normal(s)))
               for n, s in shapes.items()}
    params = gpt2.GPT2Params.from_named_tensors(tensors, config)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_weights(config, params, Path(tmp) / "tiny-gpt2")
        model = gpt2.load(path)
        print(f"   saved and reloaded {path.name}: {sorted(p.name for p in Path(path).iterdir())}")
    written, read = params.named_tensors(), model.params.named_tensors()
    same = written.keys() == read.keys() and all(np.array_equal(written[n], read[n]) for n in written)
    _check(same, f"the {len(written)} tensors read back equal those written", failures)
    prompt = [1, 2, 3, 4]
    out = gpt2.generate(model, prompt, max_new_tokens=12, eos_token_id=None)
    print(f"   greedy continuation of {prompt}: {list(out.ids)}")
    full = forward(model.params, config, np.array([prompt + list(out.ids)]))[0]
    cache = KVCache.allocate(config, 1)
    seq = prompt + list(out.ids)
    step = [forward(model.params, config, np.array([seq[:4]]), cache=cache)[0]]
    for t in seq[4:]:
        step.append(forward(model.params, config, np.array([[t]]), cache=cache)[0])
    cached = np.concatenate(step)
    d = float(np.abs(cached - full).max())
    _check(d < 1e-5, f"KV-cache decoding equals full recomputation (max |diff| {d:.1e})", failures)

    print("\n5. GPT-2 tokenizer")
    ranks = Path(os.environ.get("REFIMPL_DATA_DIR", REPO / ".cache")) / "gpt2.tiktoken"
    if ranks.exists():
        tok = gpt2.load_tokenizer(ranks)
        text = "Hello world, naïve café 🙂!"
        ids = tok.encode(text)
        print(f"   {text!r} -> {ids}")
        print(f"   pieces: {tok.pieces(ids)}")
        _check(ids == [15496, 995, 11, 41492, 40304, 32485, 0], "the ids are tiktoken's (r50k_base)", failures)
        _check(tok.decode(ids) == text, "decode(encode(text)) == text", failures)
    else:
        print(f"   (skipped: {ranks} not found; `python scripts/fetch_data.py` fetches it)")
        skipped.append("5 (no GPT-2 ranks file)")

    print("\n6. accel kernels vs their refimpl twins")
    try:
        import numba  # noqa: F401
    except ImportError:
        print("   (skipped: numba is not installed; pip install -e .[numba])")
        skipped.append("6 (no numba)")
    else:
        from accel import verify

        from ._progress import Progress

        print("   (compiling and running every Numba kernel: a minute or two the first time)", flush=True)
        with Progress("demo: accel kernels vs their twins"):
            rows = verify.run("numba")
        print(verify.format_table(rows))
        _check(verify.held(rows), "every numba kernel within its tolerance (a refused case runs refimpl's)",
               failures)

    print()
    if failures:
        print(f"{len(failures)} check(s) FAILED: {failures}")
        return 1
    print("all checks held" + (f" (sections skipped: {', '.join(skipped)})" if skipped else ""))
    return 0
