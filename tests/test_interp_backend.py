"""The interp tools on `--backend numba`: the hooked forward with accel.numba_cpu's operations equals it on NumPy.

run_with_cache / capture (and every tool built on them: patching, Patchscopes, steering, neurons, the lens, sinks)
run the model's own forward with the backend's Ops (refimpl.interp.capture.backend_ops). In exact arithmetic the
activations are the same; in floating point they differ by the products' rounding, bounded as for the logits in
tests/test_accel_llama_numba.py (logit_tolerance: (4 L + 1) 2 gamma_n plus L times the attention kernel's registry
tolerance, relative to the largest value; every activation lies on a shorter path, so the same bound holds for
it). The attention weights a hook reads are NumPy's on both backends (the models' _with_weights), computed from
q and k that differ by that much. Model: the shipped toy shakespeare-llama (4 blocks; its numba kernels are the
ones tests/test_accel_llama_numba.py compiles, cached on disk by Numba).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("numba", reason="the numba backend needs numba (pip install -e .[numba])")

import refimpl  # noqa: E402
from refimpl.interp import run_with_cache  # noqa: E402
from refimpl.interp.cli import main  # noqa: E402
from refimpl.interp.patching import logit_diff_metric, patch_sweep  # noqa: E402
from refimpl.interp.patchscope import patchscope_grid  # noqa: E402
from refimpl.interp.steering import steered_generate, steering_vector  # noqa: E402
from report import MaxDiffs  # noqa: E402
from test_accel_llama_numba import logit_tolerance, rel  # noqa: E402

DIFFS = MaxDiffs("interp on the numba backend vs numpy: max rel diff = max|numba - numpy| / max|numpy|")
TEXT = "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar"


@pytest.fixture(scope="module")
def toy():
    return refimpl.load("shakespeare-llama")


@pytest.fixture(scope="module")
def ids(toy):
    from refimpl._tokens import encode_prompt

    return np.asarray(encode_prompt(toy.tokenizer, TEXT), dtype=np.int64)


def test_every_hook_point_and_the_logits_agree_on_numba(toy, ids):
    tol = logit_tolerance(toy.config, toy.params.dtype)
    z0, a0 = run_with_cache(toy, ids)
    z1, a1 = run_with_cache(toy, ids, backend="numba")
    assert z1.dtype == z0.dtype and set(a1) == set(a0)
    worst = max(a0, key=lambda n: rel(a1[n], a0[n]))
    DIFFS.show("run_with_cache, logits", max_rel=rel(z1, z0), tol=tol)
    DIFFS.show(f"run_with_cache, worst of {len(a0)} hook points ({worst})", max_rel=rel(a1[worst], a0[worst]), tol=tol)
    assert rel(z1, z0) <= tol and rel(a1[worst], a0[worst]) <= tol
    assert all(a1[n].dtype == a0[n].dtype and a1[n].shape == a0[n].shape for n in a0)


def test_patching_patchscope_and_steering_agree_on_numba(toy, ids):
    tol = logit_tolerance(toy.config, toy.params.dtype)
    tok = toy.tokenizer
    src, tgt = (np.asarray(tok.encode(t), dtype=np.int64) for t in
                ("Good morrow, noble Caesar. Farewell, noble", "Good morrow, noble Romeo. Farewell, noble"))
    metric = logit_diff_metric(tok.encode(" Caesar")[0], tok.encode(" Romeo")[0])
    e0, e1 = (patch_sweep(toy, src, tgt, metric, rows=[1, 3], backend=b) for b in ("numpy", "numba"))
    DIFFS.show("patch_sweep effects (rows 1, 3)", max_rel=rel(e1, e0), tol=tol)
    assert rel(e1, e0) <= tol
    g0, g1 = (patchscope_grid(toy, ids, ids, source_layers=[1, 3], max_new_tokens=3, backend=b)
              for b in ("numpy", "numba"))
    assert [r["ids"] for r in g1] == [r["ids"] for r in g0]  # greedy: the margins dwarf the differences
    assert max(abs(a["p_first"] - b["p_first"]) for a, b in zip(g0, g1)) <= tol
    d = steering_vector(toy, ["I love thee"], ["I hate thee"], layer=2)
    s0, s1 = (steered_generate(toy, "My lord, I", d, layer=2, alpha=4.0, max_new_tokens=6, backend=b)
              for b in ("numpy", "numba"))
    assert s1 == s0


def test_inspect_takes_backend_numba_and_refuses_an_unknown_one(tmp_path, capsys):
    from refimpl.__main__ import blas_threads_for

    args = ["patch", "--model", "shakespeare-llama"]
    assert main(args + ["--out", str(tmp_path / "np")]) == 0
    assert main(args + ["--backend", "numba", "--out", str(tmp_path / "nb")]) == 0
    capsys.readouterr()
    e0, e1 = (np.asarray(json.loads((tmp_path / d / "patch.json").read_text())["effects"]) for d in ("np", "nb"))
    assert rel(e1, e0) <= logit_tolerance(refimpl.load("shakespeare-llama").config, np.float32)
    with pytest.raises(SystemExit) as e:
        main(["lens", "--backend", "cuda-nope"])
    assert e.value.code == 2 and "--backend" in capsys.readouterr().err
    assert blas_threads_for(["inspect", "patch", "--backend", "numba"], {}) is None  # the kernels pick their threads
