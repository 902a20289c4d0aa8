"""Attention's memory and time, measured: the naive T x S score matrix against a fused online-softmax kernel.

    rows = measure_attention(T=(128, 256, 512), heads=(1, 4), windows=(None, 64))
    summary = summarize(rows)         # growth exponents, and whether a window saves memory
    plot_memory(rows, summary, "memory.png")

The two implementations compute the same function, causal attention with an optional local
window (refimpl.masks.local_window_mask: key j is visible from query p when 0 <= p - j < w):
    naive  refimpl.attention.masked_attention: builds the boolean [T, S] mask, the
           [B, H, T, S] scores, their softmax and the weights, then weights @ V. A window only
           changes which entries of the full score matrix are set to -inf, so it cannot make
           that matrix smaller: memory O(B H T S) with or without a window.
    fused  the kernel the accel registry lists for masked_attention on the "numba" backend
           (accel.numba_cpu.attention, FlashAttention-style tiles with a running max): never
           more than one BQ x BK score tile per task, so memory O(B H T D) for the inputs and
           output; a window lets it skip whole key tiles (time, not memory).

What is measured (nothing here is computed from a formula):
    peak_bytes   tracemalloc's peak of traced allocations during one call, above what was
                 allocated before it. NumPy registers every array buffer with tracemalloc, so
                 this is every NumPy allocation of the naive path and the fused wrapper's own
                 arrays (output, key counts); it does NOT see buffers Numba allocates inside
                 compiled code (the fused kernel's per-task score tile and row vectors, a fixed
                 size per task whatever T is).
    rss_growth   growth of the process's resident-set high-water mark (Linux VmHWM, reset
                 through /proc/self/clear_refs) during one call: sees every allocation,
                 Numba's included, but only pages newly taken from the system (0 when the
                 allocator reuses freed memory); None where /proc does not allow it.
    seconds      median wall time of `repeats` calls after one warm-up call (the warm-up
                 also compiles the kernel the first time), naive and fused interleaved.
Inputs are float32 [B=1, H, T, D] standard normal, k = v = q's shape, S = T.
"""

from __future__ import annotations

import re
import time
import tracemalloc
from pathlib import Path

import numpy as np

from .._checks import check_positive_int, is_int

__all__ = ["KERNELS", "kv_cache_tokens", "kv_cache_bytes",
           "fused_attention", "peak_traced_bytes", "rss_growth_bytes", "measure_attention", "summarize",
           "plot_memory"]

KERNELS = ("naive", "fused")


def kv_cache_tokens(config, T: int) -> np.ndarray:  # -> [L]
    """n_l(T): the keys layer l must keep to decode token T + 1: T for a global layer, min(T, W) for a local one.

    A sliding-window layer (layer_types "sliding_attention", window W = sliding_window) gives a key j
    weight exactly 0 once the query is W or more positions past it (refimpl.masks.local_window_mask),
    so a cache that drops such keys decodes the same numbers (refimpl's own KVCache keeps them all).
    GPT-2 and single-kind models: every layer global.
    """
    T = check_positive_int(T, "T")
    from ..families import of_config

    L = of_config(config).n_layers(config)
    types = tuple(getattr(config, "layer_types", ()) or ()) or ("full_attention",) * L
    W = getattr(config, "sliding_window", None)
    return np.array([min(T, W) if t == "sliding_attention" and W else T for t in types], dtype=np.int64)


def kv_cache_bytes(config, T: int, *, itemsize: int = 4, windowed: bool = True) -> int:
    """sum_l 2 K D n_l(T) itemsize: keys and values of every layer (n_l from kv_cache_tokens; windowed=False: n_l = T).

    K key/value heads of D dims (GPT-2: K = n_head, D = n_embd / n_head); itemsize 4 for float32.
    """
    n = kv_cache_tokens(config, T) if windowed else np.full(len(kv_cache_tokens(config, T)), int(T))
    from ..families import of_config

    fam = of_config(config)
    K, D = fam.n_kv_heads(config), fam.head_dim(config)
    return int(2 * K * D * itemsize * n.sum())


def fused_attention():
    """The fused masked_attention the accel registry lists for the Numba CPU backend (its loaded function)."""
    from accel.registry import get

    return get("masked_attention", "numba").load()


def peak_traced_bytes(fn) -> int:
    """tracemalloc's peak during fn() minus the traced size before it (tracing started and stopped here)."""
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not was:
            tracemalloc.stop()


def _status_bytes(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def rss_growth_bytes(fn) -> int | None:
    """Growth of the resident-set high-water mark during fn() (Linux), or None where it cannot be reset."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
        before = _status_bytes("VmRSS")
    except (OSError, AttributeError):
        return None
    fn()
    return max(0, _status_bytes("VmHWM") - before)


def _check_sizes(values, name: str, *, allow_none: bool = False) -> tuple:
    out = []
    for v in values:
        if v is None and allow_none:
            out.append(None)
            continue
        if not is_int(v) or v < 1:
            raise ValueError(f"{name} must be positive integers{' (or None: no window)' if allow_none else ''}; "
                             f"got {v!r}")
        out.append(int(v))
    if not out:
        raise ValueError(f"{name} must name at least one value")
    return tuple(out)


def measure_attention(*, T=(128, 256, 512, 1024), heads=(1, 4), windows=(None, 64), head_dim: int = 32,
                      repeats: int = 3, kernels=KERNELS, seed: int = 0) -> list[dict]:
    """One row per (T, H, window, kernel): peak_bytes, rss_growth, seconds (module docstring), and the sizes.

    Also checks that the two kernels agree (max |naive - fused| is kept in each fused row), so
    the timings compare the same function.
    """
    from ..attention import masked_attention

    T, heads = _check_sizes(T, "T"), _check_sizes(heads, "heads")
    windows = _check_sizes(windows, "windows", allow_none=True)
    head_dim = check_positive_int(head_dim, "head_dim")
    repeats = check_positive_int(repeats, "repeats")
    for k in kernels:
        if k not in KERNELS:
            raise ValueError(f"kernels must be among {KERNELS}; got {k!r}")
    impl = {"naive": masked_attention}
    if "fused" in kernels:
        impl["fused"] = fused_attention()
    rng = np.random.default_rng(seed)
    rows = []
    for t in T:
        for h in heads:
            q, k, v = (rng.standard_normal((1, h, t, head_dim)).astype(np.float32) for _ in range(3))
            for w in windows:
                calls = {name: (lambda f=impl[name]: f(q, k, v, causal=True, window=w)) for name in kernels}
                outs = {name: call() for name, call in calls.items()}  # warm-up (and compile)
                times = {name: [] for name in kernels}
                for _ in range(repeats):  # interleaved, so drifting machine load touches both alike
                    for name, call in calls.items():
                        t0 = time.perf_counter()
                        call()
                        times[name].append(time.perf_counter() - t0)
                for name, call in calls.items():
                    row = {"kernel": name, "T": t, "S": t, "heads": h, "head_dim": head_dim,
                           "window": w, "dtype": "float32",
                           "peak_bytes": peak_traced_bytes(call), "rss_growth": rss_growth_bytes(call),
                           "seconds": float(np.median(times[name])), "score_matrix_bytes": h * t * t * 4}
                    if name == "fused" and "naive" in outs:
                        row["max_abs_diff_to_naive"] = float(np.max(np.abs(outs["fused"] - outs["naive"])))
                    rows.append(row)
    return rows


def _exponent(xs, ys) -> float | None:
    """Least-squares slope of log y against log x (how y grows with x), None with fewer than two points."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    ok = ys > 0
    if ok.sum() < 2 or len(set(xs[ok])) < 2:
        return None
    return float(np.polyfit(np.log(xs[ok]), np.log(ys[ok]), 1)[0])


def summarize(rows: list[dict]) -> dict:
    """Growth exponents of peak memory in T (per kernel and window, at the most heads) and the window answer.

    window_saves_memory[kernel]: for each (T, H) measured with no window and with window w, the
    ratio peak(window w) / peak(no window); the answer is yes only if every ratio at the largest T
    measured is below 0.9 (where a saving would show most; a single small-T ratio moved by a
    transient allocation of a few hundred KiB does not decide it).
    """
    H = max(r["heads"] for r in rows)
    growth = {}
    for kernel in sorted({r["kernel"] for r in rows}):
        for w in sorted({r["window"] for r in rows}, key=lambda x: -1 if x is None else x):
            sel = [r for r in rows if r["kernel"] == kernel and r["window"] == w and r["heads"] == H]
            growth[f"{kernel}, window {w}"] = _exponent([r["T"] for r in sel], [r["peak_bytes"] for r in sel])
    answers = {}
    for kernel in sorted({r["kernel"] for r in rows}):
        full = {(r["T"], r["heads"]): r for r in rows if r["kernel"] == kernel and r["window"] is None}
        ratios = [{"T": r["T"], "heads": r["heads"], "window": r["window"],
                   "peak_ratio": r["peak_bytes"] / full[(r["T"], r["heads"])]["peak_bytes"],
                   "time_ratio": r["seconds"] / full[(r["T"], r["heads"])]["seconds"]}
                  for r in rows if r["kernel"] == kernel and r["window"] is not None and (r["T"], r["heads"]) in full]
        top = max((x["T"] for x in ratios), default=None)
        answers[kernel] = {"saves": (all(x["peak_ratio"] < 0.9 for x in ratios if x["T"] == top) if ratios else None),
                           "ratios": ratios}
    out = {"peak_growth_exponent_in_T": growth, "at_heads": H, "window_saves_memory": answers}
    naive = answers.get("naive", {})
    if naive.get("ratios"):
        lo = min(x["peak_ratio"] for x in naive["ratios"])
        out["answer"] = (f"does a window save memory in the naive attention? {'yes' if naive['saves'] else 'no'}: "
                         f"peak(window) / peak(no window) >= {lo:.2f} over every T and H measured (the window "
                         "only sets entries of the full T x S score matrix to -inf)")
    return out


def plot_memory(rows: list[dict], summary: dict, path):
    """Peak traced memory and time against T (log-log), with T^2 and T guides; peak against heads if measured."""
    from ._plot import pyplot, save

    plt = pyplot()
    H = summary["at_heads"]
    heads = sorted({r["heads"] for r in rows})
    n_panels = 3 if len(heads) > 1 else 2
    fig, axes = plt.subplots(1, n_panels, figsize=(5.2 * n_panels, 4.2))
    styles = {"naive": "tab:red", "fused": "tab:blue"}
    windows = sorted({r["window"] for r in rows}, key=lambda x: -1 if x is None else x)
    for kernel in [k for k in KERNELS if any(r["kernel"] == k for r in rows)]:
        for i, w in enumerate(windows):
            sel = sorted((r for r in rows if r["kernel"] == kernel and r["window"] == w and r["heads"] == H),
                         key=lambda r: r["T"])
            Ts = [r["T"] for r in sel]
            label = f"{kernel}, {'no window' if w is None else f'window {w}'}"
            ls, mk = ("-", "o") if i == 0 else ("--", "s")
            axes[0].plot(Ts, [r["peak_bytes"] / 2**20 for r in sel], ls, marker=mk, color=styles[kernel],
                         label=label, alpha=1.0 if i == 0 else 0.7)
            axes[1].plot(Ts, [1e3 * r["seconds"] for r in sel], ls, marker=mk, color=styles[kernel], label=label,
                         alpha=1.0 if i == 0 else 0.7)
            if i == 0 and len(Ts) > 1:  # guides through the first point: what O(T^2) and O(T) would look like
                y0 = sel[0]["peak_bytes"] / 2**20
                power = 2 if kernel == "naive" else 1
                axes[0].plot(Ts, [y0 * (t / Ts[0]) ** power for t in Ts], ":", color="gray", lw=1)
                axes[0].annotate(f"~T^{power}", (Ts[-1], y0 * (Ts[-1] / Ts[0]) ** power), fontsize=7, color="gray")
    g = summary["peak_growth_exponent_in_T"]
    axes[0].set_title("peak traced memory (tracemalloc), H = %d\nmeasured growth: %s" % (
        H, ", ".join(f"{k} T^{v:.2f}" for k, v in g.items() if v is not None and "None" in k)), fontsize=8)
    axes[0].set_ylabel("MiB above the inputs")
    axes[1].set_title(f"median time per call, H = {H}", fontsize=8)
    axes[1].set_ylabel("ms")
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T = S (causal)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    if n_panels == 3:
        T = max(r["T"] for r in rows)
        for kernel in [k for k in KERNELS if any(r["kernel"] == k for r in rows)]:
            for i, w in enumerate(windows):
                sel = sorted((r for r in rows if r["kernel"] == kernel and r["window"] == w and r["T"] == T),
                             key=lambda r: r["heads"])
                axes[2].plot([r["heads"] for r in sel], [r["peak_bytes"] / 2**20 for r in sel], "-" if i == 0 else "--",
                             marker="o" if i == 0 else "s", color=styles[kernel],
                             label=f"{kernel}, {'no window' if w is None else f'window {w}'}")
        axes[2].set_title(f"peak traced memory against heads, T = {T}", fontsize=8)
        axes[2].set_xlabel("heads H")
        axes[2].set_ylabel("MiB")
        axes[2].set_yscale("log")
        axes[2].legend(fontsize=7)
        axes[2].grid(alpha=0.3, which="both")
    if summary.get("answer"):
        fig.suptitle(summary["answer"], fontsize=9)
    fig.tight_layout()
    return save(fig, path)
