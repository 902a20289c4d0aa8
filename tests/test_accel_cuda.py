"""GPU backends: Numba-CUDA kernels (on the CPU under NUMBA_ENABLE_CUDASIM=1) and CuPy.

Each kernel is checked against its refimpl twin run in float64 on the same input values,
with the registry's tolerance, by `accel.verify.check_against_twin` (the differential suite's
check: |out - ref| <= atol + rtol |ref| where ref is finite, identical non-finite values
elsewhere); the drawn cases come from tests/strategies.py's dims strategies and
`accel.verify.make_case`, as in the differential suite. The cases pin what the shapes drawn elsewhere can miss on tiny
blocks: several query and key tiles per block (so tile skipping, the online rescaling and the split-S merge
all run), fully masked rows, T > S, K < H, odd head dims.

Also here: GPT-2 through the GPU `Ops` glue of accel.cupy.gpt2 over NumPy arrays and the
simulated kernels (equal to the NumPy backend), and a compile of every kernel for a real GPU
target (sm_90 PTX through NVVM, no GPU needed; skipped, saying why, when no NVVM is installed).

The simulator runs every GPU thread as a Python thread, so blocks are tiny (4 to 16 threads,
`launch_config`) and Hypothesis draws few examples. Without a GPU, CuPy tests skip and say why;
scripts/gpu_check.sh runs this file on a real GPU. Run with -s to read the max differences
(each check's line, and the table at the end of the run: tests/report.py).
"""

from __future__ import annotations

import os
import sys
import zlib

import cuda_simulator  # noqa: F401  (before numba.cuda: the simulator where there is no GPU)

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel import registry
from accel._common import check_close
from accel.verify import check_against_twin, make_case
from refimpl import attention as ref_attention
from refimpl import ffn as ref_ffn
from refimpl import norms as ref_norms
from refimpl import positional as ref_positional

nc = pytest.importorskip("accel.numba_cuda", reason="numba.cuda is not importable (pip install numba)")
from numba import cuda  # noqa: E402
from accel.numba_cuda.attention import decode_split  # noqa: E402

from report import MaxDiffs  # noqa: E402
from strategies import attention_dims_softcap_BHKTSD, decode_dims_window_softcap_BHKSD, seam_attention_problem  # noqa: E402

if not nc.SIMULATOR and not cuda.is_available():
    pytest.skip("no CUDA GPU and NUMBA_ENABLE_CUDASIM is not 1: nothing to run the Numba-CUDA kernels on",
                allow_module_level=True)

# The simulator switches between its Python threads at every barrier; a short switch
# interval makes that about 10x faster. Restored after the module.
_SWITCH = sys.getswitchinterval()


def setup_module():
    sys.setswitchinterval(1e-4)


def teardown_module():
    sys.setswitchinterval(_SWITCH)


# Small blocks keep the simulator fast and force several tiles per row / query block.
SMALL = dict(threads=4, q_tile=4, k_tile=4)
FEW = settings(max_examples=6)

TABLE = MaxDiffs("GPU kernels vs float64 twins (tests/test_accel_cuda.py): max errors seen", print_each=True)

# What the registry must point at (test_registry_lists_every_numba_cuda_kernel_with_a_reason).
TWINS = {
    "softmax": ref_attention.softmax,
    "layer_norm": ref_norms.layer_norm,
    "rms_norm": ref_norms.rms_norm,
    "gelu_tanh_bias": ref_ffn.gelu_tanh_bias,
    "gelu_tanh": ref_ffn.gelu_tanh,
    "apply_rope": ref_positional.apply_rope,
    "rope_rotate": ref_positional.rope_rotate,
    "glu_gate": ref_ffn.glu_gate,
    "masked_attention": ref_attention.masked_attention,
    "decode_attention": ref_attention.decode_attention,
}
KERNEL_FNS = {
    "softmax": nc.softmax,
    "layer_norm": nc.layer_norm,
    "rms_norm": nc.rms_norm,
    "gelu_tanh_bias": nc.gelu_tanh_bias,
    "gelu_tanh": nc.gelu_tanh,
    "apply_rope": nc.apply_rope,
    "rope_rotate": nc.rope_rotate,
    "glu_gate": nc.glu_gate,
    "masked_attention": nc.masked_attention,
    "decode_attention": nc.decode_attention,
}


def assert_matches_twin(name: str, args: tuple, kwargs: dict | None = None, *, backend: str = "numba_cuda"):
    """Kernel `name` of `backend` (the registry's function) against its float64 twin, recorded in TABLE."""
    return TABLE.check(check_against_twin(registry.get(name, backend), args, kwargs))


def rand(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


DTYPES = [np.float64, np.float32]


# ----------------------------------------------------------------------------- row kernels

@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_twin_on_every_axis(dtype):
    """Softmax along any axis equals the twin: the wrapper moves the axis last, one block per row."""
    rng = np.random.default_rng(1)
    x = rand(rng, (3, 2, 13), dtype, 3.0)
    with nc.launch_config(threads=4):
        for axis in (-1, 0, 1):
            assert_matches_twin("softmax", (x,), {"axis": axis})


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf - inf inside simulated threads
def test_softmax_nonfinite_rows_match_twin():
    """An all -inf row gives zeros (max shift by 0, total 0 -> 1); +inf or NaN in a row gives a NaN row."""
    x = np.array([[-np.inf] * 5, [0.0, np.inf, 1.0, 2.0, 3.0], [0.0, np.nan, 1.0, -np.inf, 2.0],
                  [-np.inf, -np.inf, 0.5, -np.inf, -np.inf]])
    with nc.launch_config(threads=4):
        out = nc.softmax(x)
    assert np.array_equal(out[0], np.zeros(5))
    assert np.isnan(out[1]).all() and np.isnan(out[2]).all()
    assert np.array_equal(out[3], [0, 0, 1, 0, 0])
    assert_matches_twin("softmax", (x,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_match_twins(dtype):
    """LayerNorm and RMSNorm equal their twins on rows longer than the block (strided partial sums + tree)."""
    rng = np.random.default_rng(2)
    x = rand(rng, (2, 3, 19), dtype, 2.0) + dtype(5.0)  # |mean| >> std: the two-pass variance matters
    g, b = rand(rng, 19, dtype), rand(rng, 19, dtype)
    with nc.launch_config(threads=8):
        assert_matches_twin("layer_norm", (x, g, b))
        assert_matches_twin("layer_norm", (x, g, b), {"eps": 0.5})
        assert_matches_twin("rms_norm", (x, g))
        assert_matches_twin("rms_norm", (x[0, 0], g), {"eps": 1e-2})


def test_layer_norm_is_invariant_to_affine_rescaling_of_x():
    """LN(a x + c) = LN(x) for a > 0 (eps = 0): mean shifts by c and scales by a, std scales by a, both cancel."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 11))
    g, b = rng.standard_normal(11), rng.standard_normal(11)
    with nc.launch_config(threads=4):
        y1 = nc.layer_norm(x, g, b, eps=0.0)
        y2 = nc.layer_norm(3.0 * x - 7.0, g, b, eps=0.0)
    np.testing.assert_allclose(y2, y1, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # -inf * 0 inside simulated threads
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_bias_matches_twin_including_nonfinite(dtype):
    """Fused bias + GELU equals gelu_tanh(x + b); inf -> inf, -inf -> nan (-inf * 0), nan -> nan, as the twin."""
    rng = np.random.default_rng(4)
    x = rand(rng, (3, 7, 9), dtype, 4.0)
    b = rand(rng, 9, dtype)
    x[0, 0, :4] = [np.inf, -np.inf, np.nan, 1e30 if dtype == np.float32 else 1e300]
    with nc.launch_config(threads=8), np.errstate(invalid="ignore"):
        assert_matches_twin("gelu_tanh_bias", (x, b))
        out = nc.gelu_tanh(x)
        ref = ref_ffn.gelu_tanh(x.astype(np.float64))
    rtol, atol = registry.get("gelu_tanh_bias", "numba_cuda").tolerance(dtype)
    assert check_close(out, ref, rtol=rtol, atol=atol, dtype=dtype).passed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rope_matches_twin(dtype, interleaved):
    """RoPE equals its twin for both pairings, partial rotary and batched positions up to 1e4."""
    rng = np.random.default_rng(5)
    x = rand(rng, (2, 3, 5, 6), dtype)
    positions = rng.integers(0, 10_000, size=(2, 1, 5))  # [B, 1, T] broadcast over heads
    with nc.launch_config(threads=8):
        assert_matches_twin("apply_rope", (x, positions), {"interleaved": interleaved})
        assert_matches_twin("apply_rope", (x, np.arange(5) + 3), {"interleaved": interleaved, "rotary_dim": 4,
                                                                   "theta": 500.0})


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_rope_with_scaled_frequencies_matches_twin(dtype):
    """Given frequencies (YaRN's, from refimpl.rope_scaling) and an attention factor reach the kernel:
    equal to the twin, which differs from unscaled RoPE far beyond the tolerance; pass-through dims copied."""
    from refimpl.rope_scaling import rope_attention_factor, scaled_rope_frequencies

    rng = np.random.default_rng(7)
    x = rand(rng, (2, 3, 5, 8), dtype)
    positions = rng.integers(0, 10_000, size=(2, 1, 5))
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128)
    kw = {"rotary_dim": 6, "frequencies": scaled_rope_frequencies(6, **yarn),
          "attention_factor": rope_attention_factor(**yarn)}
    with nc.launch_config(threads=8):
        assert_matches_twin("apply_rope", (x, positions), kw)
        out = nc.apply_rope(x, positions, **kw)
    np.testing.assert_array_equal(out[..., 6:], x[..., 6:])
    assert np.abs(out - ref_positional.apply_rope(x, positions, rotary_dim=6)).max() > 0.01


def test_apply_rope_keeps_norms():
    """Each pair is turned by an orthogonal 2x2 rotation, so ||rope(x)|| = ||x|| per row."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 4, 8))
    with nc.launch_config(threads=8):
        y = nc.apply_rope(x, np.arange(4) * 37)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)


# ----------------------------------------------------------------------------- fused attention

def _qkv(rng, B, H, K, T, S, D, Dv, dtype):
    return rand(rng, (B, H, T, D), dtype), rand(rng, (B, K, S, D), dtype), rand(rng, (B, K, S, Dv), dtype)


# (B, H, K, T, S, D, Dv, options): several q tiles and k tiles with q_tile = k_tile = 4.
ATTENTION_CASES = [
    ("plain T<S", (1, 2, 2, 5, 9, 3, 4), {}),
    ("causal GQA T=S", (2, 4, 2, 10, 10, 5, 3), {"causal": True}),
    ("causal T>S (rows before key 0 see nothing)", (1, 2, 1, 9, 5, 4, 4), {"causal": True}),
    ("causal T=1", (2, 2, 1, 1, 11, 7, 2), {"causal": True}),
    ("causal window", (1, 3, 3, 13, 13, 4, 4), {"causal": True, "window": 3}),
    ("two-sided window T<S", (1, 2, 1, 6, 14, 3, 5), {"window": 2}),
    ("sinks + window", (1, 2, 2, 12, 17, 4, 3), {"causal": True, "window": 2, "n_sink": 3}),
    ("padding + alibi", (2, 4, 2, 6, 9, 4, 4), {"key_mask": "random", "alibi": True}),
    ("padding with an empty sequence", (2, 2, 1, 4, 6, 3, 3), {"causal": True, "key_mask": "empty"}),
    ("everything", (2, 4, 1, 11, 14, 5, 2), {"causal": True, "window": 4, "n_sink": 1, "key_mask": "random",
                                              "alibi": True, "scale": 0.3}),
    ("soft cap, causal", (1, 2, 1, 6, 9, 4, 3), {"causal": True, "softcap": 0.5}),
    ("soft cap with everything", (2, 2, 1, 9, 11, 4, 2), {"causal": True, "window": 4, "n_sink": 1,
                                                          "key_mask": "random", "alibi": True, "softcap": 2.0}),
]


def _attention_kwargs(rng, B, H, S, opts):
    kw = {k: v for k, v in opts.items() if k not in ("key_mask", "alibi")}
    if opts.get("key_mask") == "random":
        kw["key_mask"] = rng.random((B, S)) < 0.7
    elif opts.get("key_mask") == "empty":
        km = np.ones((B, S), bool)
        km[0] = False
        kw["key_mask"] = km
    if opts.get("alibi"):
        kw["alibi_slopes"] = 2.0 ** -np.arange(1, H + 1)
    return kw


TILED = dict(attention="tiled", tiled=(4, 4, 2, 2))  # v2: 4 threads, 2 x 2 micro-tiles of a 4 x 4 tile
KERNELS = {"rows": SMALL, "tiled": TILED}  # the two fused-attention kernels (accel/numba_cuda/attention.py)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("label, dims, opts", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_masked_attention_matches_twin(label, dims, opts, dtype, kernel):
    """Fused attention (both kernels) equals the twin for every mask pattern (zeros for rows with no visible key)."""
    rng = np.random.default_rng(zlib.crc32(label.encode()))
    B, H, K, T, S, D, Dv = dims
    q, k, v = _qkv(rng, B, H, K, T, S, D, Dv, dtype)
    kw = _attention_kwargs(rng, B, H, S, opts)
    with nc.launch_config(**KERNELS[kernel]):
        assert_matches_twin("masked_attention", (q, k, v), kw)


def test_masked_attention_fully_masked_rows_are_zero_not_nan():
    """Queries before key 0 (T > S, causal) and sequences with every key padded attend to nothing: zero rows."""
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, 2, 2, 2, 6, 3, 4, 4, np.float64)
    km = np.array([[True, True, True], [False, False, False]])
    with nc.launch_config(**SMALL):
        out = nc.masked_attention(q, k, v, causal=True, key_mask=km)
    assert np.isfinite(out).all()
    assert (out[0, :, :3] == 0).all() and (out[0, :, 3:] != 0).any(axis=-1).all()
    assert (out[1] == 0).all()


def test_masked_attention_nan_query_poisons_only_its_row():
    """A NaN in q[i] makes every score of row i NaN, so the twin's row i is NaN and no other row changes."""
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, 1, 2, 1, 6, 7, 3, 3, np.float64)
    q[0, 1, 2, 0] = np.nan
    with nc.launch_config(**SMALL):
        out = nc.masked_attention(q, k, v, causal=True)
    assert np.isnan(out[0, 1, 2]).all() and np.isfinite(np.delete(out[0, 1], 2, axis=0)).all()
    assert_matches_twin("masked_attention", (q, k, v), {"causal": True})


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_masked_attention_infinite_scores_follow_the_twins_softmax():
    """Scores all -inf give a zero row (softmax of an all -inf row is 0); a +inf score gives a NaN row (inf - inf)."""
    q = np.array([[[[1.0, 0.0], [-1.0, 0.0]]]])  # [1, 1, 2, 2]
    k = np.array([[[[-np.inf, 0.0], [-np.inf, 0.0], [-np.inf, 0.0]]]])  # [1, 1, 3, 2]: q0.k = -inf, q1.k = +inf
    v = np.arange(6.0).reshape(1, 1, 3, 2)
    with nc.launch_config(**SMALL):
        out = nc.masked_attention(q, k, v)
    assert (out[0, 0, 0] == 0).all() and np.isnan(out[0, 0, 1]).all()
    assert_matches_twin("masked_attention", (q, k, v))


def test_masked_attention_does_not_depend_on_tile_sizes():
    """Tile sizes change only the order of the online-softmax sums, never which terms enter them."""
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, 1, 2, 1, 9, 11, 3, 3, np.float64)
    kw = {"causal": True, "window": 5, "n_sink": 2}
    outs = []
    for q_tile, k_tile in ((2, 4), (4, 2), (8, 8), (16, 1)):
        with nc.launch_config(q_tile=q_tile, k_tile=k_tile):
            outs.append(nc.masked_attention(q, k, v, **kw))
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-13, atol=1e-14)


def test_causal_attention_ignores_future_keys():
    """Under a causal mask, changing keys/values after position p leaves the outputs of queries at <= p unchanged."""
    rng = np.random.default_rng(10)
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 4, 4, np.float64)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, 5:] = rng.standard_normal(k2[:, :, 5:].shape)
    v2[:, :, 5:] = rng.standard_normal(v2[:, :, 5:].shape)
    with nc.launch_config(**SMALL):
        a = nc.masked_attention(q, k, v, causal=True)
        b = nc.masked_attention(q, k2, v2, causal=True)
    np.testing.assert_array_equal(a[:, :, :5], b[:, :, :5])
    assert not np.allclose(a[:, :, 5:], b[:, :, 5:])


def test_gqa_equals_mha_with_repeated_kv_heads():
    """GQA with K < H equals MHA on k, v repeated G = H/K times per group (head h reads h // G)."""
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng, 1, 6, 2, 5, 7, 3, 2, np.float64)
    with nc.launch_config(**SMALL):
        gqa = nc.masked_attention(q, k, v, causal=True)
        mha = nc.masked_attention(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), causal=True)
    np.testing.assert_allclose(gqa, mha, rtol=1e-14, atol=1e-15)


# Drawn attention problems: tests/strategies.py's dims (the differential suite's, with this file's
# larger T, S and head dims and random ALiBi slopes), built by accel.verify.make_case.
ATTENTION_DIMS = attention_dims_softcap_BHKTSD(tiny=True, max_T=7, max_S=9, max_D=6, max_Dv=5, random_slopes=True)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf - inf inside simulated threads
@pytest.mark.parametrize("kernel", KERNELS)
@FEW
@given(dims=ATTENTION_DIMS, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_masked_attention_matches_twin_hypothesis(kernel, dims, dtype, seed):
    """Drawn shapes (odd D, T = 1, T != S, K < H), masks, ALiBi and NaN / inf in q, k:
    both fused kernels equal their twin."""
    case = make_case("masked_attention", np.random.default_rng(seed), dtype, dims)
    with nc.launch_config(**KERNELS[kernel]):
        assert_matches_twin("masked_attention", case.args, case.kwargs)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("after_nan", [[-np.inf, 1.0, 2.0], [-np.inf]])
def test_a_nan_score_is_not_forgotten_by_later_scores(kernel, after_nan):
    """A NaN score makes its row NaN (the twin's softmax), also when the scores after it in the same
    key tile are -inf or finite: the tile's running max must keep the NaN (every comparison with NaN
    is false, so a plain `not (s <= m)` update would replace it, and skip the tile or lose its NaN)."""
    keys = [np.nan, *after_nan]
    q = np.ones((1, 1, 1, 2))
    k = np.array([[x, 0.0] for x in keys])[None, None]  # [1, 1, S, 2]: scores = keys * scale
    v = np.arange(2.0 * len(keys)).reshape(1, 1, len(keys), 2)
    for tile in (1, 2, 4):
        cfg = dict(KERNELS[kernel], k_tile=tile) if kernel == "rows" else KERNELS[kernel]
        with nc.launch_config(**cfg):
            out = nc.masked_attention(q, k, v)
        assert np.isnan(out).all(), (tile, out)
    assert_matches_twin("masked_attention", (q, k, v), {})


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_decode_attention_skips_a_key_scored_minus_inf_whatever_the_split(threads):
    """A visible key scored -inf is skipped, its value never read, as the fused kernels do: an inf there gives
    the other keys' answer (2) at every launch size, whether or not its chunk holds a finite score."""
    q = np.array([[[1.0]]])
    k, v = np.array([[[[-np.inf], [1.0]]]]), np.array([[[[np.inf], [2.0]]]])
    with nc.launch_config(threads=threads):
        for kk, vv in ((k, v), (k[:, :, ::-1].copy(), v[:, :, ::-1].copy())):
            assert (nc.decode_attention(q, kk, vv) == 2).all()
            assert (nc.masked_attention(q[:, :, None], kk, vv) == 2).all()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # 0 / 0 with eps = 0, as the twin
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_of_a_constant_row_is_exact(dtype):
    """A constant row normalises to exact zeros (then beta), and to NaN with eps = 0 as the twin's 0 / 0: the
    kernel works on x - x0, where float32's mean of 1.7s was an ulp off and came out as -1 (eps = 0)."""
    x = np.full((2, 3), 1.7, dtype)
    x[1] = [5.0, 5.0 + 2 ** -20, 5.0]
    g, b = np.ones(3, dtype), np.arange(3, dtype=dtype)
    with nc.launch_config(threads=2):
        np.testing.assert_array_equal(nc.layer_norm(x[:1], g, b, eps=1e-5), b[None])
        assert np.isnan(nc.layer_norm(x[:1], g, b, eps=0.0)).all()
        assert_matches_twin("layer_norm", (x, g, b), {"eps": 1e-5})


# ------------------------------------------------------------- fused attention v2 ("tiled")

@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kernel", KERNELS)
def test_masked_attention_inf_and_nan_values_at_hidden_keys_match_the_twin(kernel):
    """inf / NaN in v at keys a query cannot see (causal future, padding, a visible key scored -inf) add nothing in
    the twin (it leaves their terms out) and in both kernels (they skip them): the outputs agree, non-finite
    entries exactly. A visible key whose weight underflows to 0 gives 0 * inf = NaN in both."""
    rng = np.random.default_rng(21)
    q, k, v = _qkv(rng, 2, 2, 1, 5, 6, 3, 3, np.float64)  # T < S: query i sees keys j <= 1 + i
    v[0, 0, 5] = np.inf  # seen by the last query of sequence 0 only
    v[0, 0, 4, 1] = np.nan  # seen by the last two queries
    v[1, 0, 2] = -np.inf  # a padded key of sequence 1
    km = np.ones((2, 6), bool)
    km[1, 2] = False
    k[0, 0, 3, 0] = -np.inf
    q[0, :, :, 0] = np.abs(q[0, :, :, 0]) + 0.5  # q . k = -inf: key 3 of sequence 0 is scored -inf by every query
    v[0, 0, 3] = np.nan
    with nc.launch_config(**KERNELS[kernel]):
        out = nc.masked_attention(q, k, v, causal=True, key_mask=km)
    ref = ref_attention.masked_attention(q, k, v, causal=True, key_mask=km)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(out[fin], ref[fin], rtol=1e-12, atol=1e-13)
    assert np.isfinite(ref[1]).all() and np.isfinite(ref[0, :, :3]).all() and np.isnan(ref[0, :, 3:, 1]).all()
    qu, ku, vu = np.array([[[[1.0]]]]), np.array([[[[-1000.0], [1.0]]]]), np.array([[[[np.inf], [2.0]]]])
    with nc.launch_config(**KERNELS[kernel]):
        assert np.isnan(nc.masked_attention(qu, ku, vu)).all()
    assert np.isnan(ref_attention.masked_attention(qu, ku, vu)).all()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_tiled_attention_nonfinite_rows_match_the_row_kernel():
    """Zero rows for queries that see no key, a NaN row for a NaN query or a +inf score, and an inf
    value behind the causal mask does not leak: the tiled kernel gives v1's non-finite pattern exactly."""
    rng = np.random.default_rng(12)
    q, k, v = _qkv(rng, 2, 2, 2, 9, 7, 3, 3, np.float64)  # T > S: the first rows see no key
    q[0, 1, 6, 0] = np.nan
    v[1, 0, 6, 1] = np.inf  # key 6: only the last query of sequence 1 sees it
    km = np.ones((2, 7), bool)
    km[0, 4] = False
    k[0, 1, 4, 0] = np.inf  # a padded key holding inf: never read
    outs = {}
    for name, cfg in (("rows", SMALL), ("tiled", TILED)):
        with nc.launch_config(**cfg):
            outs[name] = nc.masked_attention(q, k, v, causal=True, key_mask=km)
    a, b = outs["rows"], outs["tiled"]
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(np.isinf(a), np.isinf(b))
    fin = np.isfinite(a)
    np.testing.assert_allclose(b[fin], a[fin], rtol=1e-13, atol=1e-14)
    assert (b[:, :, :2] == 0).all() and np.isnan(b[0, 1, 6]).all() and np.isfinite(b[1, 0, :8]).all()
    qi = np.array([[[[1.0, 0.0], [-1.0, 0.0]]]])
    ki = np.array([[[[-np.inf, 0.0], [-np.inf, 0.0], [-np.inf, 0.0]]]])
    vi = np.arange(6.0).reshape(1, 1, 3, 2)
    with nc.launch_config(**TILED):
        out = nc.masked_attention(qi, ki, vi)
    assert (out[0, 0, 0] == 0).all() and np.isnan(out[0, 0, 1]).all()


def test_tiled_attention_does_not_depend_on_its_sizes():
    """Block tile and micro-tile sizes change only the order of sums: all equal v1 to float64 rounding."""
    rng = np.random.default_rng(13)
    q, k, v = _qkv(rng, 1, 2, 1, 16, 16, 5, 3, np.float64)
    for kw in ({"causal": True, "window": 6, "n_sink": 2}, {}):  # {}: every tile of whole blocks is full
        with nc.launch_config(**SMALL):
            ref = nc.masked_attention(q, k, v, **kw)
        # (4, 8, 1, 1): 8 threads along the keys, more than Dv's padded 4 output columns
        for tiled in ((4, 4, 2, 2), (8, 4, 4, 1), (4, 8, 1, 4), (2, 2, 1, 1), (8, 8, 2, 2), (4, 8, 1, 1)):
            with nc.launch_config(attention="tiled", tiled=tiled):
                np.testing.assert_allclose(nc.masked_attention(q, k, v, **kw), ref, rtol=1e-13, atol=1e-14)


def test_launch_config_checks_the_attention_choice():
    with pytest.raises(ValueError, match="'rows' or 'tiled'"):
        with nc.launch_config(attention="fast"):
            pass
    with pytest.raises(ValueError, match="power of two"):
        with nc.launch_config(tiled=(8, 8, 3, 2)):
            pass
    with pytest.raises(ValueError, match="RM <= BR"):
        with nc.launch_config(tiled=(2, 8, 4, 2)):
            pass
    with pytest.raises(ValueError, match="a tuple"):
        with nc.launch_config(tiled=(8, 8, 2, 2, 99)):
            pass
    with pytest.raises(ValueError, match="512 threads"):
        with nc.launch_config(tiled=(64, 64, 2, 2)):
            pass


def test_tiled_attention_skips_keys_scored_minus_inf_in_full_tiles():
    """A visible key scored -inf (k holds -inf) gets weight 0 and is skipped, so an inf in its value does not
    turn the row into NaN: in full tiles (no mask) as in partial ones, as v1 does."""
    q = np.abs(np.random.default_rng(14).standard_normal((1, 1, 4, 2))) + 0.5  # q[..., 0] > 0
    k = np.random.default_rng(15).standard_normal((1, 1, 4, 2))
    v = np.random.default_rng(16).standard_normal((1, 1, 4, 2))
    k[0, 0, 1, 0], v[0, 0, 1, 0] = -np.inf, np.inf
    for kw in ({}, {"causal": True}, {"window": 3}, {"causal": True, "window": 2, "n_sink": 1}):
        with nc.launch_config(**SMALL):
            ref = nc.masked_attention(q, k, v, **kw)
        with nc.launch_config(**TILED):
            out = nc.masked_attention(q, k, v, **kw)
        assert np.isfinite(ref).all(), kw
        np.testing.assert_allclose(out, ref, rtol=1e-13, atol=1e-14)


# ----------------------------------------------------------------------------- decode attention

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims, lengths", [
    ((2, 4, 2, 23, 5, 3), [23, 0]),  # several splits, an empty sequence
    ((3, 2, 1, 9, 7, 9), [1, 5, 9]),  # MQA, lengths inside the last chunk
    ((1, 3, 3, 30, 4, 4), None),  # no lengths: every entry valid
])
def test_decode_attention_matches_twin(dims, lengths, dtype):
    """Split-S decode attention, merged by max rescaling, equals the twin (L_b = 0 gives a zero row)."""
    rng = np.random.default_rng(12)
    B, H, K, S, D, Dv = dims
    q, k, v = rand(rng, (B, H, D), dtype), rand(rng, (B, K, S, D), dtype), rand(rng, (B, K, S, Dv), dtype)
    kw = {} if lengths is None else {"key_lengths": np.array(lengths)}
    with nc.launch_config(threads=4):
        assert_matches_twin("decode_attention", (q, k, v), kw)
        out = nc.decode_attention(q, k, v, **kw)
    if lengths is not None and 0 in lengths:
        assert (out[lengths.index(0)] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window, softcap", [(1, None), (6, None), (7, 0.5), (3, 2.0), (40, 1.0)])
def test_decode_attention_window_and_softcap_match_twin(window, softcap, dtype):
    """A window over a ragged cache cut into splits of 4 keys (S = 23: six splits): windows ending inside a split,
    starting on a split boundary (L = 23, w = 7: keys 16..22) and longer than the cache; splits wholly before the
    window contribute nothing. With a soft cap too."""
    rng = np.random.default_rng(15)
    B, H, K, S, D, Dv = 3, 4, 2, 23, 5, 3
    q, k, v = rand(rng, (B, H, D), dtype), rand(rng, (B, K, S, D), dtype), rand(rng, (B, K, S, Dv), dtype)
    kw = {"key_lengths": np.array([23, 0, 10]), "window": window, "softcap": softcap}
    with nc.launch_config(threads=4):
        assert decode_split(B, H, S) == (6, 4)
        assert_matches_twin("decode_attention", (q, k, v), kw)
        out = nc.decode_attention(q, k, v, **kw)
    assert (out[1] == 0).all()


def test_windowed_decode_equals_last_row_of_causal_window_attention():
    """decode(q_last, window=w) == masked_attention(causal=True,
    window=w)'s last row (p = S - 1 sees S - w .. S - 1)."""
    rng = np.random.default_rng(16)
    q, k, v = _qkv(rng, 2, 4, 2, 3, 13, 5, 3, np.float64)
    with nc.launch_config(threads=4, q_tile=4, k_tile=4):
        dec = nc.decode_attention(q[:, :, -1], k, v, window=5, softcap=1.5)
        full = nc.masked_attention(q, k, v, causal=True, window=5, softcap=1.5)[:, :, -1]
    np.testing.assert_allclose(dec, full, rtol=1e-13, atol=1e-14)


def test_decode_attention_equals_last_row_of_causal_attention():
    """The newest query (position S-1) sees every key under the causal mask,
    so decode == masked_attention's last row."""
    rng = np.random.default_rng(13)
    q, k, v = _qkv(rng, 2, 4, 2, 1, 13, 5, 3, np.float64)
    with nc.launch_config(threads=4, q_tile=4, k_tile=4):
        dec = nc.decode_attention(q[:, :, 0], k, v)
        full = nc.masked_attention(q, k, v, causal=True)[:, :, 0]
    np.testing.assert_allclose(dec, full, rtol=1e-13, atol=1e-14)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@FEW
@given(dims=decode_dims_window_softcap_BHKSD(tiny=True, max_G=3, max_S=20, max_D=6, max_Dv=6),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_decode_attention_matches_twin_hypothesis(dims, dtype, seed):
    """Drawn shapes and cache lengths (0 .. S, an empty row among them): decode attention equals its twin."""
    case = make_case("decode_attention", np.random.default_rng(seed), dtype, dims)
    with nc.launch_config(threads=4):
        assert_matches_twin("decode_attention", case.args, case.kwargs)


# ----------------------------------------------------------------------------- contract

def test_dtype_in_equals_dtype_out_float16_runs_in_float32():
    """float16 in gives float16 out (computed in float32, as the twins compute norms); float32 stays float32."""
    rng = np.random.default_rng(14)
    x16 = rng.standard_normal((2, 8)).astype(np.float16)
    with nc.launch_config(threads=4):
        assert nc.softmax(x16).dtype == np.float16
        y = nc.layer_norm(x16, np.ones(8, np.float16), np.zeros(8, np.float16))
        assert y.dtype == np.float16
        ref = ref_norms.layer_norm(x16, np.ones(8, np.float16), np.zeros(8, np.float16))
        np.testing.assert_allclose(y.astype(np.float32), ref.astype(np.float32), atol=2e-3)
        assert nc.gelu_tanh_bias(x16.astype(np.float32), np.zeros(8, np.float32)).dtype == np.float32


@pytest.mark.parametrize("call, exc, match", [
    (lambda: nc.layer_norm(np.ones((2, 3)), np.ones(4), np.ones(3)), ValueError, "gamma must have shape"),
    (lambda: nc.layer_norm(np.ones((2, 0)), np.ones(0), np.ones(0)), ValueError, "C >= 1"),
    (lambda: nc.rms_norm(np.ones(3), np.ones(3), eps=-1.0), ValueError, "eps"),
    (lambda: nc.softmax(np.ones(3), axis=1), ValueError, "axis"),
    (lambda: nc.softmax(np.ones(3, np.complex64)), TypeError, "real floating"),
    (lambda: nc.gelu_tanh_bias(np.ones((2, 3)), np.ones(2)), ValueError, "b must have shape"),
    (lambda: nc.apply_rope(np.ones((2, 5)), np.arange(2)), ValueError, "even head dim"),
    (lambda: nc.apply_rope(np.ones((2, 4)), np.arange(2), frequencies=np.ones(3)), ValueError,
     r"frequencies must have shape \[R/2\]"),
    (lambda: nc.apply_rope(np.ones((2, 4)), np.arange(2), attention_factor=-1.0), ValueError, "attention_factor"),
    (lambda: nc.masked_attention(np.ones((1, 3, 2, 4)), np.ones((1, 2, 2, 4)), np.ones((1, 2, 2, 4))),
     ValueError, "multiple of the key/value heads"),
    (lambda: nc.masked_attention(np.ones((1, 2, 2, 4)), np.ones((1, 2, 2, 4)), np.ones((1, 2, 2, 4)),
                                 window=2, n_sink=1), ValueError, "n_sink"),
    (lambda: nc.masked_attention(np.ones((1, 2, 2, 4)), np.ones((1, 2, 2, 4)), np.ones((1, 2, 2, 4)),
                                 key_mask=np.ones((1, 2))), TypeError, "key_mask must be boolean"),
    (lambda: nc.masked_attention(np.ones((1, 2, 2, 4)), np.ones((1, 2, 2, 4)), np.ones((1, 2, 2, 4)),
                                 alibi_slopes=np.ones(3)), ValueError, "alibi_slopes must have shape"),
    (lambda: nc.decode_attention(np.ones((1, 2, 4)), np.ones((1, 2, 3, 4)), np.ones((1, 2, 3, 4)),
                                 # the twin's (refimpl.attention.check_decode_inputs) words
                                 key_lengths=np.array([4])), ValueError, "lengths must lie in 0 .. S"),
    (lambda: nc.decode_attention(np.ones((1, 2, 2, 4)), np.ones((1, 2, 3, 4)), np.ones((1, 2, 3, 4))),
     ValueError, r"q must have shape \[B, H, D\]"),
])
def test_bad_input_is_refused_at_the_boundary(call, exc, match):
    """Bad shapes and options raise the twin's kind of error, naming the argument, before any launch."""
    with pytest.raises(exc, match=match):
        call()


def test_device_entry_points_take_device_arrays():
    """The *_device functions read and write device arrays (what GPT-2 on `cuda` uses): same numbers as the wrappers."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal((3, 10))
    g, b = rng.standard_normal(10), rng.standard_normal(10)
    with nc.launch_config(threads=4):
        out = cuda.device_array_like(x)
        nc.layer_norm_device(cuda.to_device(x), cuda.to_device(g), cuda.to_device(b), out)
        np.testing.assert_array_equal(out.copy_to_host(), nc.layer_norm(x, g, b))
        nc.gelu_tanh_bias_device(cuda.to_device(x), cuda.to_device(b), out)
        np.testing.assert_array_equal(out.copy_to_host(), nc.gelu_tanh_bias(x, b))


def test_registry_lists_every_numba_cuda_kernel_with_a_reason():
    """Every kernel of this backend is registered against its twin, with a tolerance note."""
    specs = {s.name: s for s in registry.kernels("numba_cuda") if not s.fused_step}  # (steps: test_accel_steps.py)
    assert set(specs) == set(KERNEL_FNS)
    for name, spec in specs.items():
        assert spec.load() is KERNEL_FNS[name] and spec.load_twin() is TWINS[name]
        assert spec.note and spec.sizes == "tiny"


# ----------------------------------------------------------------------------- real-target compile

def _nvidia_dir(package: str):
    """The folder of a pip-installed NVIDIA wheel (nvidia.cuda_nvcc, nvidia.cuda_nvrtc), or None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(f"nvidia.{package}")
    except ModuleNotFoundError:
        return None
    return None if spec is None or not spec.submodule_search_locations else list(spec.submodule_search_locations)[0]


def _nvvm_home():
    home = os.environ.get("CUDA_HOME")
    if home and os.path.isdir(os.path.join(home, "nvvm", "libdevice")):
        return home
    d = _nvidia_dir("cuda_nvcc")
    return d if d and os.path.isdir(os.path.join(d, "nvvm", "libdevice")) else None


@pytest.mark.skipif(_nvvm_home() is None, reason="no NVVM to compile PTX with (pip install nvidia-cuda-nvcc-cu12, "
                                                  "or set CUDA_HOME to a CUDA toolkit)")
def test_every_kernel_compiles_for_a_real_gpu():
    """The simulator runs kernels as Python: compiling each one to sm_90 PTX (NVVM, no GPU needed) proves it types
    and lowers for the real CUDA target; the CuPy sources compile with NVRTC when its wheel is present."""
    import glob
    import subprocess

    cmd = [sys.executable, "scripts/check_cuda_compiles.py"]
    nvrtc = _nvidia_dir("cuda_nvrtc")
    libs = sorted(glob.glob(os.path.join(nvrtc, "lib", "libnvrtc.so*"))) if nvrtc else []
    libs = [p for p in libs if "builtins" not in p and ".alt." not in p]
    if libs:
        cmd += ["--nvrtc", libs[0]]
    ptxas = os.path.join(_nvvm_home(), "bin", "ptxas")
    if os.access(ptxas, os.X_OK):  # each kernel's registers, stack frame, spills, shared memory (printed)
        cmd += ["--ptxas", ptxas]
    env = {**os.environ, "CUDA_HOME": _nvvm_home(), "NUMBA_ENABLE_CUDASIM": "0"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    print(res.stdout[-3000:], res.stderr[-2000:])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "all kernels compiled" in res.stdout
    if "--ptxas" in cmd:  # the tiled attention kernel (float32) keeps its accumulators in registers under its cap
        lines = res.stdout.splitlines()
        at = next((i for i, line in enumerate(lines) if "flash_attention_tiled" in line and "[float32]" in line), None)
        assert at is not None and at + 1 < len(lines), "no ptxas report for flash_attention_tiled [float32]"
        report = lines[at + 1]
        assert "(capped at 128)" in report and "0 B stack frame, 0/0 B spilled" in report, report


# ----------------------------------------------------------------------------- GPT-2 glue (CPU)

def _tiny_gpt2(seed: int = 0):
    from refimpl.gpt2 import GPT2Config, GPT2Model, GPT2Params

    config = GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                        bos_token_id=None, eos_token_id=None)
    rng = np.random.default_rng(seed)
    gains = ("ln_1.weight", "ln_2.weight", "ln_f.weight")
    tensors = {n: 0.3 * rng.standard_normal(shape) + (1.0 if n.endswith(gains) else 0.0)
               for n, shape in GPT2Params.expected_shapes(config).items()}
    return GPT2Model(config, GPT2Params.from_named_tensors(tensors, config))


def _simulated_gpu_ops():
    """accel.cupy.gpt2's glue over NumPy arrays with the (simulated) Numba-CUDA kernels."""
    from accel.cupy.gpt2 import make_ops

    return make_ops("numba_cuda-sim", np, base_kernels())


def test_gpt2_gpu_ops_glue_matches_numpy_backend():
    """GPT-2 through the GPU Ops glue (causal/key_mask attention, decode path, device params) equals the NumPy backend.

    Same model code, same weights; only the kernels differ (each proved against its twin above),
    so logits agree to float32 rounding and greedy decoding (cache + decode kernel) gives the same tokens.
    """
    from refimpl import gpt2

    model = _tiny_gpt2()
    ops = _simulated_gpu_ops()
    ids = np.random.default_rng(1).integers(0, 50, (2, 6))
    pad = np.ones((2, 6), bool)
    pad[0, :2] = False  # left padding: attention with causal=True and a key mask
    with nc.launch_config(threads=8, q_tile=4, k_tile=4):
        z = gpt2.logits(model, ids, backend=ops)
        zp = gpt2.logits(model, ids, backend=ops, attention_mask=pad)
        gen = gpt2.generate(model, ids[0], max_new_tokens=3, backend=ops)
    z0 = gpt2.logits(model, ids)
    zp0 = gpt2.logits(model, ids, attention_mask=pad)
    d, dp = float(np.abs(z - z0).max()), float(np.abs(zp - zp0).max())
    print(f"GPT-2 (tiny, float32) simulated GPU ops vs numpy backend: max abs logit diff {d:.3e}, padded {dp:.3e}")
    assert z.dtype == np.float32
    assert d < 1e-4 and dp < 1e-4
    assert gen.ids == gpt2.generate(model, ids[0], max_new_tokens=3).ids
    assert ops.prepare(model.params) is ops.prepare(model.params)  # weights copied once per params object


def _kv_append_host(qkv, k_cache, v_cache, lengths):  # the twin of accel.cupy.device.kv_append on NumPy arrays
    B, H, S, D = k_cache.shape
    C = H * D
    for b in range(B):
        k_cache[b, :, lengths[b] - 1] = qkv[b, C:2 * C].reshape(H, D)
        v_cache[b, :, lengths[b] - 1] = qkv[b, 2 * C:].reshape(H, D)


def test_gpt2_decode_step_matches_numpy_backend():
    """accel.cupy.gpt2.decode_step (the launches the cuda backend captures into a CUDA graph), run
    over NumPy arrays with the simulated kernels as the Ops' decode_blocks: greedy and beam
    decoding give the NumPy backend's tokens and the cache it writes equals refimpl's."""
    from types import SimpleNamespace

    from accel.cupy.gpt2 import decode_step, make_ops
    from refimpl import gpt2
    from refimpl.gpt2.model import KVCache, hidden_states

    model = _tiny_gpt2()
    steps = []
    kernels = SimpleNamespace(
        layer_norm=lambda x, g, b, eps: nc.layer_norm(x, g, b, eps=eps), linear=lambda x, w, b: x @ w + b,
        matmul=np.matmul, gelu_tanh_bias=nc.gelu_tanh_bias, kv_append=_kv_append_host,
        decode_attention=lambda q, k, v, lengths: nc.decode_attention(q, k, v, key_lengths=lengths))

    def decode_blocks(x, params, config, cache, ops, positions, key_mask):
        if x.shape[1] != 1 or key_mask is not None:
            return None  # (decode_step takes one new token per sequence and no key mask)
        steps.append(cache.length)
        B = x.shape[0]
        lengths = np.full(B, cache.length + 1, np.int64)
        return decode_step(x[:, 0], params, config, cache.k, cache.v, lengths, kernels, np)[:, None]

    ops = make_ops("decode-step-sim", np, base_kernels(), decode_blocks=decode_blocks)
    ids = np.random.default_rng(5).integers(0, 50, 5)
    with nc.launch_config(threads=8):
        greedy = gpt2.generate(model, ids, max_new_tokens=4, backend=ops).ids
        beams = gpt2.generate(model, ids, max_new_tokens=3, num_beams=2, backend=ops).ids
        cache = KVCache.allocate(model.config, 1, max_len=8, dtype=np.float32)
        ref_cache = KVCache.allocate(model.config, 1, max_len=8, dtype=np.float32)
        for t in range(3):  # the prompt one token at a time: every step takes the decode path
            h = hidden_states(model.params, model.config, ids[None, t:t + 1], cache=cache, ops=ops)
            h0 = hidden_states(model.params, model.config, ids[None, t:t + 1], cache=ref_cache)
    assert steps and steps[-3:] == [0, 1, 2]  # the hook ran, at every cache length
    assert greedy == gpt2.generate(model, ids, max_new_tokens=4).ids
    assert beams == gpt2.generate(model, ids, max_new_tokens=3, num_beams=2).ids
    d_cache = float(np.abs(cache.k - ref_cache.k).max() + np.abs(cache.v - ref_cache.v).max())
    d_h = float(np.abs(h - h0).max())
    print(f"GPT-2 decode_step (simulated kernels) vs numpy backend: cache max diff {d_cache:.2e}, hidden {d_h:.2e}")
    assert cache.length == 3 and d_cache < 1e-5 and d_h < 1e-4


def test_gpt2_decode_step_declines_what_it_does_not_cover():
    """accel.cupy.gpt2._step_applies (the cuda backend's test before its graph step), over NumPy
    arrays: our device weights with every bias and a [L, B, H, S, D] float cache take the step;
    a missing bias, float16, a misshaped or non-contiguous cache, or T > 1 do not."""
    import dataclasses

    from accel.cupy.gpt2 import _step_applies
    from refimpl.gpt2.model import KVCache

    model = _tiny_gpt2()
    cfg = model.config
    dev = _simulated_gpu_ops().prepare(model.params)
    cache = KVCache.allocate(cfg, 2, max_len=8, dtype=np.float32)
    x = np.zeros((2, 1, cfg.n_embd), np.float32)
    assert _step_applies(x, dev, cfg, cache, np)
    assert not _step_applies(x, model.params, cfg, cache, np)  # host GPT2Params: not prepared for the device
    assert not _step_applies(np.zeros((2, 2, cfg.n_embd), np.float32), dev, cfg, cache, np)  # T = 2
    assert not _step_applies(x.astype(np.float16), dev, cfg, cache, np)
    half = KVCache(cache.k.astype(np.float16), cache.v.astype(np.float16))
    assert not _step_applies(x.astype(np.float16), dev, cfg, half, np)
    other_heads = KVCache(cache.k.reshape(cfg.n_layer, 2, 1, 8, cfg.n_embd),
                          cache.v.reshape(cfg.n_layer, 2, 1, 8, cfg.n_embd))
    assert not _step_applies(x, dev, cfg, other_heads, np)
    strided = KVCache(np.zeros(cache.k.shape[:-1] + (2 * cache.k.shape[-1],), np.float32)[..., ::2], cache.v)
    assert not _step_applies(x, dev, cfg, strided, np)
    block = dev.blocks[0]
    no_bias_block = dataclasses.replace(block, mlp_proj=dataclasses.replace(block.mlp_proj, b=None))
    no_bias = dataclasses.replace(dev, blocks=(no_bias_block,) + dev.blocks[1:])
    assert not _step_applies(x, no_bias, cfg, cache, np)


def test_decode_attention_refuses_partials_of_other_launch_sizes():
    """decode_attention_device with scratch made for other sizes raises, naming decode_partials."""
    from accel.numba_cuda.attention import decode_attention_device, decode_partials

    rng = np.random.default_rng(9)
    q, k, v = (rand(rng, (1, 2, 4), np.float32), rand(rng, (1, 2, 40, 4), np.float32),
               rand(rng, (1, 2, 40, 4), np.float32))
    out = cuda.device_array((1, 2, 4), np.float32)
    lengths = cuda.to_device(np.array([40]))
    with nc.launch_config(threads=8):
        right = decode_partials(1, 2, 40, 4, np.float32)
        wrong = decode_partials(1, 2, 40, 4, np.float64)
        decode_attention_device(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), lengths, out, partials=right)
        ref = ref_attention.decode_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
        assert np.abs(out.copy_to_host() - ref).max() < 1e-5
        with pytest.raises(ValueError, match="decode_partials"):
            decode_attention_device(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), lengths, out,
                                    partials=wrong)
    with nc.launch_config(threads=4), pytest.raises(ValueError, match="decode_partials"):  # more splits now
        decode_attention_device(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), lengths, out, partials=right)


def base_kernels():
    """The kernels namespace _simulated_gpu_ops builds its Ops from."""
    from types import SimpleNamespace

    return SimpleNamespace(
        layer_norm=lambda x, g, b, eps: nc.layer_norm(x, g, b, eps=eps), linear=lambda x, w, b: x @ w + b,
        matmul=np.matmul, gelu_tanh_bias=nc.gelu_tanh_bias,
        masked_attention=nc.masked_attention, decode_attention=nc.decode_attention, to_numpy=np.asarray)


@pytest.mark.parametrize("T, kwargs", [
    (1, {"causal": True}), (1, {"causal": True, "window": 2}), (1, {"alibi_slopes": [0.5, 0.25]}),
    (1, {"key_mask": "padded", "scale": 0.3}), (4, {"causal": True, "key_mask": "padded"}),
    (4, {"causal": True, "window": 2, "n_sink": 1}),
], ids=repr)
def test_gpt2_gpu_attention_takes_the_twins_keywords(T, kwargs):
    """The GPU Ops' attention (over NumPy arrays and the simulated kernels) is refimpl's masked_attention
    for every keyword of the Ops seam: one query takes the decode kernel only with no key mask, window
    or ALiBi, and the fused kernel honours the rest."""
    ops = _simulated_gpu_ops()
    B, H, S, D = 2, 2, 7, 4
    q, k, v, kwargs = seam_attention_problem(np.random.default_rng(13), B, H, T, S, D, kwargs, n_pad=3)
    with nc.launch_config(threads=8, q_tile=4, k_tile=4):
        out = ops.attention(q, k, v, **kwargs)
    np.testing.assert_allclose(out, ref_attention.masked_attention(q, k, v, **kwargs), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- CuPy (GPU only)

def _cupy_reason() -> str:
    return registry.available_backends()["cupy"]


needs_cupy = pytest.mark.skipif(bool(_cupy_reason()), reason=f"CuPy backend unavailable: {_cupy_reason()}")


@needs_cupy
@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_row_kernels_match_twins(dtype):
    """RawKernels (softmax, layer_norm,
    rms_norm) and the fused bias + GELU equal their twins, rows longer than a block."""
    from accel.cupy import wrappers as cw

    for name in ("softmax", "layer_norm", "rms_norm", "gelu_tanh_bias", "masked_attention", "decode_attention"):
        assert registry.get(name, "cupy").load() is getattr(cw, name)  # what assert_matches_twin runs
    rng = np.random.default_rng(20)
    x = rand(rng, (3, 5, 301), dtype, 3.0)
    g, b = rand(rng, 301, dtype), rand(rng, 301, dtype)
    assert_matches_twin("softmax", (x,), backend="cupy")
    assert_matches_twin("softmax", (x,), {"axis": 1}, backend="cupy")
    assert_matches_twin("layer_norm", (x + dtype(20), g, b), backend="cupy")
    assert_matches_twin("rms_norm", (x, g), backend="cupy")
    assert_matches_twin("gelu_tanh_bias", (x, b), backend="cupy")
    special = np.array([[-np.inf] * 4, [0, np.inf, 1, 2], [0, np.nan, 1, 2]], dtype)
    with np.errstate(invalid="ignore"):
        assert_matches_twin("softmax", (special,), backend="cupy")


@needs_cupy
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("label, dims, opts", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_cupy_attention_matches_twin(label, dims, opts, dtype):
    """The fused kernel launched on CuPy memory (default GPU tiles) equals the twin."""
    rng = np.random.default_rng(zlib.crc32(label.encode()))
    B, H, K, T, S, D, Dv = dims
    q, k, v = _qkv(rng, B, H, K, T * 20, S * 20, D * 8, Dv * 8, dtype)
    kw = _attention_kwargs(rng, B, H, S * 20, opts)
    assert_matches_twin("masked_attention", (q, k, v), kw, backend="cupy")
    lengths = rng.integers(0, S * 20 + 1, size=B)
    assert_matches_twin("decode_attention", (q[:, :, -1], k, v), {"key_lengths": lengths}, backend="cupy")


@needs_cupy
def test_cupy_linear_matches_twin():
    """x W + b through cuBLAS equals refimpl.linear.linear (float64: tight; float32: GEMM rounding, no TF32)."""
    from accel.cupy import wrappers as cw
    from refimpl.linear import LinearParams, linear

    rng = np.random.default_rng(21)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-4)):
        x = rand(rng, (3, 7, 64), dtype)
        p = LinearParams(rand(rng, (64, 48), dtype), rand(rng, 48, dtype))
        out = cw.linear(x, p)
        ref = linear(x.astype(np.float64), LinearParams(p.w.astype(np.float64), p.b.astype(np.float64)))
        d = float(np.abs(out - ref).max())
        TABLE.show(f"linear[cupy] {np.dtype(dtype).name}", max_abs=d, tol=tol)
        assert out.dtype == dtype and d < tol


@needs_cupy
def test_cupy_gpt2_ops_match_numpy_backend():
    """GPT-2 on the `cuda` Ops (CuPy + kernels): logits equal the NumPy backend's, greedy tokens identical
    with the decode step captured in a CUDA graph, run eagerly, and not used at all."""
    import dataclasses

    from accel.cupy.gpt2 import CAPTURES, OPS
    from refimpl import gpt2

    model = _tiny_gpt2(3)
    ids = np.random.default_rng(4).integers(0, 50, (2, 9))
    pad = np.ones((2, 9), bool)
    pad[1, :4] = False
    d = float(np.abs(gpt2.logits(model, ids, backend=OPS) - gpt2.logits(model, ids)).max())
    dp = float(np.abs(gpt2.logits(model, ids, backend=OPS, attention_mask=pad)
                      - gpt2.logits(model, ids, attention_mask=pad)).max())
    print(f"GPT-2 (tiny, float32) cuda Ops vs numpy backend: max abs logit diff {d:.3e}, padded {dp:.3e}")
    assert d < 1e-4 and dp < 1e-4
    captured = CAPTURES["captured"]
    greedy = gpt2.generate(model, ids[0], max_new_tokens=20, backend=OPS).ids
    assert greedy == gpt2.generate(model, ids[0], max_new_tokens=20).ids
    assert CAPTURES["captured"] == captured + 1 and not CAPTURES["failures"], CAPTURES  # replayed 18 times
    os.environ["ACCEL_CUDA_GRAPHS"] = "0"  # the same step run eagerly, launch by launch
    try:
        assert gpt2.generate(model, ids[0], max_new_tokens=20, backend=OPS).ids == greedy
    finally:
        del os.environ["ACCEL_CUDA_GRAPHS"]
    no_step = dataclasses.replace(OPS, decode_blocks=None)  # refimpl's blocks, one operation at a time
    assert gpt2.generate(model, ids[0], max_new_tokens=20, backend=no_step).ids == greedy
    # Beam search reorders the device KV cache with host row indices (KVCache.reorder).
    assert gpt2.generate(model, ids[0], max_new_tokens=5, num_beams=3, backend=OPS).ids == \
        gpt2.generate(model, ids[0], max_new_tokens=5, num_beams=3).ids


@needs_cupy
def test_cupy_attention_is_ordered_on_a_non_blocking_stream():
    """Inside a non-blocking CuPy stream (which the legacy default stream does not wait for), the
    Numba-CUDA attention kernels run on that stream: inputs written just before on the stream are
    read, and CuPy work just after on the stream sees the output (accel.cupy.device._numba_stream)."""
    import cupy as cp

    from accel.cupy import device
    from refimpl.attention import decode_attention, masked_attention

    rng = np.random.default_rng(23)
    B, H, T, S, D = 2, 4, 64, 512, 64
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((B, H, T, D), (B, H, S, D), (B, H, S, D)))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        big = cp.ones((4096, 4096), cp.float32)  # keep the stream busy before the inputs are written
        for _ in range(4):
            big = big @ big / 4096
        qd, kd, vd = (cp.asarray(a) * 1 for a in (q, k, v))  # written on the stream, after the GEMMs
        out = device.masked_attention(qd, kd, vd, causal=True) * 2  # read right after, on the stream
        dec = device.decode_attention(cp.ascontiguousarray(qd[:, :, -1]), kd, vd) * 2
    stream.synchronize()
    ref = masked_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal=True)
    ref_dec = decode_attention(q[:, :, -1].astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    d = float(np.abs(cp.asnumpy(out) / 2 - ref).max())
    d_dec = float(np.abs(cp.asnumpy(dec) / 2 - ref_dec).max())
    TABLE.show("masked_attention[cupy] float32 on a non-blocking stream", max_abs=d, tol=1e-4)
    TABLE.show("decode_attention[cupy] float32 on a non-blocking stream", max_abs=d_dec, tol=1e-4)
    assert d < 1e-4 and d_dec < 1e-4
