"""The fused decoding steps equal refimpl's step: each backend's whole-step path against the blocks one at a time.

Every `*_decode_step` entry of accel.registry (accel.steps): Hypothesis draws a tiny random model
of a family (LLaMA with biases and llama3 RoPE, Qwen2's q/k/v biases, Gemma-2's (1 + w) and sandwich
norms with a window and a soft cap, Gemma 3's q/k norms and two RoPEs; GPT-2), a batch, new tokens
(several per row, or one per row of a left-padded batch, where the backend's step takes them) and
a random cache of some length, NaN past it (entries never to be read); the step's residual stream
after the last block must equal the float64 twin's within the registry's tolerance (its derivation:
registry.NOTES). A case the step
declines raises accel.steps.Declined, and here that fails the test: the cases drawn are the ones
the backend's step covers, so a step that silently stopped covering them would show. `verify`
reports the ones it declines (counted refusals). Numba-CUDA entries run under the simulator on
tiny sizes; CuPy ones are skipped without a GPU.

The numba LlamaOps' rope and linear are registered entries too (the generic differential suite checks
them against their twins); here they are also shown to run their kernels on the cases drawn, not the
refimpl function they hand other inputs to.

Run with -s to read the max errors seen.
"""

from __future__ import annotations

import cuda_simulator  # noqa: F401  (before numba.cuda: the simulator where there is no GPU)

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel import registry, verify
from accel._common import check_close
from accel.steps import Declined
from report import MaxDiffs

AVAILABLE = registry.available_backends()
TABLE = MaxDiffs("fused decoding steps vs refimpl's step in float64: max errors seen")
STEPS = [pytest.param(spec, dtype, id=f"{spec.id}-{dtype}") for spec in registry.KERNELS if spec.fused_step
         for dtype in spec.dtypes]
EXAMPLES = {"full": 4, "tiny": 2}
LLAMA_FAMILIES = ("llama", "qwen2", "gemma2", "gemma3_text")


def _require(spec):
    if AVAILABLE[spec.backend]:
        pytest.skip(f"{spec.backend} unavailable here: {AVAILABLE[spec.backend]}")


@st.composite
def covered_dims(draw, spec, dtype: str) -> dict:
    """A case the backend's step takes. Every step: one new token per row, no padding. The numba LLaMA-family
    step also takes, in float32 with one RoPE table (not Gemma 3), up to 8 rows of new tokens (B T <= 8) and one
    token per row of a left-padded batch; the cuda steps read one RoPE table (no Gemma 3)."""
    tiny = spec.sizes == "tiny"
    if spec.name == "gpt2_decode_step":
        family = "gpt2"
    else:
        family = draw(st.sampled_from(LLAMA_FAMILIES if spec.backend == "numba" else LLAMA_FAMILIES[:3]))
    B = draw(st.integers(1, 2 if tiny else 3))
    T, padding = 1, False
    if spec.backend == "numba" and family in LLAMA_FAMILIES[:3] and dtype == "float32":
        padding = draw(st.booleans())
        T = 1 if padding else draw(st.integers(1, 8 // B))
    length = draw(st.integers(1 if padding else 0, 3 if tiny else 6))
    return dict(family=family, B=B, T=T, length=length, S_max=length + T + draw(st.integers(0, 2)), padding=padding)


@pytest.mark.parametrize("spec, dtype", STEPS)
def test_fused_step_equals_refimpls_step(spec, dtype):
    """x_L of the fused step == refimpl's blocks over the same cache (float64), within the registry tolerance."""
    _require(spec)

    @settings(max_examples=EXAMPLES[spec.sizes], deadline=None)
    @given(data=st.data(), seed=st.integers(0, 2**32 - 1))
    def check(data, seed):
        dims = data.draw(covered_dims(spec, dtype))
        case = verify.make_case(spec.name, np.random.default_rng(seed), dtype, dims)
        TABLE.check(verify.run_case(spec, dtype, case))  # (non-finite values must match the twin's exactly, and
        assert np.isfinite(spec.load_twin()(*case.args)).all()  # the twin reads no NaN past the filled entries)

    check()


def test_verify_counts_and_shows_the_cases_a_step_declines(monkeypatch):
    """`verify` on the numba steps: every case passes except the float64 ones the numba LLaMA step declines (several
    new tokens, a left-padded batch: its float32-only path), which are rows marked refused, counted, not failures."""
    monkeypatch.setattr(registry, "KERNELS", [s for s in registry.KERNELS if s.fused_step and s.backend == "numba"])
    monkeypatch.setattr(verify, "REFUSALS", {})  # (the operations' refusals: tests/test_accel_refusals.py)
    rows = verify.run("numba")
    refused = {(r.kernel, r.dtype, r.shapes) for r in rows if r.refused}
    assert refused == {("llama_decode_step", "float64", "llama B=2 T=3 cached=2"),
                       ("llama_decode_step", "float64", "qwen2 B=3 T=1 cached=4 left-padded")}
    assert all(r.passed for r in rows if not r.refused) and len(rows) == 16
    for r in rows:
        if r.passed:
            TABLE.add(f"{r.kernel}[{r.backend}] {r.dtype} (verify)", max_abs=r.max_abs, max_rel=r.max_rel,
                      worst=r.worst)
    table = verify.format_table(rows)
    assert "14 passed, 0 failed, 2 refused" in table and "refused: the numba backend's decode_blocks declined" in table


def test_a_step_that_declines_raises_declined():
    """A case the numba GPT-2 step does not cover (two new tokens per row) raises Declined, naming the backend."""
    spec = registry.get("gpt2_decode_step", "numba")
    _require(spec)
    case = verify.make_case(spec.name, np.random.default_rng(0), "float32",
                            dict(family="gpt2", B=1, T=2, length=1, S_max=4))
    with pytest.raises(Declined, match="numba backend's decode_blocks declined"):
        spec.load()(*case.args)


@pytest.mark.parametrize("name", ["llama_decode_step", "gpt2_decode_step"])
def test_the_tolerance_catches_a_cache_read_one_entry_short(name):
    """The step's tolerance is tight enough to fail a step that reads one cache entry fewer than it should."""
    spec = registry.get(name, "numba")
    _require(spec)
    family = "llama" if name == "llama_decode_step" else "gpt2"
    case = verify.make_case(name, np.random.default_rng(3), "float32", dict(family=family, B=2, T=1, length=4, S_max=6))
    params, config, ids, k, v, length = case.args
    out = spec.load()(*case.args)
    short = spec.load_twin()(params, config, ids, k.astype(np.float64), v.astype(np.float64), length - 1)
    rtol, atol = spec.tolerance("float32")
    res = check_close(out, short, rtol=rtol, atol=atol)
    print(f"{name}[numba] vs the twin reading one entry fewer: max abs diff {res.max_abs:.2e} "
          f"({res.worst:.0f}x the tolerance)")
    assert not res.passed and res.worst > 100


@pytest.mark.parametrize("name, fallback", [("rope_rotate", "_rope_rotate"), ("linear", "_linear"),
                                            ("lm_head", "lm_head")])
def test_numba_llama_ops_take_their_kernels_on_the_cases_drawn(monkeypatch, name, fallback):
    """rope_rotate, linear and lm_head[numba] (the numba LlamaOps.rope, .linear, .lm_head) run their kernels, not
    refimpl's function they hand other inputs to, on every case the suite draws for them (rope: x [B, n, T, D],
    tables [B|1, 1, T, R/2]; linear: C- or F-contiguous W of x's dtype; lm_head: E of h's dtype): with refimpl's
    function removed they still pass."""
    from hypothesis import HealthCheck

    import accel.numba_cpu.llama as numba_llama
    from strategies import KERNEL_DIMS

    spec = registry.get(name, "numba")
    _require(spec)

    def refused(*args, **kwargs):
        raise AssertionError(f"the numba {name} handed its inputs to refimpl's {fallback}")

    monkeypatch.setattr(numba_llama, fallback, refused)
    for n, dims in enumerate(verify.VERIFY_DIMS[name]["full"]):
        for dtype in spec.dtypes:
            assert verify.run_case(spec, dtype, verify.make_case(name, np.random.default_rng(n), dtype, dims)).passed

    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(dims=KERNEL_DIMS[name](tiny=False), dtype=st.sampled_from(spec.dtypes), seed=st.integers(0, 2**32 - 1))
    def check(dims, dtype, seed):
        assert verify.run_case(spec, dtype, verify.make_case(name, np.random.default_rng(seed), dtype, dims)).passed

    check()
