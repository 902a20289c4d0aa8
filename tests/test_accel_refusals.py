"""The numba backend's operations never fall back to refimpl silently: a refusal is counted, shown, and is refimpl's.

An operation of accel.numba_cpu's Ops (LLaMA's rms_norm, linear, rope, glu_hidden, lm_head; GPT-2's
linear, matmul, lm_head) runs refimpl's operation only on what its kernels do not read (float16, a
weight of another dtype than x: NumPy's promotion is refimpl's), and then counts "op: reason" in the
backend's one Counter (OPS.declined, where decode_blocks counts its own). Here, for each operation:
the refused input gives refimpl's result bit for bit with its reason counted once (accel.verify's
REFUSALS rows, which `python -m refimpl verify` prints), and a refusal that is not counted fails that
row. Inputs that are not refusals (another byte order, strided arrays, empty ones) run on the kernels,
count nothing, and equal the kernels' result on native contiguous copies bit for bit. The CLI's
generate --timing prints the counts; the GPU backend refuses weights it has no kernels for at prepare.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("numba", reason="the numba backend needs numba (pip install -e .[numba])")

from accel import registry, verify  # noqa: E402
from accel.numba_cpu import gpt2 as ng  # noqa: E402
from accel.numba_cpu import llama as nl  # noqa: E402
from accel.steps import tiny_model  # noqa: E402
from refimpl.ffn import GLUParams  # noqa: E402
from refimpl.linear import LinearParams  # noqa: E402

REFUSALS = verify.REFUSALS["numba"]


def test_the_backend_has_one_counter_for_its_steps_and_its_operations():
    assert nl.OPS.declined is ng.OPS.declined is ng.DECLINED


@pytest.mark.parametrize("refusal", REFUSALS, ids=[f"{r.family}.{r.op}" for r in REFUSALS])
def test_a_refused_input_is_counted_and_gets_refimpls_result(refusal):
    before = ng.DECLINED.copy()
    row = verify.run_refusal("numba", refusal)
    assert row.refused, row.reason
    assert (ng.DECLINED - before)[refusal.key] == 1
    print(f"{row.kernel}: {row.reason}")


def test_a_silent_fallback_fails_its_row(monkeypatch):
    """With the counting switched off, every refused input runs refimpl's uncounted: verify marks each row FAIL."""
    for module in (ng, nl):
        monkeypatch.setattr(module, "refused", lambda op, reason: None)
    rows = [verify.run_refusal("numba", r, 0, n) for n, r in enumerate(REFUSALS)]
    assert not any(r.refused or r.passed for r in rows)
    assert all("a silent fallback" in r.reason for r in rows)


def test_verify_shows_each_refusal(monkeypatch):
    monkeypatch.setattr(registry, "KERNELS", [])
    rows = verify.run("numba")
    assert len(rows) == len(REFUSALS) and all(r.refused for r in rows)
    table = verify.format_table(rows)
    assert f"0 passed, 0 failed, {len(REFUSALS)} refused" in table
    assert "rms_norm: x float16 (the kernels read float32 / float64)" in table


# ----------------------------------------------------------------------------- inputs the kernels take

def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _big(a):  # the same values in the other byte order
    return a.astype(a.dtype.newbyteorder(">" if a.dtype.byteorder in "=<" else "<"))


def _strided(a):  # the same values in an array with a gap after every entry of its last axis
    out = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), dtype=a.dtype)[..., ::2]
    out[...] = a
    return out


def _cases():  # name -> (op, args builder from (rng, transform)), transform: a function of each float array
    rng = np.random.default_rng(0)
    llama, lcfg = tiny_model("llama", np.float32, 1)
    gpt2, _ = tiny_model("gpt2", np.float32, 2)
    x, w, W, b = _f32(rng, 2, 3, 8), _f32(rng, 8), _f32(rng, 8, 5), _f32(rng, 5)
    q, cos, sin = _f32(rng, 2, 3, 4, 8), _f32(rng, 1, 1, 4, 4), _f32(rng, 1, 1, 4, 4)
    glu = [_f32(rng, 8, 12), _f32(rng, 8, 12), _f32(rng, 12, 8)]
    h, hg = _f32(rng, 2, 1, lcfg.hidden_size), _f32(rng, 2, 1, gpt2.wte.shape[1])
    return {
        "llama.rms_norm": (nl._norm, lambda t: (t(x), t(w), 1e-6)),
        "llama.linear": (nl._linear_op, lambda t: (t(x), LinearParams(t(W), t(b)))),
        "llama.rope": (nl._rope, lambda t: (t(q), t(cos), t(sin))),
        "llama.glu_hidden": (nl._glu_hidden, lambda t: (t(x), GLUParams(*(LinearParams(t(m)) for m in glu)), "silu")),
        "llama.lm_head": (nl._lm_head, lambda t: (t(h), llama, lcfg)),
        "gpt2.linear": (ng._linear, lambda t: (t(x), LinearParams(t(W), t(b)))),
        "gpt2.matmul": (ng._matmul, lambda t: (t(x), t(W))),
        "gpt2.lm_head": (ng._lm_head, lambda t: (t(hg), gpt2)),
    }


CASES = _cases()
TRANSFORMS = {"big-endian": _big, "strided": _strided}


def _no_refimpl(monkeypatch):
    """Every refimpl fallback of the operations raises: what follows runs on the kernels or fails."""
    def fail(*a, **k):
        raise AssertionError("refimpl's operation ran")

    for module, names in ((nl, ("_rms_norm", "_rope_rotate", "_linear", "lm_head")), (ng, ("linear", "lm_head"))):
        for name in names:
            monkeypatch.setattr(module, name, fail)
    monkeypatch.setattr(nl, "_ACTIVATIONS", {})


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("name", CASES)
def test_other_byte_orders_and_strides_run_on_the_kernels(name, transform, monkeypatch):
    op, args = CASES[name]
    want = op(*args(lambda a: a))
    _no_refimpl(monkeypatch)
    before = ng.DECLINED.copy()
    got = op(*args(TRANSFORMS[transform]))
    assert ng.DECLINED == before
    assert got.dtype == want.dtype and got.dtype.isnative and np.array_equal(got, want)


@pytest.mark.parametrize("name", CASES)
def test_empty_inputs_run_on_the_kernels(name, monkeypatch):
    """No rows (x [0, ..., C]): an empty result of the shape and dtype refimpl's has, nothing counted."""
    op, args = CASES[name]
    want = op(*args(lambda a: a))
    _no_refimpl(monkeypatch)
    before = ng.DECLINED.copy()
    first = [True]

    def empty_first(a):  # the first argument (x, h) with no rows; the weights as they are
        if first[0]:
            first[0] = False
            return a[:0]
        return a

    got = op(*args(empty_first))
    assert ng.DECLINED == before
    assert got.shape == (0, *want.shape[1:]) and got.dtype == want.dtype


def test_a_strided_weight_is_copied_not_refused():
    """W neither C- nor F-contiguous: the product runs on a contiguous copy, so it equals the product on that copy."""
    rng = np.random.default_rng(3)
    x, W = _f32(rng, 3, 8), _f32(rng, 8, 10)[:, ::2]
    before = ng.DECLINED.copy()
    got = nl._linear_op(x, LinearParams(W))
    assert ng.DECLINED == before
    assert np.array_equal(got, nl._linear_op(x, LinearParams(np.ascontiguousarray(W))))


# ----------------------------------------------------------------------------- where a user sees them

def test_generate_timing_prints_what_the_backend_declined(capsys):
    from refimpl.__main__ import main

    assert main(["generate", "--backend", "numba", "--timing", "--max-new-tokens", "2", "--prompt", "ROMEO:"]) == 0
    out = capsys.readouterr().out
    assert "  declined (refimpl's ran there): more than one new token per sequence x1" in out, out  # the prefill


def test_declined_line_counts_the_run_only():
    from collections import Counter

    from refimpl.__main__ import _declined_line

    counter = Counter({"a key mask": 2})
    before = counter.copy()
    nothing = "  declined: nothing (the backend ran every fused step and operation itself)"
    assert _declined_line(counter, before) == nothing
    counter.update({"rms_norm: x float16 (the kernels read float32 / float64)": 3, "a key mask": 1})
    assert _declined_line(counter, before) == ("  declined (refimpl's ran there): rms_norm: x float16 (the kernels "
                                               "read float32 / float64) x3; a key mask x1")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_gpu_backend_refuses_float16_weights_at_prepare(family):
    """No host fallback on the device: float16 weights are a TypeError naming the dtype, before anything is copied."""
    if family == "llama":
        from accel.cupy.llama import make_ops
    else:
        from accel.cupy.gpt2 import make_ops
    ops = make_ops("cuda-test", np, SimpleNamespace(rms_norm=None, layer_norm=None, matmul=None, gelu_tanh_bias=None,
                                                    to_numpy=np.asarray))
    params, _ = tiny_model(family, np.float16, 0)
    with pytest.raises(TypeError, match="runs float32 / float64 weights .*; got float16"):
        ops.prepare(params)


def test_weights_kept_quantized_count_an_x_their_kernels_do_not_read():
    """A float64 x on a QuantizedLinear runs refimpl's definition (decode, then x W^T), counted as linear's refusal;
    a float32 x runs the kernels and counts nothing."""
    from refimpl.quant import quantize
    from refimpl.quant.weights import QuantizedLinear, QuantizedTensor, quantized_linear

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    p = QuantizedLinear(QuantizedTensor("Q8_0", w.shape, quantize(w, "Q8_0")))
    x = rng.standard_normal((2, 64))
    before = ng.DECLINED.copy()
    y = nl._linear_op(x, p)
    assert (ng.DECLINED - before) == {"linear: x float64 on weights kept quantized (their kernels read float32 x)": 1}
    np.testing.assert_array_equal(y, quantized_linear(x, p))
    before = ng.DECLINED.copy()
    nl._linear_op(x.astype(np.float32), p)
    assert not (ng.DECLINED - before)
