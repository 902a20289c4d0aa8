"""Comparing two sets of activations point by point, with tolerances from an error model,
and naming the first divergence.

The error model (the tolerance of each compared point)

    err(point) = max |theirs - ref| / max |ref|        (normwise relative; max |ref| = 0: absolute)
    tol(point) = scale * (d + 1) * (8 u + 2 sqrt(n) u_acc + 2 P u_acc)

- u: the unit roundoff of the less precise of the two sides' stored values (float64 2^-53,
  float32 2^-24, float16 2^-11, bfloat16 2^-8); u_acc = min(u, 2^-24), the precision sums are
  accumulated in (float64 when both sides are float64; float32 otherwise, which is what PyTorch
  does for float16 / bfloat16 products and reductions on CPU and GPU).
- n: the longest sum in the model, read off the reference's activations: the widest hidden
  width, MLP width or key count (the last axis of every point but the logits). So the key
  count S is in n as soon as it is the longest: the softmax's normaliser and the weighted sum
  of the values are sums over S keys.
- d: the number of blocks the value has passed through (d = i for the points of block i,
  d = L for the final norm and the logits).
- P: the number of positions rotated (RoPE): the longest key axis of the reference's
  attn.k_rot points; 0 when it has none (GPT-2's learned positions).
- Why this form. An inner product of length n accumulated in floating point carries a
  relative error up to n u_acc, and about sqrt(n) u_acc when the rounding errors are
  independent (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., sec. 3.1 and
  3.3); rounding each stored result (a product, a norm, a softmax, an activation: a handful per
  block) adds about u each. So one block adds a few u plus a few sqrt(n) u_acc, and because the
  norms rescale the residual stream at every block, the blocks' relative errors add rather
  than multiply: (d + 1) times one block's. The constants 8 and 2 leave a margin of several
  times over what two correct implementations differ by (refimpl against Hugging Face in
  float32, float64 and bfloat16: the tests print err / tol); the mistakes a port makes (a wrong
  scale, pairing, mask, norm, activation) are errors of order 1e-3 to 1.
- The rotation term 2 P u_acc. RoPE turns pair i at position p by the angle p w_i (w_i <= 1).
  The reference forms p w_i in float64; a correct port may form it in float32, as Hugging Face
  and llama.cpp do: fl(fl(w_i) p) = p w_i (1 + e) with |e| a few u_acc (w_i's own rounding,
  then the product's), an absolute angle error of a few p w_i u_acc <= P u_acc that grows with
  the position (not a relative error of the rotated values, so it is linear in P where a sum's
  is sqrt(n)). A pair (a, b) turned by an extra angle t moves by (-b', a') t, (a', b') the
  turned pair, so q_rot and k_rot carry a normwise error of that angle error (measured: 0.76 to
  0.94 P u_acc for Hugging Face's float32 cos / sin at P = 132 to 4096, hence the 2).
  The scores s = c q.k then move by |ds| <= c sum_i |q_i| |k_i| (t_q,i + t_k,i), and a
  softmax weight by |dp_j| = p_j |ds_j - sum_k p_k ds_k| <= 2 p_j (1 - p_j) max |ds|
  <= max |ds| / 2 (to first order). The worst case multiplies the angle error by the score
  scale c |q| |k| (57 in SmolLM2-135M's first block), but only the fastest pairs (w_i near 1;
  w_i falls geometrically with i) have an angle error that large, so the weights move by a
  small part of it: measured 0.23 P u_acc (SmolLM2-135M against Hugging Face, block 0,
  P = 648; 0.02 P u_acc once Hugging Face's angles are made in float64). What the weights
  pass to attn.out and the residual stream is an error of that block's attention, and adds
  up over the blocks like the others: hence one term per block, inside (d + 1). A port that
  forms the angles in float16 or bfloat16 is off by up to P 2^-11 or P 2^-8 rad and is caught
  (u_acc is float32's at most).
- `scale` (default 1) widens or narrows every tolerance (a port that accumulates in float16
  needs more); `tolerances` sets a point's outright.

A point "agrees" when err <= tol. The first divergence is the earliest compared point, in the
order the data flows, whose err / tol > 1 (or whose values are not finite where the
reference's are).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

__all__ = ["unit_roundoff", "depth", "tolerance", "sum_length", "rotated_positions", "Row", "Report",
           "first_divergence", "compare"]

FORMULA = "scale * (d + 1) * (8 u + 2 sqrt(n) u_acc + 2 P u_acc)"

_UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def unit_roundoff(dtype) -> float:
    """u of a floating dtype: float64, float32, float16, or "bfloat16" (a name: NumPy has no such dtype)."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in _UNIT_ROUNDOFF:
        raise ValueError(f"cannot compare dtype {name!r}: expected one of {sorted(_UNIT_ROUNDOFF)}")
    return _UNIT_ROUNDOFF[name]


_BLOCK = re.compile(r"blocks\.(\d+)\.")


def depth(name: str, n_layers: int) -> int:
    """d of the error model: i for a point of block i, L for the final norm and the logits."""
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else n_layers


def tolerance(name: str, n_layers: int, u: float, n: int, scale: float = 1.0, positions: int = 0) -> float:
    """tol = scale (d + 1) (8 u + 2 sqrt(n) u_acc + 2 P u_acc), u_acc = min(u, 2^-24), P = positions
    (module docstring)."""
    u_acc = min(u, _UNIT_ROUNDOFF["float32"])
    return scale * (depth(name, n_layers) + 1) * (8 * u + 2 * math.sqrt(n) * u_acc + 2 * positions * u_acc)


def sum_length(reference: dict) -> int:
    """n of the error model: the largest last-axis length among the reference's points other than the logits."""
    return max([np.shape(a)[-1] for name, a in reference.items() if name != "logits" and np.ndim(a)] + [1])


def rotated_positions(reference: dict) -> int:
    """P of the error model: the longest key axis of the reference's attn.k_rot points (0: no RoPE)."""
    return max([np.shape(a)[-2] for name, a in reference.items()
                if name.endswith("attn.k_rot") and np.ndim(a) >= 2] + [0])


@dataclass(frozen=True)
class Row:
    """One compared point: its name (and theirs), shape, max abs / relative difference, tolerance and verdict."""

    name: str
    their_name: str
    shape: tuple
    max_abs: float
    max_rel: float
    tol: float

    @property
    def ratio(self) -> float:
        """err / tol (inf when their values are not finite where the reference's are)."""
        return self.max_rel / self.tol if self.tol > 0 else (0.0 if self.max_rel == 0 else math.inf)

    @property
    def agrees(self) -> bool:
        return self.ratio <= 1.0

    @property
    def verdict(self) -> str:
        if math.isinf(self.max_rel) or math.isnan(self.max_rel):
            return "NOT FINITE"
        return "agrees" if self.agrees else "DIFFERS"


def first_divergence(ratios) -> int | None:
    """The index of the first ratio err / tol that is > 1 or NaN (NaN:
    values not comparable); None when all are <= 1."""
    for i, r in enumerate(ratios):
        if not r <= 1.0:  # NaN counts as a divergence
            return i
    return None


# Where to look when a point is the first to part, given that the points before it agreed.
_HINTS = (
    (r"blocks\.0\.resid_pre$", "the embedding: token ids, the position embedding or offset, Gemma's sqrt(hidden) "
                               "scale"),
    (r"attn\.(q|k|v)$", "the input norm (eps; Gemma's 1 + w) or the q/k/v projections (weight layout [in, out] vs "
                        "[out, in], bias, head split; Qwen3's q/k norms)"),
    (r"attn\.(q|k)_rot$", "RoPE: the pairing (half-split vs interleaved), theta and its scaling, the positions "
                          "(an offset in cached decoding), the rotated width"),
    (r"attn\.weights$", "the scores and their softmax: the scale (1/sqrt(head_dim), not 1/sqrt(width)), the causal "
                        "mask or window, the soft-cap, which key/value head each query head reads (GQA: head h uses "
                        "h // (H / K)), the softmax's precision"),
    (r"attn\.out$", "the weighted sum of the values, the merge of the heads, or the output projection"),
    (r"resid_mid$", "the residual add after attention (Gemma-2: the post-attention norm)"),
    (r"mlp\.hidden$", "the MLP's input norm (eps, weights), its first product(s) or the activation (GELU tanh vs erf, "
                      "SiLU; which of gate and up is activated)"),
    (r"mlp\.out$", "the MLP's output product"),
    (r"resid_post$", "the residual add after the MLP (Gemma-2: the post-MLP norm)"),
    (r"(ln_f|norm)\.out$", "the final norm (eps; the weight convention)"),
    (r"^logits$", "the LM head: tied vs untied, Gemma-2's final soft-cap"),
)


def hint(name: str) -> str:
    """Where to look when `name` is the first point to part."""
    for pattern, text in _HINTS:
        if re.search(pattern, name):
            return text
    return "the step that produces it"


@dataclass
class Report:
    """The rows in data-flow order, the first divergence, and the tolerance model used."""

    rows: list[Row]
    u: float
    n: int
    dtypes: tuple[str, str]  # (reference, theirs)
    scale: float
    n_layers: int
    first: int | None = field(init=False)
    reference_names: tuple[str, ...] = ()  # every point of the reference, in data-flow order
    notes: tuple[str, ...] = ()  # printed after the summary
    positions: int = 0  # P, the positions rotated (0: no RoPE)

    def __post_init__(self) -> None:
        self.first = first_divergence([r.ratio if r.verdict != "NOT FINITE" else math.nan for r in self.rows])

    @property
    def ok(self) -> bool:
        return self.first is None

    def agreed_before(self) -> list[Row]:
        """The agreeing rows just before the diverging point, in order: those of its own block (a point
        after the blocks: the other points after the blocks), then the one point that precedes them."""
        if self.first is None:
            return []
        m = _BLOCK.match(self.rows[self.first].name)
        prefix = m.group(0) if m else None
        before = []
        for r in reversed(self.rows[:self.first]):
            same = r.name.startswith(prefix) if prefix is not None else _BLOCK.match(r.name) is None
            before.append(r)
            if not same:
                break  # the last point of the previous group, then stop
        return list(reversed(before))

    def summary(self) -> str:
        """One line: all agree, or the first diverging point with what agreed just before it and where to look."""
        tol = (f"tolerance {FORMULA}: scale {self.scale:g}, u = {self.u:.3g} ({self.dtypes[1]} vs {self.dtypes[0]}), "
               f"n = {self.n}" + (f", P = {self.positions}" if self.positions else ""))
        if self.first is None:
            return f"all {len(self.rows)} points agree ({tol})"
        r = self.rows[self.first]
        before = self.agreed_before()
        agreed = (", ".join(b.name for b in before) + " agree; ") if before else ""
        what = "is not finite" if r.verdict == "NOT FINITE" else f"differs (err / tol = {r.ratio:.3g})"
        unseen = self.unseen_before()
        if unseen:  # the mistake may have entered at any point between the last agreeing one and this one
            hints = list(dict.fromkeys(hint(n) for n in (*unseen, r.name)))
            where = (f"Their dump skips {', '.join(unseen)} before it, so look at any of: " + "; ".join(hints))
        else:
            where = f"Look at {hint(r.name)}"
        return f"first divergence: {r.name} ({r.their_name}): {agreed}{r.name} {what}. {where}. [{tol}]"

    def unseen_before(self) -> list[str]:
        """The reference's points between the last compared point before the first divergence and it, which
        their dump does not hold (the first divergence may have entered at any of them)."""
        if self.first is None or not self.reference_names:
            return []
        order = {n: i for i, n in enumerate(self.reference_names)}
        end = order.get(self.rows[self.first].name)
        start = order.get(self.rows[self.first - 1].name, -1) if self.first > 0 else -1
        if end is None:
            return []
        return [n for n in self.reference_names[start + 1:end] if n != "logits"]

    def table(self) -> str:
        """The rows as a text table, the first divergence marked, and the summary line."""
        w = max([len(r.name) for r in self.rows] + [5])
        lines = [f"{'point':<{w}}  {'shape':<16} {'max abs':>10} {'max rel':>10} {'tol':>10} {'err/tol':>9}  verdict"]
        for i, r in enumerate(self.rows):
            mark = "  <- first" if i == self.first else ""
            lines.append(f"{r.name:<{w}}  {str(list(r.shape)):<16} {r.max_abs:>10.3g} {r.max_rel:>10.3g} "
                         f"{r.tol:>10.3g} {r.ratio:>9.3g}  {r.verdict}{mark}")
        return "\n".join(lines + ["", self.summary(), *self.notes])

    def to_dict(self) -> dict:
        """JSON-ready: the model of the tolerances, every row, and the first divergence (None when all agree)."""
        def num(x):
            return None if not math.isfinite(x) else x
        return {
            "ok": self.ok, "summary": self.summary(),
            "tolerance": {"formula": FORMULA, "u": self.u, "u_acc": min(self.u, _UNIT_ROUNDOFF["float32"]),
                          "n": self.n, "positions": self.positions, "scale": self.scale,
                          "reference_dtype": self.dtypes[0], "their_dtype": self.dtypes[1]},
            "first_divergence": None if self.first is None else self.rows[self.first].name,
            "rows": [{"name": r.name, "theirs": r.their_name, "shape": list(r.shape), "max_abs": num(r.max_abs),
                      "max_rel": num(r.max_rel), "tol": r.tol, "ratio": num(r.ratio), "verdict": r.verdict}
                     for r in self.rows],
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def plot(self, path) -> None:
        """err / tol along the data flow on a log scale, the line err = tol,
        the first divergence marked (needs matplotlib)."""
        from ..interp._plot import pyplot, save

        plt = pyplot()
        ratios = [r.ratio if math.isfinite(r.ratio) else np.nan for r in self.rows]
        floor = 1e-6
        fig, ax = plt.subplots(figsize=(max(6.0, 0.18 * len(self.rows)), 3.6))
        ax.semilogy(range(len(ratios)), [max(x, floor) if x == x else np.nan for x in ratios], "o-", ms=3)
        ax.axhline(1.0, color="red", lw=1, ls="--", label="err = tol")
        if self.first is not None:
            y = ratios[self.first]
            ax.axvline(self.first, color="orange", lw=1)
            ax.annotate(self.rows[self.first].name, (self.first, y if y == y else 1.0), fontsize=8,
                        xytext=(5, 5), textcoords="offset points")
        step = max(1, len(self.rows) // 24)
        ax.set_xticks(range(0, len(self.rows), step))
        ax.set_xticklabels([self.rows[i].name for i in range(0, len(self.rows), step)], rotation=70, fontsize=6,
                           ha="right")
        ax.set_ylabel(f"err / tol (0 drawn at {floor:g})")
        title = ("all points agree" if self.first is None else
                 f"first divergence: {self.rows[self.first].name} (err / tol {self.rows[self.first].ratio:.3g})")
        ax.set_title(f"{title}; {self.dtypes[1]} vs {self.dtypes[0]} reference", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        save(fig, path)


def _as_comparable(a, name: str, side: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise ValueError(f"{side} {name!r} has dtype {a.dtype}: cannot compare (expected floating-point values)")
    return a


def _match_batch(ref: np.ndarray, theirs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop a leading axis of size 1 that only one side has."""
    if theirs.ndim == ref.ndim + 1 and theirs.shape[0] == 1:
        return ref, theirs[0]
    if ref.ndim == theirs.ndim + 1 and ref.shape[0] == 1:
        return ref[0], theirs
    return ref, theirs


_CHUNK = 1 << 22  # entries widened to float64 at a time (32 MiB per array)


def _errors(ref: np.ndarray, theirs: np.ndarray) -> tuple[float, float]:
    """(max |theirs - ref|, that / max |ref|), in float64; inf when theirs is not finite where ref is.

    Taken over chunks of the flattened arrays, so that a large point (the logits: T x V) is never
    widened to float64 whole."""
    r_all, t_all = ref.reshape(-1), theirs.reshape(-1)
    max_abs = peak = 0.0
    nan_r = nan_t = any_finite = False
    for start in range(0, r_all.size, _CHUNK):
        r = r_all[start:start + _CHUNK].astype(np.float64)
        t = t_all[start:start + _CHUNK].astype(np.float64)
        fin = np.isfinite(r)
        if not np.array_equal(fin, np.isfinite(t)):
            return math.inf, math.inf
        nan_r, nan_t = nan_r or bool(np.isnan(r).any()), nan_t or bool(np.isnan(t).any())
        if fin.any():
            any_finite = True
            max_abs = max(max_abs, float(np.abs(t[fin] - r[fin]).max()))
            peak = max(peak, float(np.abs(r[fin]).max()))
    if nan_t and not nan_r:
        return math.inf, math.inf
    if not any_finite:
        return 0.0, 0.0
    return max_abs, (max_abs / peak if peak > 0 else max_abs)


def compare(reference: dict, theirs: dict, *, n_layers: int, their_dtype=None, scale: float = 1.0,
            tolerances: dict | None = None) -> Report:
    """Compare their activations with the reference's at every point they share, in the reference's (data-flow) order.

    reference: {refimpl name: array} in the order the forward reaches the points (what
    refimpl.interp.run_with_cache returns, plus "logits"). theirs: {name: array} in refimpl's,
    Hugging Face's or TransformerLens's names (refimpl.compare.names). their_dtype: the precision
    their side computed in ("bfloat16", "float16", ...; default: their arrays' dtype). scale /
    tolerances: the error model's knobs (module docstring).
    Errors: a name of theirs that names no point (the closest are listed), two names for one
    point, a shape that differs from the reference's at that point, a dtype that is not
    floating-point, no point in common.
    """
    from .names import to_reference

    if not isinstance(theirs, dict) or not theirs:
        raise ValueError("their activations must be a non-empty dict of name -> array")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0; got {scale!r}")
    mapped = to_reference(theirs, list(reference), n_layers)
    tolerances = dict(tolerances or {})
    for n in tolerances:
        if n not in reference:
            raise ValueError(f"tolerances names {n!r}, which is no point of the reference")
    ref_dtype = None
    rows_in: list[tuple[str, str, np.ndarray, np.ndarray]] = []
    for name, ref in reference.items():
        if name not in mapped:
            continue
        their_name, t = mapped[name]
        r = _as_comparable(ref, name, "reference")
        t = _as_comparable(t, their_name, "their")
        r, t = _match_batch(r, t)
        if r.shape != t.shape:
            raise ValueError(f"their {their_name!r} has shape {list(t.shape)}; the reference's {name!r} is "
                             f"{list(r.shape)}")
        ref_dtype = ref_dtype or r.dtype.name
        rows_in.append((name, their_name, r, t))
    if not rows_in:
        raise ValueError(f"their activations ({', '.join(list(theirs)[:4])}...) share no point with the reference")
    if their_dtype is None:
        kinds = {t.dtype.name for *_, t in rows_in if t.dtype.kind == "f"}
        their_dtype = max(kinds, key=unit_roundoff) if kinds else "float64"
    u = max(unit_roundoff(their_dtype), unit_roundoff(ref_dtype))
    n, positions = sum_length(reference), rotated_positions(reference)
    rows = []
    for name, their_name, r, t in rows_in:
        max_abs, max_rel = _errors(r, t)
        tol = float(tolerances[name]) if name in tolerances else tolerance(name, n_layers, u, n, scale, positions)
        rows.append(Row(name, their_name, tuple(r.shape), max_abs, max_rel, tol))
    report = Report(rows, u, n, (ref_dtype, str(their_dtype)), float(scale), n_layers, tuple(reference),
                    positions=positions)
    report.notes = tuple(_final_hidden_state_note(report, reference, mapped, n_layers))
    return report


def _final_hidden_state_note(report: Report, reference: dict, mapped: dict, n_layers: int) -> list[str]:
    """A note when their last hidden_states entry (Hugging Face's: after the final norm) disagrees with the final
    norm's output: whether it holds the last block's output before the norm instead, as a port may store it."""
    last = f"hidden_states.{n_layers}"
    row = next((r for r in report.rows if r.their_name == last), None)
    if row is None or row.agrees:
        return []
    note = (f"note: {last} is, in Hugging Face's convention, the output of the final norm ({row.name}), not the "
            f"last block's output")
    pre = f"blocks.{n_layers - 1}.resid_post"
    if pre in reference:
        r, t = _match_batch(_as_comparable(reference[pre], pre, "reference"),
                            _as_comparable(mapped[row.name][1], last, "their"))
        if r.shape == t.shape:
            max_abs, max_rel = _errors(r, t)
            if Row(pre, last, tuple(r.shape), max_abs, max_rel, tolerance(pre, n_layers, report.u, report.n,
                                                                          report.scale, report.positions)).agrees:
                note += (f"; theirs agrees with {pre}, the output before the final norm: store the normed output "
                         f"as {last} (or name this one blocks.{n_layers - 1}.hook_resid_post)")
    return [note]
