"""The differential suite: every registered accel kernel equals its refimpl twin.

One test, parametrized over `accel.registry.KERNELS` and each kernel's dtypes: Hypothesis draws
shapes and options (odd head dims, T = 1, T != S and T > S, K < H, fully masked rows, every
mask pattern, ALiBi; NaN / inf entries for the elementwise kernels, in q and k for attention,
and in v past the key lengths for decode attention), `accel.verify.make_case`
builds the inputs in the kernel's dtype, and `accel.verify.check_against_twin` runs the twin in
float64 on the same values and applies the registry's tolerance (`accel._common.check_close`):
|out - ref| <= atol + rtol |ref| where ref is finite, identical non-finite values elsewhere.
Proof obligation: none beyond the definition; the twin IS the specification.

Entries of backends that cannot run here are skipped with the registry's reason (CuPy without
a GPU). Numba-CUDA entries run under NUMBA_ENABLE_CUDASIM=1 (set below when there is no GPU)
on their registered "tiny" sizes. Run with -s or -v to read the max errors seen per kernel (a table
at the end of the run: tests/report.py). The dims strategies are tests/strategies.py's.
"""

from __future__ import annotations

import cuda_simulator  # noqa: F401  (before numba.cuda: the simulator where there is no GPU)

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel import registry
from accel._common import check_close
from accel.verify import VERIFY_DIMS, make_case, run_case
from report import MaxDiffs
from strategies import KERNEL_DIMS, attention_dims_softcap_BHKTSD, decode_dims_window_softcap_BHKSD

AVAILABLE = registry.available_backends()
TABLE = MaxDiffs("accel kernels vs float64 twins (differential suite): max errors seen")

# Examples per (kernel, dtype): the CUDA simulator runs each GPU thread as a Python thread.
EXAMPLES = {"full": 30, "tiny": 4}

# (the fused decoding steps draw whole models: tests/test_accel_steps.py)
CASES = [pytest.param(spec, dtype, id=f"{spec.id}-{dtype}") for spec in registry.KERNELS for dtype in spec.dtypes
         if not spec.fused_step]


def _record(key: str, res) -> None:
    """A CheckResult into the module's table (tests/report.py) under `key`."""
    TABLE.add(key, max_abs=res.max_abs, max_rel=res.max_rel, worst=res.worst)


def _require(spec):
    reason = AVAILABLE[spec.backend]
    if reason:
        pytest.skip(f"{spec.backend} unavailable here: {reason}")


@pytest.mark.parametrize("spec, dtype", CASES)
def test_kernel_equals_twin(spec, dtype):
    """out == twin(float64 inputs) within the registry tolerance, for Hypothesis-drawn shapes and values."""
    _require(spec)
    tiny = spec.sizes == "tiny"

    @settings(max_examples=EXAMPLES[spec.sizes])
    @given(dims=KERNEL_DIMS[spec.name](tiny), seed=st.integers(0, 2**32 - 1))
    def check(dims, seed):
        TABLE.check(run_case(spec, dtype, make_case(spec.name, np.random.default_rng(seed), dtype, dims)))

    check()


@pytest.mark.parametrize("spec, dtype", CASES)
def test_kernel_equals_twin_on_verify_cases(spec, dtype):
    """The fixed cases of `python -m refimpl verify` (fully masked rows, T > S, sinks, ALiBi, ragged caches)."""
    _require(spec)
    for n, dims in enumerate(VERIFY_DIMS[spec.name][spec.sizes]):
        TABLE.check(run_case(spec, dtype, make_case(spec.name, np.random.default_rng(n), dtype, dims)))


# ------------------------------------------------------------------ the check itself can fail

def test_check_close_rejects_what_it_must():
    """Each failure mode of the rule is detected: error over tolerance, NaN vs number, inf sign, shape, dtype."""
    ref = np.array([1.0, -2.0, np.inf, np.nan, 0.0])
    assert check_close(ref.copy(), ref, rtol=0, atol=0).passed
    off = ref.copy()
    off[0] += 1e-6
    assert check_close(off, ref, rtol=1e-7, atol=0).n_bad == 1
    assert check_close(off, ref, rtol=1e-5, atol=0).passed
    nan_for_num = ref.copy()
    nan_for_num[1] = np.nan
    assert not check_close(nan_for_num, ref, rtol=1, atol=1).passed
    num_for_nan = ref.copy()
    num_for_nan[3] = 0.0
    assert not check_close(num_for_nan, ref, rtol=1, atol=1).passed
    neg_inf = ref.copy()
    neg_inf[2] = -np.inf
    assert not check_close(neg_inf, ref, rtol=1, atol=1).passed
    assert not check_close(ref[:4], ref, rtol=1, atol=1).passed
    assert not check_close(ref.astype(np.float32), ref, rtol=1, atol=1, dtype=np.float64).passed


def test_tolerance_check_is_tight_enough_to_catch_a_masking_bug():
    """Attention with the causal flag dropped differs from the causal twin by far more than the tolerance."""
    spec = registry.get("masked_attention", "numba")
    _require(spec)
    case = make_case(spec.name, np.random.default_rng(0), "float32", dict(B=1, H=2, K=1, T=9, S=9, D=8, Dv=4))
    out = spec.load()(*case.args)
    ref = spec.load_twin()(*[a.astype(np.float64) for a in case.args], causal=True)
    rtol, atol = spec.tolerance("float32")
    assert not check_close(out, ref, rtol=rtol, atol=atol).passed


# ------------------------------------------------------------------------------- registry

def test_registry_entries_name_their_twin_and_tolerance():
    """Every spec: the twin resolves and has the kernel's name, each dtype has a tolerance, the note says why."""
    seen = set()
    for spec in registry.KERNELS:
        assert (spec.name, spec.backend) not in seen, f"duplicate registry entry {spec.id}"
        seen.add((spec.name, spec.backend))
        twin = spec.load_twin()
        home = "accel.steps" if spec.fused_step else "refimpl."  # (a fused step's twin is refimpl's step, there)
        assert twin.__name__ == spec.name and twin.__module__.startswith(home)
        assert spec.dtypes and all(spec.tolerance(d)[0] >= 0 and spec.tolerance(d)[1] >= 0 for d in spec.dtypes)
        assert len(spec.note) > 40, f"{spec.id}: the note must say why the tolerance is what it is"
        package = {"numba": "accel.numba_cpu", "numba_cuda": "accel.numba_cuda", "cupy": "accel.cupy"}[spec.backend]
        if spec.fused_step:
            assert spec.fn == f"accel.steps:{spec.backend}_{spec.name}", f"{spec.id}: fn {spec.fn}"
        else:
            assert spec.fn.startswith(package + "."), f"{spec.id}: fn {spec.fn} is outside {package}"


def test_registry_lookups_and_backend_reasons():
    """get() finds entries and names what exists when it cannot; every unavailable backend gives a reason."""
    assert registry.get("softmax", "numba").backend == "numba"
    with pytest.raises(ValueError, match="registered"):
        registry.get("no_such_kernel", "numba")
    with pytest.raises(ValueError, match="backend"):
        registry.kernels("fortran")
    assert {s.name for s in registry.kernels("numba") if s.entry == "kernel"} == {
        "softmax", "layer_norm", "rms_norm", "gelu_tanh_bias", "glu_gate", "apply_rope", "masked_attention",
        "decode_attention", "quantized_matvec", "quantized_matvec_q8", "quantized_matmul"}
    assert {s.name for s in registry.kernels("numba") if s.entry != "kernel"} == {  # LlamaOps' ops, fused steps
        "rope_rotate", "linear", "lm_head", "llama_decode_step", "gpt2_decode_step"}
    avail = registry.available_backends()
    assert set(avail) == set(registry.BACKENDS)
    assert avail["numba"] == "", avail["numba"]
    for backend, reason in avail.items():
        assert isinstance(reason, str)
        print(f"backend {backend}: {'available' if not reason else reason}")


# ------------------------------------------------------------------ numba-specific properties

def _numba(name):
    spec = registry.get(name, "numba")
    _require(spec)
    return spec.load(), spec.load_twin()


BAD_CALLS = [
    ("softmax", lambda: (np.zeros((2, 3)),), {"axis": 2}),
    ("layer_norm", lambda: (np.zeros((2, 3)), np.ones(4), np.zeros(3)), {}),
    ("rms_norm", lambda: (np.zeros((2, 3)), np.ones(3)), {"eps": -1.0}),
    ("gelu_tanh_bias", lambda: (np.zeros((2, 3)), np.zeros(2)), {}),
    ("glu_gate", lambda: (np.zeros((2, 3)), np.zeros((2, 2))), {}),
    ("apply_rope", lambda: (np.zeros((2, 5)), np.arange(2)), {}),
    ("apply_rope", lambda: (np.zeros((2, 4)), np.arange(3)), {}),
    ("apply_rope", lambda: (np.zeros((2, 4)), np.arange(2)), {"frequencies": np.ones(4)}),
    ("apply_rope", lambda: (np.zeros((2, 4)), np.arange(2)), {"frequencies": [1.0, np.inf]}),
    ("apply_rope", lambda: (np.zeros((2, 4)), np.arange(2)), {"attention_factor": 0.0}),
    ("masked_attention", lambda: (np.zeros((1, 3, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))), {}),
    ("masked_attention", lambda: (np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     {"n_sink": 2, "causal": True}),
    ("masked_attention", lambda: (np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     {"key_mask": np.ones((1, 2), dtype=np.int8)}),
    ("masked_attention", lambda: (np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     {"alibi_slopes": np.ones(3)}),
    ("decode_attention", lambda: (np.zeros((1, 2, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4))),
     {"key_lengths": np.array([4])}),
    ("decode_attention", lambda: (np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4))), {}),
    ("softmax", lambda: (np.zeros((2, 3)),), {"axis": True}),
    ("masked_attention", lambda: (np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     {"causal": "no"}),
    ("masked_attention", lambda: (np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     {"causal": 1}),
    ("masked_attention", lambda: (np.zeros((1, 1, 2, 0)), np.zeros((1, 1, 3, 0)), np.zeros((1, 1, 3, 2))), {}),
    ("decode_attention", lambda: (np.zeros((1, 1, 0)), np.zeros((1, 1, 3, 0)), np.zeros((1, 1, 3, 2))), {}),
    ("masked_attention", lambda: (np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     {"softcap": 0}),
    ("masked_attention", lambda: (np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     {"softcap": "50"}),
    ("masked_attention", lambda: (np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     {"softcap": float("inf")}),
    ("decode_attention", lambda: (np.zeros((1, 2, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4))),
     {"softcap": -1.0}),
    ("decode_attention", lambda: (np.zeros((1, 2, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4))),
     {"softcap": True}),
    ("decode_attention", lambda: (np.zeros((1, 2, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4))),
     {"window": 0}),
    ("decode_attention", lambda: (np.zeros((1, 2, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4))),
     {"window": 2.5}),
]
CPU_AND_SIMULATED = [b for b in ("numba", "numba_cuda")]


def _kernel(name, backend):
    spec = registry.get(name, backend)
    _require(spec)
    return spec.load(), spec.load_twin()


@pytest.mark.parametrize("backend", CPU_AND_SIMULATED)
@pytest.mark.parametrize("name, make_args, kwargs", BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_input_raises_the_twins_error(name, make_args, kwargs, backend):
    """The kernel refuses bad input at the boundary with the twin's exception type and message."""
    if not any(s.name == name for s in registry.kernels(backend)):
        pytest.skip(f"{name} has no {backend} kernel in the registry")
    fn, twin = _kernel(name, backend)
    with pytest.raises((ValueError, TypeError)) as expected:
        twin(*make_args(), **kwargs)
    with pytest.raises(expected.type) as got:
        fn(*make_args(), **kwargs)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("backend", CPU_AND_SIMULATED)
@pytest.mark.parametrize("shape, axis", [((3, 0), -1), ((0, 3), -1), ((0, 3), 0), ((2, 0, 4), 1)])
def test_softmax_over_empty_shapes(shape, axis, backend):
    """Empty inputs give empty outputs of the same shape and dtype, as the twin (an empty axis included)."""
    fn, twin = _kernel("softmax", backend)
    x = np.zeros(shape, np.float32)
    out = fn(x, axis=axis)
    assert out.shape == twin(x, axis=axis).shape == shape and out.dtype == np.float32


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "gelu_tanh_bias", "glu_gate", "masked_attention"])
def test_float16_in_float16_out(name):
    """Dtype in = dtype out also for float16 (computed wider inside, as the module headers say)."""
    fn, _ = _numba(name)
    case = make_case(name, np.random.default_rng(1), "float16", VERIFY_DIMS[name]["full"][0])
    assert fn(*case.args, **case.kwargs).dtype == np.float16


@pytest.mark.parametrize("name", sorted({s.name for s in registry.kernels("numba") if s.entry == "kernel"}))
def test_byte_order_and_long_double(name):
    """Big-endian float32 input gives the native input's result bit for bit (converted at the
    boundary); long double is refused with a TypeError naming the dtypes, not a Numba typing error."""
    fn, _ = _numba(name)
    case = make_case(name, np.random.default_rng(2), "float32", VERIFY_DIMS[name]["full"][0])

    def as_dtype(dtype):
        return [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in case.args]

    out = fn(*case.args, **case.kwargs)
    swapped = fn(*as_dtype(">f4"), **case.kwargs)
    assert swapped.dtype == np.float32 and np.array_equal(swapped, out, equal_nan=True)
    if np.dtype(np.longdouble).itemsize > 8:  # (long double is float64 on some platforms)
        with pytest.raises(TypeError, match="float16, float32 or float64 inputs; got .*float128"):
            fn(*as_dtype(np.longdouble), **case.kwargs)


def test_decode_attention_is_the_last_row_of_causal_attention():
    """decode(q_last) == masked_attention(causal)[..., -1, :]: the last query (p = S-1) sees every key j <= S-1."""
    decode, _ = _numba("decode_attention")
    attend, _ = _numba("masked_attention")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 6, 5, 16))
    k = rng.standard_normal((2, 3, 150, 16))
    v = rng.standard_normal((2, 3, 150, 8))
    full = attend(q, k, v, causal=True)[:, :, -1, :]
    np.testing.assert_allclose(decode(q[:, :, -1, :], k, v), full, rtol=1e-12, atol=1e-12)


def test_windowed_decode_attention_is_the_last_row_of_causal_window_attention():
    """decode(q_last, window=w, key_lengths=L) == masked_attention(causal, window=w) over the first L_b keys, at
    its last query (p = L_b - 1), for both CPU kernels, on the parallel split-S driver too (chunks before the
    window skipped), with and without a soft cap."""
    from accel.numba_cpu import attention as fused

    decode, _ = _numba("decode_attention")
    attend, _ = _numba("masked_attention")
    rng = np.random.default_rng(6)
    q = rng.standard_normal((3, 6, 4, 16))
    k = rng.standard_normal((3, 3, 300, 16))
    v = rng.standard_normal((3, 3, 300, 8))
    lengths = np.array([300, 129, 0])
    work = fused.DECODE_PARALLEL_WORK
    for parallel in (False, True):
        fused.DECODE_PARALLEL_WORK = 0 if parallel else 1 << 62
        try:
            for window, cap in ((1, None), (37, None), (64, 50.0), (500, 1.0)):
                out = decode(q[:, :, -1], k, v, key_lengths=lengths, window=window, softcap=cap)
                for b, L in enumerate(lengths):
                    if L == 0:
                        assert (out[b] == 0).all()
                        continue
                    full = attend(q[b:b + 1], k[b:b + 1, :, :L], v[b:b + 1, :, :L], causal=True, window=window,
                                  softcap=cap)[0, :, -1]
                    np.testing.assert_allclose(out[b], full, rtol=1e-12, atol=1e-12)
        finally:
            fused.DECODE_PARALLEL_WORK = work


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("after_nan", [[-np.inf, 1.0, 2.0], [-np.inf], [1.0, -np.inf]])
def test_a_nan_score_makes_its_row_nan_whatever_follows(after_nan):
    """Scores [NaN, then -inf or finite ones]: the twin's softmax row is NaN, so both CPU kernels'
    outputs are NaN (a running max that compares with `<=` alone would lose the NaN)."""
    attend, twin = _numba("masked_attention")
    decode, _ = _numba("decode_attention")
    keys = np.array([np.nan, *after_nan])
    k = np.stack([keys, np.zeros_like(keys)], axis=-1)[None, None]  # [1, 1, S, 2]: scores = keys / sqrt(2)
    v = np.arange(2.0 * keys.size).reshape(1, 1, keys.size, 2)
    q = np.ones((1, 1, 1, 2))
    for dtype in (np.float32, np.float64):
        args = [a.astype(dtype) for a in (q, k, v)]
        assert np.isnan(attend(*args)).all() and np.isnan(decode(args[0][:, :, 0], *args[1:])).all()
        assert check_close(attend(*args), twin(q, k, v), rtol=0, atol=0).passed


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_attention_attending_to_nothing_is_zero_whatever_v_holds():
    """Queries that see no key (causal, T > S) get zero rows from the CPU kernel and the twin although v holds inf
    and NaN at keys other queries of the same tile see. Where a query does see keys, the twin leaves out the terms of
    keys hidden from it, while the kernel's tile product takes 0 * inf = NaN (its module header says so): the two
    are compared on finite v only, and here only on the rows that see nothing, plus the non-finite pattern of the
    twin's rows that see a poisoned key."""
    attend, twin = _numba("masked_attention")
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 3, 4))
    v[:, :, 2] = np.inf  # key 2: seen by the last query only
    v[:, :, 0, 0] = np.nan  # key 0: seen by queries 2, 3, 4
    for dtype in (np.float32, np.float64):
        args = [a.astype(dtype) for a in (q, k, v)]
        ours, ref = attend(*args, causal=True), twin(q, k, v, causal=True)
        assert (ours[:, :, :2] == 0).all() and (ref[:, :, :2] == 0).all()
        assert np.isnan(ref[:, :, 2:, 0]).all() and np.isfinite(ref[:, :, 2:4, 1:]).all()
        assert np.isposinf(ref[:, :, 4, 1:]).all()


def test_skipping_masked_tiles_is_exact():
    """Changing keys/values that a causal mask hides (the future) leaves earlier outputs bit-identical.

    Proof: a hidden key's score is set to -inf whatever k is, so its weight is exp(-inf) = 0 and
    it adds 0 * v = 0 (v finite) to the accumulator, or its whole tile is skipped; the visible
    keys are processed in the same tile order, so the same floating-point operations run.
    """
    attend, _ = _numba("masked_attention")
    rng = np.random.default_rng(4)
    T = S = 150
    q = rng.standard_normal((1, 2, T, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, S, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, S, 8)).astype(np.float32)
    out = attend(q, k, v, causal=True)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, 100:] = rng.standard_normal(k2[:, :, 100:].shape)
    v2[:, :, 100:] = 1e30 * rng.standard_normal(v2[:, :, 100:].shape)
    out2 = attend(q, k2, v2, causal=True)
    assert np.array_equal(out[:, :, :100], out2[:, :, :100])


def test_verify_main_passes_and_fails_honestly(capsys, monkeypatch):
    """verify.main returns 0 on correct kernels and 1 once an entry is wrong (a kernel
    registered against the wrong twin)."""
    from accel import verify

    _require(registry.get("softmax", "numba"))
    monkeypatch.setattr(registry, "KERNELS", [s for s in registry.KERNELS if s.name in ("softmax", "rms_norm")])
    assert verify.main("numba") == 0
    table = capsys.readouterr().out
    assert "softmax" in table and "FAIL" not in table
    # rms_norm(x, gamma) posing as gelu_tanh_bias(x, b): same call shape, different math.
    bad = registry.KernelSpec("gelu_tanh_bias", "numba", "accel.numba_cpu.norms:rms_norm", "refimpl.ffn:gelu_tanh_bias",
                              ("float64",), {"float64": 1e-12}, {"float64": 1e-12},
                              "a deliberately wrong entry for this test")
    monkeypatch.setattr(registry, "KERNELS", [bad])
    assert verify.main("numba") == 1
    assert "FAIL" in capsys.readouterr().out


@settings(max_examples=40, deadline=None)
@given(dims=attention_dims_softcap_BHKTSD(tiny=False), bq=st.sampled_from([1, 2, 3, 7, 16]),
       bk=st.sampled_from([1, 2, 5, 8, 33]), dtype=st.sampled_from(["float32", "float64"]),
       seed=st.integers(0, 2**32 - 1))
def test_fused_attention_equals_its_twin_at_every_tile_size(dims, bq, bk, dtype, seed):
    """The online softmax is tile-size independent: with tiles of 1 x 1 .. 16 x 33 (so a row spans many
    key tiles, the running max moves, and the sink / window / padding / causal cuts fall inside and
    between tiles) the numba kernel still equals the float64 twin within the registry tolerance.

    Proof: after any sequence of tiles, (m, l, a) = (max_j s_j, sum_j e^{s_j - m}, sum_j e^{s_j - m} v_j)
    over the keys seen so far (induction: a new tile with max m' rescales l and a by e^{m - m'});
    a / l is then the softmax average whatever the split, and only the rounding order changes.
    """
    from accel.numba_cpu import attention as fused

    spec = registry.get("masked_attention", "numba")
    _require(spec)
    tiles = fused.BQ, fused.BK, fused.BQ_SHORT, fused.BK_SHORT, fused.BQ_HUGE, fused.BK_HUGE
    fused.BQ, fused.BK, fused.BQ_SHORT, fused.BK_SHORT, fused.BQ_HUGE, fused.BK_HUGE = bq, bk, bq, bk, bq, bk
    try:
        res = run_case(spec, dtype, make_case("masked_attention", np.random.default_rng(seed), dtype, dims)).result
    finally:
        fused.BQ, fused.BK, fused.BQ_SHORT, fused.BK_SHORT, fused.BQ_HUGE, fused.BK_HUGE = tiles
    _record(f"masked_attention[numba] tiles {dtype}", res)
    assert res.passed, f"BQ={bq} BK={bk}: {res}"


def test_fused_attention_picks_its_tiles_by_problem_size():
    """64 x 128 below T * S = 2^20, 128 x 512 from there, 256 x 1024 from 2^26 (attention.py's header)."""
    from accel.numba_cpu import attention as fused

    assert fused._tiles(128, 128) == (fused.BQ_SHORT, fused.BK_SHORT) == (64, 128)
    assert fused._tiles(1024, 1024) == (fused.BQ, fused.BK) == (128, 512)
    assert fused._tiles(4096, 4096) == (128, 512)
    assert fused._tiles(8192, 8192) == (fused.BQ_HUGE, fused.BK_HUGE) == (256, 1024)
    assert fused._tiles(1, 1 << 26) == (256, 1024)


def _exp_row_ulps(row_fn, lo: float, to_ref) -> tuple[float, np.ndarray, np.ndarray]:
    """A float32 exp row function as the kernels compile it, t -> f(t) in place over [lo, 0]:
    (max error in float32 ulps, its outputs for the edge inputs in a 64-entry row (vector path),
    and in a 4-entry row (scalar path)). Edges: NaN, -inf, lo - 1 (below the range), -0.0."""
    rng = np.random.default_rng(7)
    t = np.concatenate([np.linspace(lo, 0, 2_000_001, dtype=np.float32),
                        (lo * rng.random(500_000)).astype(np.float32),
                        -rng.random(500_000).astype(np.float32)])  # dense near 0, where results are largest
    y = t.copy()
    row_fn(y)
    ref = to_ref(t.astype(np.float64))
    ulps = np.abs(y - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)
    edges = np.array([np.nan, -np.inf, lo - 1, -0.0], dtype=np.float32)
    long_row = np.concatenate([edges, np.full(60, -1, dtype=np.float32)])
    short_row = edges.copy()
    row_fn(long_row)
    row_fn(short_row)
    return float(ulps.max()), long_row[:4], short_row


def test_float32_exp_polynomials_meet_their_stated_error():
    """attention.py's float32 exp rows as the kernels compile them (polynomials inlined with FMAs):
    e^t (_exp_row, <= 1.02 ulp) and 2^t (_exp2_row, <= 0.81 ulp) for t <= 0, and their edges.

    Claims from the module: those bounds over the normal range (checked there exhaustively once:
    1.016 and 0.807 ulp; here on 3M points); 0 below it (-87.34 / -126, where the exact result
    is under 2^-126 = 1.2e-38), 0 for -inf, NaN for NaN, exactly 1 at -0, in the vectorised loop
    and in its scalar remainder.
    """
    _numba("masked_attention")
    from accel.numba_cpu import attention as fused

    zero = np.float32(0)
    e_ulps, e_long, e_short = _exp_row_ulps(lambda x: fused._exp_row(x, zero, True), float(fused._EXP_MIN), np.exp)
    two_ulps, two_long, two_short = _exp_row_ulps(lambda x: fused._exp2_row(x, zero), float(fused._EXP2_MIN), np.exp2)
    print(f"\n_exp_f32 rows: max {e_ulps:.3f} ulp on [-87.34, 0]; _exp2_f32 rows: max {two_ulps:.3f} ulp on [-126, 0]")
    assert e_ulps <= 1.02 and two_ulps <= 0.81
    for edges in (e_long, e_short, two_long, two_short):
        assert np.isnan(edges[0]) and edges[1] == 0 and edges[2] == 0 and edges[3] == 1


def test_float64_exp_polynomial_meets_its_stated_error():
    """ffn's float64 exps: _exp_f64 (degree 13, softmax's float64 rows) < 1e-15 and _exp_f64_f32 (degree 10,
    float32 GELU and softmax rows) < 5e-13 relative on [-708, 708] (Taylor after Cody-Waite reduction; the
    bounds are proved in ffn.py, plus float64 rounding); inf above 708, 0 below -708, NaN for NaN,
    exactly 1 at 0; against math.exp on a sample and the reduction's edges, np.exp on 2M points."""
    import math

    from numba import njit

    _numba("gelu_tanh_bias")
    from accel.numba_cpu import ffn

    @njit
    def exps_of(t, short):  # [n] float64 -> [n]: _exp_f64_f32 if short else _exp_f64
        out = np.empty_like(t)
        for i in range(t.shape[0]):
            out[i] = ffn._exp_f64_f32(t[i]) if short else ffn._exp_f64(t[i])
        return out

    rng = np.random.default_rng(0)
    half_ln2 = np.log(2) / 2
    k = np.arange(-1021, 1022)
    edges = np.concatenate([k * np.log(2) + d for d in (-half_ln2, half_ln2, 0.0)])  # |r| at its largest
    t = np.concatenate([rng.uniform(-708, 708, 2_000_000), rng.uniform(-2, 2, 100_000), edges[np.abs(edges) <= 708]])
    sample = np.concatenate([t[::50], edges[np.abs(edges) <= 708]])
    want = np.array([math.exp(x) for x in sample])
    for name, short, bound in (("_exp_f64", False, 1e-15), ("_exp_f64_f32", True, 5e-13)):
        def exps(x, short=short):
            return exps_of(x, short)
        rel = float(np.max(np.abs(exps(sample) - want) / want))
        rel_all = float(np.max(np.abs(exps(t) - np.exp(t)) / np.exp(t)))  # NumPy's exp (<= 1 ulp), every point
        print(f"{name}: max relative error {rel:.2e} vs math.exp ({len(sample)} points), {rel_all:.2e} vs np.exp "
              f"({len(t)} points)")
        assert rel < bound and rel_all < bound + 2.3e-16
        special = exps(np.array([709.0, 1e300, np.inf, -709.0, -np.inf, np.nan, 0.0, -0.0]))
        assert np.isposinf(special[:3]).all() and (special[3:5] == 0).all() and np.isnan(special[5])
        assert special[6] == 1 and special[7] == 1


def test_base2_scores_never_overflow_where_the_twin_is_finite():
    """float32 attention keeps its scores in base 2 only where folding log2 e cannot overflow.

    Proof (attention._base2_cannot_overflow): with |scale| log2 e <= 1 each folded q entry is no
    larger than q's own, so no partial sum of q' . k exceeds the unfolded one; the slopes stay in
    float64. Cases that overflowed when both were folded in float32: a slope
    of 3e38, and q = 3e38 with scale = 1 (which runs in base e).
    """
    attend, twin = _numba("masked_attention")
    v = np.array([1, 2], dtype=np.float32).reshape(1, 1, 2, 1)
    q0, k0 = np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 2, 1), np.float32)
    big_q = np.full((1, 1, 1, 1), 3e38, np.float32)
    tiny_k = np.array([1e-10, 2e-10], np.float32).reshape(1, 1, 2, 1)
    for q, k, kwargs in [(q0, k0, dict(causal=True, alibi_slopes=np.array([3e38], np.float32))),
                         (big_q, tiny_k, dict(scale=1.0))]:
        out = attend(q, k, v, **kwargs)
        ref = twin(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), **kwargs)
        assert np.isfinite(out).all() and np.allclose(out, ref), (out, ref)


def _numba_targets_avx512_host() -> bool:
    """Numba compiles for this machine's CPU (no NUMBA_CPU_NAME / NUMBA_CPU_FEATURES) and it has AVX-512."""
    import llvmlite.binding as llvm
    from numba.core import config

    return (config.CPU_NAME is None and config.CPU_FEATURES is None
            and "+avx512f" in llvm.get_host_cpu_features().flatten().split(","))


def test_wide_vectors_reaches_the_compiled_code():
    """accel.numba_cpu._simd.wide_vectors puts "prefer-vector-width"="512" on the calling function,
    each row function the kernels rely on for speed carries it, and on an AVX-512 target a loop is
    then vectorised with 512-bit (zmm) registers (and without the call, not on Intel, where LLVM prefers 256-bit
    vectors; on AMD Zen 4 / 5 its default is already 512-bit, so there the plain loop uses zmm too)."""
    _numba("softmax")
    from numba import njit

    import importlib

    from accel.numba_cpu import attention, ffn, norms
    from accel.numba_cpu._simd import PREFER_512, wide_vectors

    softmax = importlib.import_module("accel.numba_cpu.softmax")  # (the package exports the function under that name)

    def scale_row(x, a):
        for j in range(x.shape[0]):
            x[j] *= a

    def scale_row_wide(x, a):
        wide_vectors()
        for j in range(x.shape[0]):
            x[j] *= a

    plain, wide = njit(cache=False)(scale_row), njit(cache=False)(scale_row_wide)
    x = np.arange(37, dtype=np.float32)
    wide(x, np.float32(2))
    plain(x, np.float32(0.5))
    assert np.array_equal(x, np.arange(37, dtype=np.float32))
    assert PREFER_512 in wide.inspect_llvm(wide.signatures[0])
    assert PREFER_512 not in plain.inspect_llvm(plain.signatures[0])
    if _numba_targets_avx512_host():
        import llvmlite.binding as llvm

        assert "zmm" in wide.inspect_asm(wide.signatures[0])
        zen = llvm.get_host_cpu_name().startswith("znver")  # (LLVM's tuning for Zen 4 / 5 prefers 512-bit vectors)
        assert ("zmm" in plain.inspect_asm(plain.signatures[0])) == zen, llvm.get_host_cpu_name()

    f32, f64 = np.ones(40, np.float32), np.ones(40)
    calls = [(attention._row_max, (f32,)), (attention._row_sum, (f32,)),
             (attention._exp_row, (f32.copy(), np.float32(1), True)),
             (attention._exp2_row, (f32.copy(), np.float32(1))),
             (attention._cap_row, (f32.copy(), 2.0, True)), (norms._sum64, (f32,)), (norms._sum_sq64, (f32, 0.0)),
             (norms._layer_norm_row, (f32, f64, f64, 1e-5, f32.copy())),
             (norms._rms_norm_row, (f32, f64, 1e-5, f32.copy())),
             (softmax._softmax_row, (f32, f32.copy())), (ffn._gelu_row_f32, (f32, f32, f32.copy())),
             (ffn._gelu_row, (f64, f64, f64.copy()))]
    for fn, args in calls:  # recompiled uncached from their Python source (cached code cannot be inspected)
        fresh = njit(cache=False)(fn.py_func)
        fresh(*args)
        assert PREFER_512 in fresh.inspect_llvm(fresh.signatures[0]), fn.py_func.__name__


@settings(max_examples=30, deadline=None)
@given(dims=decode_dims_window_softcap_BHKSD(tiny=False), parallel=st.booleans(), cache_len=st.integers(0, 7),
       dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2**32 - 1))
def test_decode_attention_reads_cache_views_in_place(dims, parallel, cache_len, dtype, seed):
    """decode_attention on k, v that are the filled prefix of a larger KV cache (strided [B, K, S, D]
    views, read in place by BLAS) equals the float64 twin within the registry tolerance, on the serial
    driver and on the parallel one (chunks of S merged by rescaling), with K < H groups.

    Proof: the kernel reads k[b, g, j, :] and v[b, g, j, :] only for j < L_b <= S through each view's
    own strides (BLAS's leading dimension), so the entries past S in the cache never enter; the chunk
    merge is the online-softmax identity (see test_fused_attention_equals_its_twin_at_every_tile_size).
    """
    from accel.numba_cpu import attention as fused

    spec = registry.get("decode_attention", "numba")
    _require(spec)
    case = make_case("decode_attention", np.random.default_rng(seed), dtype, dims)
    q, k, v = case.args
    B, K, S, D = k.shape
    big_k = np.full((B, K, S + cache_len, D), np.nan, dtype=k.dtype)  # unfilled cache slots hold NaN
    big_v = np.full((B, K, S + cache_len, v.shape[3]), np.nan, dtype=v.dtype)
    big_k[:, :, :S], big_v[:, :, :S] = k, v
    k_view, v_view = big_k[:, :, :S], big_v[:, :, :S]
    assert fused._blas_rows(k_view, k.dtype) is k_view  # read in place, not copied
    work = fused.DECODE_PARALLEL_WORK
    fused.DECODE_PARALLEL_WORK = 0 if parallel else 1 << 62
    try:
        out = spec.load()(q, k_view, v_view, **case.kwargs)
    finally:
        fused.DECODE_PARALLEL_WORK = work
    ref = spec.load_twin()(*[a.astype(np.float64) for a in case.args], **case.kwargs)
    rtol, atol = spec.tolerance(dtype)
    res = check_close(out, ref, rtol=rtol, atol=atol)
    _record(f"decode_attention[numba] cache views {dtype}", res)
    assert res.passed, f"{case.shapes} parallel={parallel}: {res}"


def test_decode_attention_copies_only_what_blas_cannot_read():
    """Views BLAS cannot address row by row (reversed keys, strided or transposed rows, another dtype)
    are copied first, and give the same result as their contiguous copies."""
    from accel.numba_cpu import attention as fused
    from accel.numba_cpu.attention import decode_attention

    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 6))
    k = rng.standard_normal((1, 2, 9, 6))
    v = rng.standard_normal((1, 2, 9, 3))
    reversed_keys, strided_rows = k[:, :, ::-1], np.repeat(k, 2, axis=3)[..., ::2]
    transposed = np.ascontiguousarray(k.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    for view in (reversed_keys, strided_rows, transposed):
        assert fused._blas_rows(view, np.dtype(np.float64)) is not view
        np.testing.assert_array_equal(decode_attention(q, view, v), decode_attention(q, np.ascontiguousarray(view), v))
    assert fused._blas_rows(k, np.dtype(np.float32)).dtype == np.float32


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 12), half=st.integers(1, 8), extra=st.integers(0, 3), interleaved=st.booleans(),
       max_pos=st.sampled_from([10, 1000, 10000]), scaled=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_apply_rope_float64_is_the_twin_bit_for_bit(T, half, extra, interleaved, max_pos, scaled, seed):
    """In float64 the numba RoPE uses the twin's own angle tables, so the outputs are identical (the
    registry note's claim); rotary_dim < D leaves the tail untouched in both. The same with given
    frequencies and an attention factor (a cos, a sin formed in float64 as in the twin)."""
    fn, twin = _numba("apply_rope")
    rng = np.random.default_rng(seed)
    D = 2 * half + 2 * extra
    x = rng.standard_normal((2, 3, T, D))
    pos = rng.integers(0, max_pos, size=(2, 1, T))
    kw = dict(interleaved=interleaved, rotary_dim=2 * half)
    if scaled:
        kw.update(frequencies=rng.random(half) ** 3, attention_factor=float(0.5 + rng.random()))
    np.testing.assert_array_equal(fn(x, pos, **kw), twin(x, pos, **kw))


@pytest.mark.parametrize("backend", CPU_AND_SIMULATED)
@pytest.mark.parametrize("B, T, S", [(1, 0, 3), (0, 2, 3), (1, 2, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_masked_attention_with_no_query_key_or_batch(B, T, S, causal, backend):
    """T = 0 or B = 0: an empty result; S = 0: every row sees no key, so zeros (the twin's convention)."""
    fn, twin = _kernel("masked_attention", backend)
    q, k, v = np.ones((B, 2, T, 4)), np.ones((B, 1, S, 4)), np.ones((B, 1, S, 3))
    ref = twin(q, k, v, causal=causal, alibi_slopes=np.ones(2))
    out = fn(q, k, v, causal=causal, alibi_slopes=np.ones(2))
    assert ref.shape == out.shape == (B, 2, T, 3) and not ref.any() and not out.any()
