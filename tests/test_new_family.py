"""A new model family joins the house by writing its config, params and forward, and one Family entry: nothing else.

The family below lives only in this module: a small pre-norm decoder with learned absolute positions
(x = E[ids] + P[positions]; per block x += Attn(RMSNorm(x)), x += W_down GELU(W_up RMSNorm(x)); then
RMSNorm and the tied head z = h E^T), its own config, params, forward, KV-cache step and loader. It is
added with refimpl.families.register, and then the house's own entry points run on it unchanged:
refimpl.generate / decoding.stream / generate_batch (greedy decoding picks the argmax of the family's
own full-forward logits at every step, cached or recomputed, one prompt or a left-padded batch),
refimpl.interp (capture at every hook point the family names, the logit lens), refimpl.compare
(a copy with one layer perturbed is found diverging at that layer, the model against itself agrees),
and the command line (generate, compare and inspect lens on a folder whose config.json names the
family's model_type). The registration API's refusals (a duplicate, a class already taken, a decoder
entry with empty fields) are checked too.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

import refimpl
from refimpl import decoding, families
from refimpl.attention import softmax
from refimpl.cache import KVCache
from refimpl.decoding import Decoder, recomputing
from refimpl.families import Family
from refimpl.ffn import gelu_tanh
from refimpl.hooks import no_hook, prefixed
from refimpl.norms import rms_norm
from refimpl.safetensors import load_file, save_file
from refimpl._switches import MODEL_RULE, AttentionRule

MODEL_TYPE = "tiny_learned_decoder"


# ----------------------------------------------------------------------------- the family: config, params, forward

@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 29
    d_model: int = 16
    n_heads: int = 2
    n_layers: int = 3
    d_ff: int = 24
    max_positions: int = 32
    eps: float = 1e-5
    bos_token_id: int | None = 1
    eos_token_id: int | None = None


@dataclass(frozen=True)
class TinyBlock:
    norm1: np.ndarray  # [C]
    wq: np.ndarray  # [C, C]
    wk: np.ndarray  # [C, C]
    wv: np.ndarray  # [C, C]
    wo: np.ndarray  # [C, C]
    norm2: np.ndarray  # [C]
    w_up: np.ndarray  # [C, F]
    w_down: np.ndarray  # [F, C]


@dataclass(frozen=True)
class TinyParams:
    tok: np.ndarray  # [V, C], also the head (tied)
    pos: np.ndarray  # [P, C]
    blocks: tuple  # of TinyBlock
    norm: np.ndarray  # [C]

    @property
    def dtype(self) -> np.dtype:
        return self.tok.dtype

    def named(self) -> dict[str, np.ndarray]:
        out = {"tok": self.tok, "pos": self.pos, "norm": self.norm}
        for i, b in enumerate(self.blocks):
            out.update({f"blocks.{i}.{f.name}": getattr(b, f.name) for f in dataclasses.fields(b)})
        return out

    @classmethod
    def from_named(cls, t: dict, config: TinyConfig, dtype) -> "TinyParams":
        blocks = tuple(TinyBlock(**{f.name: t[f"blocks.{i}.{f.name}"].astype(dtype)
                                    for f in dataclasses.fields(TinyBlock)}) for i in range(config.n_layers))
        return cls(t["tok"].astype(dtype), t["pos"].astype(dtype), blocks, t["norm"].astype(dtype))


@dataclass(frozen=True)
class TinyModel:
    config: TinyConfig
    params: TinyParams
    tokenizer: object = None


def random_model(seed: int = 0, dtype=np.float64, config: TinyConfig = TinyConfig()) -> TinyModel:
    rng = np.random.default_rng(seed)
    C, F, c = config.d_model, config.d_ff, config

    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(dtype)

    def g():
        return (1 + 0.1 * rng.standard_normal(C)).astype(dtype)

    blocks = tuple(TinyBlock(g(), w(C, C), w(C, C), w(C, C), w(C, C), g(), w(C, F), w(F, C)) for _ in range(c.n_layers))
    emb = rng.standard_normal((c.vocab_size, C)).astype(dtype)
    return TinyModel(config, TinyParams(emb, (0.5 * rng.standard_normal((c.max_positions, C))).astype(dtype), blocks,
                                        g()))


def head_dim(config: TinyConfig) -> int:
    return config.d_model // config.n_heads


def check_ids(ids, config: TinyConfig, name: str = "ids") -> np.ndarray:
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu" or (ids.size and not (0 <= ids.min() and ids.max() < config.vocab_size)):
        raise ValueError(f"{name} must be integers in [0, {config.vocab_size}); got {ids.dtype} {ids.tolist()!r:.60}")
    return ids.astype(np.int64)


def _heads(x, H):  # [B, T, C] -> [B, H, T, D]
    B, T, C = x.shape
    return x.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)


def hidden_states(params: TinyParams, config: TinyConfig, ids, *, cache: KVCache | None = None, attention_mask=None,
                  positions=None, hook=no_hook, rule: AttentionRule = MODEL_RULE, ops=None,
                  last_only: bool = False) -> np.ndarray:  # [B, T] -> [B, T, C]
    """h = RMSNorm(Block_L(... Block_1(E[ids] + P[positions]))): each block x += Attn(RMSNorm(x)), x += MLP(RMSNorm(x)).

    attention_mask [B, S] (S = cache.length + T) marks real tokens (positions: cumsum - 1, as a row alone);
    the cache's keys / values are written at [length, length + T) and length advances.
    """
    hook = no_hook if hook is None else hook
    ids = check_ids(ids, config)
    B, T = ids.shape
    start = 0 if cache is None else cache.length
    S = start + T
    key_mask = np.ones((B, S), bool) if attention_mask is None else np.asarray(attention_mask, bool)
    if positions is None:
        positions = np.maximum(np.cumsum(key_mask, axis=1) - 1, 0)[:, start:]
    x = params.tok[ids] + params.pos[positions]  # [B, T, C]
    H, D = config.n_heads, head_dim(config)
    scale = x.dtype.type(rule.scale_or(1 / math.sqrt(D)))
    see = key_mask[:, None, None, :] & (~rule.causal | (np.arange(S)[None, :] <= np.arange(start, S)[:, None]))
    for layer, p in enumerate(params.blocks):
        local = prefixed(hook, f"blocks.{layer}.")
        x = local("resid_pre", x)
        h = rms_norm(x, p.norm1, eps=config.eps)
        q, k, v = (local(f"attn.{n}", _heads(h @ w, H)) for n, w in (("q", p.wq), ("k", p.wk), ("v", p.wv)))
        if cache is not None:
            cache.k[layer, :, :, start:S], cache.v[layer, :, :, start:S] = k, v
            k, v = cache.k[layer, :, :, :S], cache.v[layer, :, :, :S]
        w = local("attn.weights", softmax(np.where(see, (q @ k.swapaxes(-1, -2)) * scale, -np.inf)))  # [B, H, T, S]
        a = local("attn.out", (w @ v).transpose(0, 2, 1, 3).reshape(B, T, H * D) @ p.wo)
        x = local("resid_mid", x + a)
        m = local("mlp.hidden", gelu_tanh(rms_norm(x, p.norm2, eps=config.eps) @ p.w_up))
        x = local("resid_post", x + local("mlp.out", m @ p.w_down))
    if cache is not None:
        cache.length = S
    return hook("norm.out", rms_norm(x[:, -1:] if last_only else x, params.norm, eps=config.eps))


def lm_head(h, params: TinyParams) -> np.ndarray:  # [..., C] -> [..., V]
    return h @ params.tok.T


NUMPY_OPS = SimpleNamespace(name="numpy", prepare=lambda params: params, zeros=np.zeros, to_numpy=np.asarray,
                            declined=Counter())


def get_ops(backend="numpy"):
    if backend != "numpy":
        raise ValueError(f"the tiny family runs on the numpy backend only; got {backend!r}")
    return NUMPY_OPS


def _rule(config, causal, attention_scale) -> AttentionRule:
    return AttentionRule.of(causal, attention_scale, head_dim=head_dim(config), width=config.d_model)


def logits(model: TinyModel, ids, *, backend="numpy", attention_mask=None, causal=True, attention_scale=None):
    get_ops(backend)
    ids = check_ids(ids, model.config)
    one = ids.ndim == 1
    h = hidden_states(model.params, model.config, ids[None] if one else ids, attention_mask=attention_mask,
                      rule=_rule(model.config, causal, attention_scale))
    z = lm_head(h, model.params)
    return z[0] if one else z


def decoder(model: TinyModel, backend="numpy", *, causal=True, attention_scale=None) -> Decoder:
    get_ops(backend)
    config, params, rule = model.config, model.params, _rule(model.config, causal, attention_scale)

    def prefill(weights, ids, cache, mask):  # [B, P] -> [B, V]
        return lm_head(hidden_states(weights, config, ids, cache=cache, attention_mask=mask, rule=rule,
                                     last_only=True)[:, -1], weights)

    def recompute(weights, ids, cache, mask):  # every token so far, no cache
        cache.length = ids.shape[1]
        return lm_head(hidden_states(weights, config, ids, attention_mask=mask, rule=rule)[:, -1], weights)

    def bound() -> float:  # |z_i| = |x^ . (g * E_i)| <= sqrt(C) |g * E_i| (|x^|^2 <= C), and |log p| <= 2 Z + log V
        Z = math.sqrt(config.d_model) * float(np.max(np.linalg.norm(params.tok * params.norm, axis=1)))
        return 2 * Z * (1 + 1e-3) + math.log(config.vocab_size)

    if rule.causal:
        fields = dict(allocate=lambda B, n: KVCache.allocate(config, B, max_len=n, dtype=params.dtype),
                      prefill=prefill, step=lambda w, ids, cache, mask: prefill(w, ids[:, -1:], cache, mask),
                      first_rows=KVCache.first_rows, reorder=lambda cache, rows: cache.reorder(rows))
    else:
        fields = recomputing(recompute)
    return Decoder(family="tiny", vocab_size=config.vocab_size, eos_token_id=config.eos_token_id,
                   bos_token_id=config.bos_token_id, tokenizer=model.tokenizer, bos_text=None,
                   context_limit=config.max_positions, context_name="max_positions", dtype=params.dtype,
                   logit_bound=bound, bound_reason="the final RMSNorm and the tied embedding",
                   prepare=lambda: params, **fields)


def save(model: TinyModel, folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": MODEL_TYPE, **dataclasses.asdict(model.config)}))
    save_file(model.params.named(), folder / "model.safetensors")


def load(path, *, dtype=np.float32) -> TinyModel:
    d = json.loads((path / "config.json").read_text())
    d.pop("model_type")
    config = TinyConfig(**d)
    return TinyModel(config, TinyParams.from_named(load_file(path / "model.safetensors"), config, np.dtype(dtype)))


FAMILY = Family(
    name="tiny", label="tiny learned-position decoder", model_class=TinyModel, config_class=TinyConfig,
    load=load, load_keywords=("dtype",), logits=logits, decoder=decoder, get_ops=get_ops,
    model_type=lambda c: MODEL_TYPE, positions="learned", context_name="max_positions",
    context=lambda c: c.max_positions, n_layers=lambda c: c.n_layers, width=lambda c: c.d_model,
    n_heads=lambda c: c.n_heads, n_kv_heads=lambda c: c.n_heads, head_dim=head_dim,
    block_points=("resid_pre", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.out", "resid_mid", "mlp.hidden",
                  "mlp.out", "resid_post"),
    final_point="norm.out", check_ids=check_ids, hidden_states=hidden_states,
    lm_head=lambda m, h: lm_head(h, m.params),
    final_norm=lambda m, r: rms_norm(r, m.params.norm, eps=m.config.eps),
    allocate_cache=lambda m, B, n: KVCache.allocate(m.config, B, max_len=n, dtype=m.params.dtype),
    dtype=lambda p: p.dtype, model_types=(MODEL_TYPE,),
)


@pytest.fixture(scope="module")
def registered():
    families.register(FAMILY)
    yield FAMILY
    families.unregister("tiny")


@pytest.fixture(scope="module")
def model(registered):
    return random_model(0)


PROMPT = [1, 5, 9, 2]


def _greedy_by_hand(model, prompt, n, **switches) -> list[int]:
    """argmax of the family's own full-forward logits, one token at a time (no cache, no decoding module)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(logits(model, ids, **switches)[-1])))
    return ids[len(prompt):]


# ----------------------------------------------------------------------------- registration

def test_register_finds_the_family_by_model_config_and_name(registered, model):
    assert families.of_model(model) is FAMILY and families.of_config(model.config) is FAMILY
    assert families.named("tiny") is FAMILY and "tiny" in families.NAMES
    assert families.of_model_type(MODEL_TYPE) is FAMILY


def test_register_refuses_what_would_break_the_table(registered):
    with pytest.raises(ValueError, match="named 'tiny' is already in the table"):
        families.register(FAMILY)
    with pytest.raises(ValueError, match="model_class TinyModel is already the 'tiny' family's"):
        families.register(dataclasses.replace(FAMILY, name="tiny2"))
    with pytest.raises(ValueError, match="model_class GPT2Model is already the 'gpt2' family's"):
        families.register(dataclasses.replace(FAMILY, name="tiny3", model_class=refimpl.gpt2.GPT2Model))

    class Other:
        pass

    with pytest.raises(ValueError, match="is a decoder .* but leaves hidden_states, lm_head empty"):
        families.register(dataclasses.replace(FAMILY, name="tiny4", model_class=Other, config_class=Other,
                                              hidden_states=None, lm_head=None, model_types=()))
    with pytest.raises(TypeError, match="register takes a refimpl.families.Family"):
        families.register("tiny")
    with pytest.raises(ValueError, match="the shipped families gpt2, llama, bert cannot be removed"):
        families.unregister("gpt2")
    assert families.NAMES.count("tiny") == 1 and families.of_model_type("nothing") is None


def test_an_unregistered_family_is_not_a_model(registered, model):
    """Unregistered, the family's models are what any other object is to the house: a TypeError naming what it takes."""
    assert families.unregister("tiny") is FAMILY
    try:
        with pytest.raises(TypeError, match="model must be a GPT2Model or a LlamaModel"):
            refimpl.generate(model, PROMPT, max_new_tokens=1)
        assert families.of_model_type(MODEL_TYPE) is None and "tiny" not in families.NAMES
    finally:
        families.register(FAMILY)


# ----------------------------------------------------------------------------- decoding

def test_generate_is_greedy_over_the_familys_own_logits(model):
    want = _greedy_by_hand(model, PROMPT, 8)
    out = refimpl.generate(model, PROMPT, max_new_tokens=8)
    assert out.ids == want and out.finish_reason == "length"
    assert list(decoding.stream(model, PROMPT, max_new_tokens=8)) == want
    print(f"tiny family, greedy: {want}")


def test_generate_without_the_causal_mask_recomputes(model):
    want = _greedy_by_hand(model, PROMPT, 5, causal=False)
    assert not np.allclose(logits(model, PROMPT, causal=False), logits(model, PROMPT))  # (the switch does something)
    assert refimpl.generate(model, PROMPT, max_new_tokens=5, causal=False).ids == want


def test_generate_batch_left_pads_to_each_prompts_own_continuation(model):
    prompts = [PROMPT, [3, 4], [7, 1, 1, 8, 2, 6]]
    outs = decoding.generate_batch(model, prompts, max_new_tokens=6)
    for p, out in zip(prompts, outs):
        assert out.ids == _greedy_by_hand(model, p, 6)


def test_sampling_and_beam_search_run(model):
    a = refimpl.generate(model, PROMPT, max_new_tokens=6, do_sample=True, top_k=5, seed=3)
    assert a.ids == refimpl.generate(model, PROMPT, max_new_tokens=6, do_sample=True, top_k=5, seed=3).ids
    beam = refimpl.generate(model, PROMPT, max_new_tokens=4, num_beams=3)
    assert len(beam.ids) == 4 and beam.score is not None


def test_the_context_limit_is_the_familys(model):
    with pytest.raises(ValueError, match="max_positions"):
        refimpl.generate(model, [1] * 30, max_new_tokens=5)


# ----------------------------------------------------------------------------- interp

def test_capture_sees_every_hook_point_the_family_names(model):
    from refimpl import interp

    ids = np.array(PROMPT)
    z, acts = interp.run_with_cache(model, ids)
    assert list(acts) == FAMILY.hook_names(model.config)
    np.testing.assert_array_equal(z, logits(model, ids))
    assert acts["blocks.0.attn.weights"].shape == (2, 4, 4)  # [H, T, S] (one sequence: capture drops the batch axis)


def test_logit_lens_ends_at_the_logits(model):
    from refimpl import interp

    ids = np.array(PROMPT)
    lens = interp.logit_lens(model, ids)  # [L + 1, T, V]: the residual before each block and after the last
    np.testing.assert_allclose(lens[-1], logits(model, ids), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- compare

def _perturbed(model, layer: int) -> TinyModel:
    blocks = list(model.params.blocks)
    blocks[layer] = dataclasses.replace(blocks[layer], w_up=blocks[layer].w_up * 1.01)
    return dataclasses.replace(model, params=dataclasses.replace(model.params, blocks=tuple(blocks)))


def test_compare_finds_the_perturbed_layer(model):
    from refimpl import compare

    ids = np.array(PROMPT)
    assert compare.compare_model(model, ids, compare.reference_activations(model, ids)).ok
    report = compare.compare_model(model, ids, compare.reference_activations(_perturbed(model, 1), ids))
    assert not report.ok
    assert report.rows[report.first].name == "blocks.1.mlp.hidden", report.table()  # (W_up of block 1 is 1% larger)


# ----------------------------------------------------------------------------- the command line

@pytest.fixture(scope="module")
def folder(registered, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    save(random_model(0, np.float32), path)
    return path


def test_cli_generate_loads_the_familys_folder(folder, capsys):
    from refimpl.__main__ import main

    model = refimpl.load(folder)
    assert isinstance(model, TinyModel) and model.params.dtype == np.float32
    want = _greedy_by_hand(model, PROMPT, 5)
    assert main(["generate", "--model", str(folder), "--ids", *map(str, PROMPT), "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in want]


def test_cli_compare_and_inspect_take_the_familys_folder(folder, tmp_path, capsys):
    from refimpl.__main__ import main

    ref = tmp_path / "ref.npz"
    assert main(["compare", "--model", str(folder), "--ids", "1", "5", "9", "--write-reference", str(ref)]) == 0
    assert main(["compare", "--model", str(folder), "--theirs", str(ref)]) == 0
    out = capsys.readouterr().out
    assert "blocks.2.resid_post" in out
    assert main(["inspect", "lens", "--model", str(folder), "--ids", "1", "5", "9", "--out", str(tmp_path)]) == 0
    last = [line for line in capsys.readouterr().out.splitlines() if line.startswith("after block 2")]
    want = np.argmax(logits(refimpl.load(folder), [1, 5, 9]), axis=-1)  # the lens after the last block: the logits
    assert len(last) == 1 and last[0].split()[3:] == [f"'{t}'" for t in want], last


def test_cli_generate_names_a_backend_the_family_lacks(folder, capsys):
    """--backend numba: the family's own refusal (its get_ops), and no note of compiling kernels it has none of."""
    from refimpl.__main__ import main

    assert main(["generate", "--model", str(folder), "--ids", "1", "2", "--backend", "numba"]) != 0
    err = capsys.readouterr().err
    assert "runs on the numpy backend only; got 'numba'" in err and "compil" not in err, err
