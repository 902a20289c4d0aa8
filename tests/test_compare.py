"""refimpl.compare: the error model, the first-divergence finder, the name map, dumps, the CLI, and a bug zoo.

The bug zoo: a porter's own GPT-2 forward (written here from the equations, independently of
refimpl.gpt2.model, naming its activations the Hugging Face / TransformerLens way), with one
switch per mistake ports make. The clean port must agree at every point; each mistake must be
caught at the point where it enters, with the points just before it agreeing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import compare, gpt2
from refimpl.compare.core import first_divergence, rotated_positions, sum_length, tolerance, unit_roundoff
from refimpl.compare.names import reference_name, to_reference
from gpt2_oracle import ODD, oracle_pair
from porters import _gelu, porters_gpt2  # the bug zoo's GPT-2 (tests/porters.py)
from report import MaxDiffs

DIFFS = MaxDiffs("refimpl.compare: max err / tol of correct implementations (must be <= 1; margin = 1 / it)")

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the error model

def test_unit_roundoffs_and_the_tolerance_formula():
    """u per dtype; tol = scale (d + 1) (8 u + 2 sqrt(n) u_acc + 2 P u_acc), u_acc = min(u, 2^-24); d = block index,
    L after the blocks; P = the positions rotated (0 without RoPE)."""
    assert unit_roundoff(np.float64) == 2.0 ** -53 and unit_roundoff("bfloat16") == 2.0 ** -8
    assert unit_roundoff(np.float32) == 2.0 ** -24 and unit_roundoff(np.float16) == 2.0 ** -11
    with pytest.raises(ValueError, match="cannot compare dtype 'int32'"):
        unit_roundoff(np.int32)
    u = 2.0 ** -24
    assert tolerance("blocks.3.attn.q", 5, u, 400) == pytest.approx(4 * (8 * u + 2 * 20 * u))
    assert tolerance("logits", 5, u, 400, scale=2) == pytest.approx(2 * 6 * (8 * u + 40 * u))
    ub = 2.0 ** -8  # bfloat16 stored, float32 accumulated
    assert tolerance("blocks.0.resid_pre", 5, ub, 100) == pytest.approx(8 * ub + 20 * u)
    assert sum_length({"a": np.zeros((3, 7)), "b": np.zeros((2, 5, 9)), "logits": np.zeros((3, 1000))}) == 9
    # the rotation term: 2 P u_acc more in each block's budget, u_acc = float32's at most
    assert tolerance("blocks.3.attn.weights", 5, u, 400, positions=600) == pytest.approx(4 * (48 + 1200) * u)
    assert tolerance("blocks.0.attn.q", 5, ub, 100, positions=600) == pytest.approx(8 * ub + 20 * u + 1200 * u)
    assert rotated_positions({"blocks.0.attn.k_rot": np.zeros((1, 2, 7, 4)), "blocks.0.attn.q": np.zeros((9, 4))}) == 7
    assert rotated_positions({"blocks.0.attn.k": np.zeros((2, 7, 4))}) == 0  # no RoPE (GPT-2)


def test_errors_over_chunks_equal_the_whole_array(monkeypatch):
    """max |t - r| / max |r| taken chunk by chunk (3 entries here) equals the whole array's; a non-finite
    value of theirs where the reference's is finite, in any chunk, is inf."""
    from refimpl.compare import core

    rng = np.random.default_rng(0)
    r = rng.standard_normal((4, 5)).astype(np.float32)
    t = r + np.float32(1e-3) * rng.standard_normal((4, 5)).astype(np.float32)
    whole = core._errors(r, t)
    monkeypatch.setattr(core, "_CHUNK", 3)
    d = np.abs(t.astype(np.float64) - r)
    assert core._errors(r, t) == whole == (d.max(), d.max() / np.abs(r.astype(np.float64)).max())
    bad = t.copy()
    bad[3, 4] = np.nan  # the last chunk
    assert core._errors(r, bad) == (math.inf, math.inf)
    r2, t2 = r.copy(), t.copy()
    r2[0, 0] = t2[0, 0] = np.inf  # infinite on both sides at one entry: compared on the rest
    fin = np.isfinite(r2)
    assert core._errors(r2, t2)[0] == np.abs(t2[fin].astype(np.float64) - r2[fin]).max()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 10, allow_nan=False), st.just(math.nan), st.just(math.inf)), max_size=30))
def test_first_divergence_is_the_earliest_ratio_above_one(ratios):
    """For any sequence: the index of the first r > 1 (or NaN, or inf),
    every earlier one <= 1; None when all are <= 1."""
    i = first_divergence(ratios)
    if i is None:
        assert all(r <= 1 for r in ratios)
    else:
        assert not ratios[i] <= 1 and all(r <= 1 for r in ratios[:i])


# ----------------------------------------------------------------------------- the name map

def test_names_map_hugging_face_and_transformer_lens_to_refimpl():
    ref = [f"blocks.{i}.{p}" for i in range(3) for p in ("resid_pre", "attn.q", "attn.weights", "resid_post")]
    ref += ["ln_f.out", "logits"]
    assert reference_name("hidden_states.0", 3, ref) == ("blocks.0.resid_pre", False)
    assert reference_name("hidden_states.2", 3, ref) == ("blocks.1.resid_post", False)
    assert reference_name("hidden_states.3", 3, ref) == ("ln_f.out", False)  # HF: the last entry is normed
    assert reference_name("hidden_states.4", 3, ref) is None
    assert reference_name("attentions.1", 3, ref) == ("blocks.1.attn.weights", False)
    assert reference_name("blocks.2.attn.hook_q", 3, ref) == ("blocks.2.attn.q", True)
    assert reference_name("blocks.0.attn.hook_pattern", 3, ref) == ("blocks.0.attn.weights", False)
    assert reference_name("norm.out", 3, ref + ["norm.out"]) == ("norm.out", False)
    q = np.arange(2 * 5 * 3 * 4, dtype=np.float32).reshape(2, 5, 3, 4)  # TransformerLens [B, T, H, D]
    out = to_reference({"blocks.1.attn.hook_q": q}, ref, 3)
    np.testing.assert_array_equal(out["blocks.1.attn.q"][1], q.transpose(0, 2, 1, 3))  # refimpl [B, H, T, D]
    with pytest.raises(ValueError, match=r"'blocks.1.attn.hook_qq' names no point .*closest: blocks.1.attn.hook_q"):
        to_reference({"blocks.1.attn.hook_qq": q}, ref, 3)
    with pytest.raises(ValueError, match="both name the point 'blocks.0.resid_post'"):
        to_reference({"hidden_states.1": q, "blocks.0.resid_post": q}, ref, 3)


# ----------------------------------------------------------------------------- a porter's GPT-2, with switches

@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """A random 5-layer GPT-2 (3 heads of 32, F = 384) saved as a Hugging Face directory, and the refimpl model."""
    hf, _ = oracle_pair(ODD, seed=0)
    d = tmp_path_factory.mktemp("odd")
    hf.save_pretrained(d)
    return d, gpt2.load(d)


IDS = np.array([5, 17, 300, 2, 999, 41, 41, 8, 123, 64, 0, 77])

# mistake -> (port keywords, the point where it must be caught, a point that must agree just before it)
ZOO = {
    "scale by sqrt(width)": (dict(scale_by_width=True), "blocks.0.attn.weights", "blocks.0.attn.v"),
    "no causal mask": (dict(no_causal_mask=True), "blocks.0.attn.weights", "blocks.0.attn.k"),
    "GELU erf for tanh": (dict(gelu_erf=True), "blocks.0.mlp.hidden", "blocks.0.resid_mid"),
    "LayerNorm eps 1e-12 for 1e-5": (dict(eps=1e-12), "blocks.0.attn.q", None),
    "softmax in float16": (dict(softmax_float16=True), "blocks.0.attn.weights", "blocks.0.attn.v"),
    "positions off by one": (dict(position_offset=1), "blocks.0.resid_pre", None),
}


@pytest.mark.parametrize("names", ["hf", "tl"])
def test_the_clean_port_agrees_everywhere(odd, names):
    _, model = odd
    report = compare.compare_model(model, IDS, porters_gpt2(model, IDS, names=names))
    worst = max(r.ratio for r in report.rows)
    DIFFS.show(f"clean GPT-2 port ({names} names), {len(report.rows)} points", max_rel=worst, tol=1.0)
    assert report.ok, report.table()


@pytest.mark.parametrize("mistake", list(ZOO))
def test_each_mistake_is_caught_where_it_enters(odd, mistake):
    _, model = odd
    kw, where, agreed = ZOO[mistake]
    report = compare.compare_model(model, IDS, porters_gpt2(model, IDS, names="tl", **kw))
    first = report.rows[report.first]
    print(f"\n[{mistake}] {report.summary()}")
    assert not report.ok and first.name == where, report.table()
    if agreed is not None:
        assert agreed in [r.name for r in report.agreed_before()]


def test_the_float16_softmax_overflow_is_reported_as_not_finite(odd):
    """exp of a score above 11.09 overflows float16 (max 65504): inf / inf = NaN weights, reported as NOT FINITE.

    Block 0's q/k/v weights times 30 make its scores ~900x larger (they are products of two of them).
    """
    import dataclasses

    _, model = odd
    b0 = model.params.blocks[0]
    qkv = dataclasses.replace(b0.attn_qkv, w=b0.attn_qkv.w * 30)
    blocks = (dataclasses.replace(b0, attn_qkv=qkv),) + model.params.blocks[1:]
    big = dataclasses.replace(model, params=dataclasses.replace(model.params, blocks=blocks))
    report = compare.compare_model(big, IDS, porters_gpt2(big, IDS, names="tl", softmax_float16=True))
    first = report.rows[report.first]
    assert first.name == "blocks.0.attn.weights" and first.verdict == "NOT FINITE", report.table()
    assert "is not finite" in report.summary()


# ----------------------------------------------------------------------------- Hugging Face, live and dumped

@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_hugging_face_agrees_within_its_tolerance(odd, dtype, tmp_path):
    """HF GPT-2 run live in float32, float64, and bfloat16 (a bfloat16 copy of the weights) against the reference;
    the same through a dump file."""
    d, model = odd
    ref_model = gpt2.load(d, dtype=np.float64) if dtype == "float64" else model
    theirs, dt = compare.hf_activations(d, IDS, dtype=dtype)
    report = compare.compare_model(ref_model, IDS, theirs, their_dtype=dt)
    worst = max(r.ratio for r in report.rows)
    DIFFS.show(f"HF GPT-2 {dtype} (u = {report.u:.3g})", max_rel=worst, tol=1.0)
    assert report.ok, report.table()
    assert report.to_dict()["tolerance"]["their_dtype"] == dtype
    # through a dump
    arrays, ids, _ = compare.read_activations(compare.dump(tmp_path / "hf.safetensors", theirs, ids=IDS))
    again = compare.compare_model(ref_model, ids, arrays, their_dtype=dt)
    assert [(r.name, r.max_abs) for r in again.rows] == [(r.name, r.max_abs) for r in report.rows]


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_dump_round_trip_and_the_command_line(odd, tmp_path, suffix):
    """dump -> read_activations is exact; the CLI agrees (exit 0), catches a mistake (exit 1),
    refuses bad input (exit 2)."""
    d, model = odd
    good = porters_gpt2(model, IDS)
    f = compare.dump(tmp_path / f"good{suffix}", good, ids=IDS)
    arrays, ids, dt = compare.read_activations(f)
    assert dt == "float32" and list(ids) == list(IDS)
    for k in good:
        np.testing.assert_array_equal(arrays[k], good[k])
    bad = compare.dump(tmp_path / f"bad{suffix}", porters_gpt2(model, IDS, gelu_erf=True, names="tl"), ids=IDS)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "refimpl", "compare", "--model", str(d), *map(str, args)],
                              capture_output=True, text=True, cwd=REPO, timeout=300)

    ok = cli("--theirs", f, "--json", tmp_path / "r.json", "--plot", tmp_path / "r.png")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "all 12 points agree" in ok.stdout and json.loads((tmp_path / "r.json").read_text())["ok"]
    assert (tmp_path / "r.png").stat().st_size > 1000
    caught = cli("--theirs", bad)
    assert caught.returncode == 1 and "first divergence: blocks.0.mlp.hidden" in caught.stdout, caught.stdout
    wrong_ids = cli("--theirs", f, "--ids", "1 2 3")
    assert wrong_ids.returncode == 2 and "differ from the ids their dump was made from" in wrong_ids.stderr
    ref = cli("--ids", " ".join(map(str, IDS)), "--write-reference", tmp_path / f"ref{suffix}")
    assert ref.returncode == 0, ref.stderr
    again = cli("--theirs", tmp_path / f"ref{suffix}")
    assert again.returncode == 0 and "err/tol" in again.stdout


def test_bad_input_gets_a_clear_error(odd, tmp_path):
    _, model = odd
    good = porters_gpt2(model, IDS)
    with pytest.raises(ValueError, match=r"their 'logits' has shape \[11, 1000\]; the reference's 'logits' is \[12, "
                                         r"1000\]"):
        compare.compare_model(model, IDS, {"logits": good["logits"][:11]})
    with pytest.raises(ValueError, match="has dtype int64: cannot compare"):
        compare.compare_model(model, IDS, {"logits": np.zeros((12, 1000), np.int64)})
    with pytest.raises(ValueError, match="must be a .safetensors or .npz file"):
        compare.read_activations(tmp_path / "acts.pt")
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ValueError, match="junk.npz"):
        compare.read_activations(tmp_path / "junk.npz")
    with pytest.raises(ValueError, match="expected floating-point values"):
        compare.dump(tmp_path / "x.npz", {"a": np.zeros(3, np.int32)})
    report = compare.compare_model(model, IDS, lambda ids: {"logits": porters_gpt2(model, ids)["logits"]})
    assert report.ok and [r.name for r in report.rows] == ["logits"]


# ----------------------------------------------------------------------------- a porter's LLaMA, with switches

def _rms(x, w, eps, plus_one):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * ((1 + w) if plus_one else w)


def porters_llama(model, ids, *, interleaved=False, forget_plus_one=False, tile_kv_heads=False, tie_head=False,
                  position_offset=0, angle_dtype=np.float64):
    """An independent LLaMA / Gemma forward on ids [T] (no window, no caps, no q/k norms), TransformerLens names.

    The RoPE frequencies come from refimpl.rope_scaling (a porter copies them from the model's
    config); everything else is written here from the equations. angle_dtype: the precision the
    angles p w_i are formed in (float32 as Hugging Face and llama.cpp do; float16 is a mistake).
    """
    from refimpl.rope_scaling import scaled_rope_frequencies

    p, c = model.params, model.config
    T, H, K, D = len(ids), c.num_attention_heads, c.num_key_value_heads, c.head_dim
    plus_one = c.norm_plus_one and not forget_plus_one
    rope = c.rope.to_dict()
    w = scaled_rope_frequencies(c.rotary_dim, max_position_embeddings=c.max_position_embeddings, seq_len=T, **rope)
    angles = (np.arange(T) + position_offset).astype(angle_dtype)[:, None] * w.astype(angle_dtype)  # [T, D/2]
    cos, sin = np.cos(angles).astype(np.float64)[:, None, :], np.sin(angles).astype(np.float64)[:, None, :]

    def rot(x):  # [T, n, D]
        if interleaved:
            a, b = x[..., 0::2], x[..., 1::2]
            return np.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(x.shape)
        a, b = x[..., :D // 2], x[..., D // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    act = {"silu": lambda z: z / (1 + np.exp(-z)),
           "gelu_pytorch_tanh": lambda z: _gelu(z)}[c.hidden_act]
    x = p.embed[ids].astype(np.float64) * (c.embed_scale or 1.0)
    acts = {}
    for i, b in enumerate(p.blocks):
        acts[f"blocks.{i}.hook_resid_pre"] = x
        h = _rms(x, b.attn_norm, c.rms_norm_eps, plus_one)

        def proj(lp):
            return h @ lp.w + (0 if lp.b is None else lp.b)

        q, k, v = proj(b.attn.q).reshape(T, H, D), proj(b.attn.k).reshape(T, K, D), proj(b.attn.v).reshape(T, K, D)
        qr, kr = rot(q), rot(k)
        heads = np.tile(np.arange(K), H // K) if tile_kv_heads else np.repeat(np.arange(K), H // K)  # head h -> kv head
        s = np.einsum("thd,shd->hts", qr, kr[:, heads]) * c.attention_scale
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        wts = e / e.sum(-1, keepdims=True)
        y = np.einsum("hts,shd->thd", wts, v[:, heads]).reshape(T, H * D)
        a = y @ b.attn.o.w + (0 if b.attn.o.b is None else b.attn.o.b)
        acts.update({f"blocks.{i}.attn.hook_q": q, f"blocks.{i}.attn.hook_k": k, f"blocks.{i}.attn.hook_v": v,
                     f"blocks.{i}.attn.hook_rot_q": qr, f"blocks.{i}.attn.hook_rot_k": kr,
                     f"blocks.{i}.attn.hook_pattern": wts, f"blocks.{i}.hook_attn_out": a})
        x = x + a
        acts[f"blocks.{i}.hook_resid_mid"] = x
        h = _rms(x, b.mlp_norm, c.rms_norm_eps, plus_one)
        g, u = h @ b.mlp.gate.w + (0 if b.mlp.gate.b is None else b.mlp.gate.b), \
            h @ b.mlp.up.w + (0 if b.mlp.up.b is None else b.mlp.up.b)
        m = act(g) * u
        acts[f"blocks.{i}.mlp.hook_post"] = m
        x = x + m @ b.mlp.down.w + (0 if b.mlp.down.b is None else b.mlp.down.b)
        acts[f"blocks.{i}.hook_resid_post"] = x
    head = p.embed if tie_head else p.output_embedding
    acts["logits"] = _rms(x, p.norm, c.rms_norm_eps, plus_one) @ head.T
    return {k: np.asarray(v, dtype=np.float32) for k, v in acts.items()}


@pytest.fixture(scope="module")
def llamas(tmp_path_factory):
    """Random Hugging Face llama (GQA 6/2, llama3 RoPE, biases), gemma (1 + w, sqrt(C) embed) and mistral (untied)."""
    from llama_oracle import hf_llama

    out = {}
    for case in ("llama", "gemma", "mistral"):
        d = tmp_path_factory.mktemp(case)
        hf_llama(case).save_pretrained(d)
        out[case] = d, refimpl_load(d)
    return out


def refimpl_load(d):
    import refimpl

    return refimpl.load(d)


LLAMA_IDS = np.array([3, 50, 7, 96, 12, 12])  # 6 tokens: shorter than mistral's window of 7

LLAMA_ZOO = {  # mistake -> (case, port keywords, the point where it must be caught)
    "RoPE interleaved for half-split": ("llama", dict(interleaved=True), "blocks.0.attn.q_rot"),
    "Gemma's RMSNorm without 1 + w": ("gemma", dict(forget_plus_one=True), "blocks.0.attn.q"),
    "KV heads repeated in the wrong order": ("llama", dict(tile_kv_heads=True), "blocks.0.attn.weights"),
    "untied head loaded as tied": ("mistral", dict(tie_head=True), "logits"),
    "RoPE positions off by one": ("llama", dict(position_offset=1), "blocks.0.attn.q_rot"),
}


@pytest.mark.parametrize("case", ["llama", "gemma", "mistral"])
def test_the_clean_llama_port_agrees_everywhere(llamas, case):
    _, model = llamas[case]
    report = compare.compare_model(model, LLAMA_IDS, porters_llama(model, LLAMA_IDS))
    DIFFS.show(f"clean {case} port, {len(report.rows)} points", max_rel=max(r.ratio for r in report.rows), tol=1.0)
    assert report.ok, report.table()


@pytest.mark.parametrize("mistake", list(LLAMA_ZOO))
def test_each_llama_mistake_is_caught_where_it_enters(llamas, mistake):
    case, kw, where = LLAMA_ZOO[mistake]
    _, model = llamas[case]
    report = compare.compare_model(model, LLAMA_IDS, porters_llama(model, LLAMA_IDS, **kw))
    print(f"\n[{mistake}] {report.summary()}")
    assert not report.ok and report.rows[report.first].name == where, report.table()


def test_what_agreed_before_is_the_diverging_points_neighbourhood(llamas):
    """For the logits: the final norm's group and one point before it, not the whole model."""
    _, model = llamas["mistral"]
    report = compare.compare_model(model, LLAMA_IDS, porters_llama(model, LLAMA_IDS, tie_head=True))
    assert [r.name for r in report.agreed_before()] == [f"blocks.{model.config.num_hidden_layers - 1}.resid_post"]


@pytest.mark.parametrize("case", ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"])
def test_hugging_face_llama_family_agrees_live(llamas, case, tmp_path, monkeypatch):
    """Each LLaMA-family type, live: float32 and a bfloat16 copy of the weights agree (each within its own
    tolerance); float64 agrees once HF's float32-only steps are lifted.

    As shipped, HF's float64 model runs RMSNorm, the RoPE frequencies and the softmax in float32:
    compared in float64 it parts at the first point those reach, and the report says so.
    """
    from llama_oracle import float64_throughout, hf_llama

    import refimpl

    hf = hf_llama(case)
    d = tmp_path / case
    hf.save_pretrained(d)
    model = refimpl.load(d)
    theirs, dt = compare.hf_activations(hf, LLAMA_IDS)
    r32 = compare.compare_model(model, LLAMA_IDS, theirs, their_dtype=dt)
    DIFFS.show(f"HF {case} float32, {len(r32.rows)} points", max_rel=max(r.ratio for r in r32.rows), tol=1.0)
    assert r32.ok, r32.table()
    model64 = refimpl.load(d, dtype=np.float64)
    shipped, _ = compare.hf_activations(hf_llama(case).double(), LLAMA_IDS, dtype="float64")
    r_shipped = compare.compare_model(model64, LLAMA_IDS, shipped, their_dtype="float64")
    print(f"\n[HF {case} float64 as shipped] {r_shipped.summary()[:160]}")
    assert not r_shipped.ok  # the float32 steps are 1e-8 errors, far above float64's tolerance
    import torch

    bf16, _ = compare.hf_activations(hf_llama(case).to(torch.bfloat16), LLAMA_IDS, dtype="bfloat16")
    r16 = compare.compare_model(model, LLAMA_IDS, bf16, their_dtype="bfloat16")
    DIFFS.show(f"HF {case} bfloat16 copy (u = {r16.u:.3g})", max_rel=max(r.ratio for r in r16.rows), tol=1.0)
    assert r16.ok and r16.to_dict()["tolerance"]["their_dtype"] == "bfloat16", r16.table()
    lifted, _ = compare.hf_activations(float64_throughout(hf_llama(case), monkeypatch), LLAMA_IDS, dtype="float64")
    r64 = compare.compare_model(model64, LLAMA_IDS, lifted, their_dtype="float64")
    DIFFS.show(f"HF {case} float64 lifted", max_rel=max(r.ratio for r in r64.rows), tol=1.0)
    assert r64.ok, r64.table()


# ----------------------------------------------------------------------------- long prompts: RoPE's float32 angles

LONG = 800  # positions: a float32 angle p w_i is then off by up to ~P u = 4.8e-5 rad


@pytest.fixture(scope="module")
def long_llama():
    """A random 1-layer Hugging Face LLaMA with SmolLM2-135M's head width (D = 64, RoPE theta 1e4) and q / k
    weights twice the unit scale, so that its score scale c |q| |k| (~50) is SmolLM2's first block's (57);
    the refimpl model of it, and LONG random token ids."""
    import tempfile

    import torch

    from llama_oracle import hf_llama

    hf = hf_llama("llama", num_hidden_layers=1, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=64, rope_parameters=dict(rope_type="default", rope_theta=1e4),
                  max_position_embeddings=2 * LONG)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(2.0)
            layer.self_attn.k_proj.weight.mul_(2.0)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = refimpl_load(d)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, LONG)
    return hf, model, ids


def _without_rotation_term(report, name):
    """err / tol of `name` under the error model without its rotation term (positions = 0)."""
    row = next(r for r in report.rows if r.name == name)
    return row.max_rel / tolerance(name, report.n_layers, report.u, report.n, report.scale)


def test_hugging_face_float32_agrees_at_a_long_prompt(long_llama):
    """HF forms the RoPE angles p w_i in float32: an angle error growing with p, which moves the attention
    weights by several times what the sums' terms allow at 800 positions; with HF's angles formed in float64
    instead, the weights agree without the rotation term, so the angles are the cause."""
    import types

    from llama_oracle import _rotary_in_float64

    hf, model, ids = long_llama
    theirs, dt = compare.hf_activations(hf, ids)
    report = compare.compare_model(model, ids, theirs, their_dtype=dt)
    worst = max(r.ratio for r in report.rows)
    before = _without_rotation_term(report, "blocks.0.attn.weights")
    DIFFS.show(f"HF llama float32 at {LONG} positions (weights without the rotation term: {before:.3g})",
               max_rel=worst, tol=1.0)
    assert report.ok and report.positions == LONG, report.table()
    assert before > 2, report.table()  # the failure the rotation term removes
    for module in hf.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(_rotary_in_float64, module)
    lifted, _ = compare.hf_activations(hf, ids)
    lifted_report = compare.compare_model(model, ids, lifted, their_dtype=dt)
    after = _without_rotation_term(lifted_report, "blocks.0.attn.weights")
    print(f"\n[HF, angles in float64] weights' err / tol without the rotation term: {after:.3g}")
    assert after < before / 4, lifted_report.table()


def test_float32_angles_agree_and_float16_angles_are_caught_at_a_long_prompt(long_llama):
    """The porter's LLaMA with float32 angles agrees at every point (without the rotation term its q_rot parts);
    with float16 angles (off by up to P 2^-11 rad) it parts at q_rot; a wrong KV-head order is still caught at
    the weights, and a wrong RoPE pairing at q_rot."""
    _, model, ids = long_llama
    f32 = compare.compare_model(model, ids, porters_llama(model, ids, angle_dtype=np.float32))
    before = _without_rotation_term(f32, "blocks.0.attn.q_rot")
    DIFFS.show(f"porter's llama, float32 angles, {LONG} positions (q_rot without the rotation term: {before:.3g})",
               max_rel=max(r.ratio for r in f32.rows), tol=1.0)
    assert f32.ok and before > 1, f32.table()
    for kw, where in ((dict(angle_dtype=np.float16), "blocks.0.attn.q_rot"),
                      (dict(tile_kv_heads=True), "blocks.0.attn.weights"),
                      (dict(interleaved=True), "blocks.0.attn.q_rot")):
        bad = compare.compare_model(model, ids, porters_llama(model, ids, **kw))
        print(f"\n[{kw}, {LONG} positions] {bad.summary()[:200]}")
        assert not bad.ok and bad.rows[bad.first].name == where, bad.table()
