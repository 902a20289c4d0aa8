"""GGUF models (llama.cpp's format) read by refimpl.llama.gguf: parity with transformers, the converter's conventions.

Oracles: transformers' AutoModelForCausalLM.from_pretrained(folder, gguf_file=name), which reads
and dequantizes with the gguf package (refimpl reads with refimpl.gguf and refimpl.quant), for
SmolLM2-135M-Instruct Q4_1 (scripts/fetch_data.py smollm2-135m-instruct) and for random small
models of each architecture written here as llama.cpp's converter writes them (F32 tensors, the
q / k rows of `llama` permuted, Gemma's norms stored as 1 + w). transformers reads no `gemma`
(Gemma 1) GGUF: that case is compared with the Hugging Face model the file was written from.
Differences are max|ours - ref| / max|ref| over all logits (run with -s, or -v for the table).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Hugging Face oracle needs torch")
transformers = pytest.importorskip("transformers", reason="the Hugging Face oracle needs transformers")
gguf = pytest.importorskip("gguf", reason="transformers reads GGUF files with the gguf package")

import refimpl  # noqa: E402
import refimpl.decoding  # noqa: E402
import refimpl.models  # noqa: E402
from refimpl.checkpoint import WeightFileError  # noqa: E402
from refimpl.llama.gguf import gguf_names, half_split_rows, interleaved_rows, load_gguf  # noqa: E402
from refimpl.llama.model import forward  # noqa: E402
from refimpl.positional import apply_rope  # noqa: E402
from refimpl.models import family_of, resolve_model  # noqa: E402
from llama_oracle import FLOAT32_STEPS, float64_throughout, hf_logits, max_rel_diff  # noqa: E402
from real_files import readers_shared  # noqa: E402
from report import MaxDiffs  # noqa: E402
from test_llama_config import assert_agrees  # noqa: E402

DIFFS = MaxDiffs("GGUF models: max rel diff = max|ours - ref| / max|ref| (vs transformers' GGUF loading)")

# SmolLM2-135M-Instruct prompts as token ids (its tokenizer, through transformers' GGUF reading):
TEXTS = {"capital": "The capital of France is", "code": "def fibonacci(n):\n",
         "story": "Once upon a time, there was a little"}
PROMPTS = {
    "capital": [504, 3575, 282, 4649, 314],
    "code": [1604, 3987, 46477, 24, 94, 727, 198],
    "story": [6403, 1980, 253, 655, 28, 665, 436, 253, 1838],
    "chat": [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
             8182, 2, 198, 1, 4093, 198, 1780, 314, 9354, 47, 2, 198, 1, 520, 9531, 198],  # its chat template,
}                                                                     # user "What is gravity?", generation prompt


def hf_from_gguf(path):
    """transformers' model of a GGUF file (float32, eager attention, eval mode), built as from_pretrained(folder,
    gguf_file=name) builds it for these architectures: the config from the metadata (AutoConfig), then the tensors
    of load_gguf_checkpoint (its GGUF -> Hugging Face names and conventions, dequantized by the gguf package).
    (from_pretrained itself also asks for accelerate, to place the weights; that adds nothing to the arithmetic.)"""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with readers_shared():  # the config's and the tensors' GGUFReader: for a real file one, shared with other tests
        config = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                              dtype=torch.float32)
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if config.tie_word_embeddings else set()), (
        missing, unexpected)
    return model.eval()


# ----------------------------------------------------------------------------- SmolLM2-135M-Instruct Q4_1

@pytest.fixture(scope="module")
def smol(smollm2_f32):
    """(path, ours float32 through the front door (conftest's, shared), transformers' model of the same file)."""
    path = resolve_model("smollm2-135m-instruct")
    return path, smollm2_f32, hf_from_gguf(path)


def test_smollm2_is_read_by_the_front_door(smol):
    path, ours, hf = smol
    assert family_of(path) == family_of(path.parent) == family_of("smollm2-135m-instruct") == "llama"
    assert ours.params.dtype == np.float32 and ours.config.model_type == "llama"
    assert_agrees(ours.config, hf.config)  # field by field, as transformers builds it from the same metadata
    c = ours.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (
        30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and ours.params.lm_head is None  # no output.weight in the file


def test_smollm2_has_the_tokenizer_and_chat_template_of_its_metadata(smol):
    """The front door attaches the file's tokenizer (its ids are transformers' for these texts) and chat template."""
    path, ours, _ = smol
    assert ours.tokenizer is not None and ours.chat_template.startswith("{% for message in messages %}")
    for name, text in TEXTS.items():
        assert ours.tokenizer.encode(text) == PROMPTS[name], name
    assert refimpl.generate(ours, TEXTS["capital"], max_new_tokens=3).text.startswith(" Paris")


def test_smollm2_logits_match_transformers_float32(smol):
    """float32: within 5e-6 of transformers. (30 layers of float32 rounding: transformers' own logits lie up to
    2.6e-6 from the float64 result on these prompts and ours up to 3.6e-6, so 2e-6, the bound of the 3-layer random
    models below, is out of reach for either; the float64 test below shows the arithmetic is the same.)"""
    _, ours, hf = smol
    for name, ids in PROMPTS.items():
        z, ref = refimpl.logits(ours, np.array([ids])), hf_logits(hf, [ids])
        assert z.dtype == np.float32 and z.shape == ref.shape == (1, len(ids), 49152)
        err = max_rel_diff(z, ref)
        DIFFS.show(f"smollm2 Q4_1 float32 '{name}' vs transformers", max_rel=err, tol=5e-6)
        assert err <= 5e-6


def test_smollm2_greedy_64_tokens_equal_transformers_generate(smol):
    """The four prompts as one left-padded batch on both sides (refimpl's batch equals one prompt at a time)."""
    _, ours, hf = smol
    hf.generation_config.eos_token_id = None  # run all 64 steps, as ours with eos_token_id=None
    prompts = list(PROMPTS.values())
    width = max(map(len, prompts))
    padded = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        ref = hf.generate(padded, attention_mask=mask, max_new_tokens=64, do_sample=False, pad_token_id=2)
    got = refimpl.decoding.generate_batch(ours, prompts, max_new_tokens=64, eos_token_id=None)
    for name, g, r in zip(PROMPTS, got, ref[:, width:].tolist()):
        assert len(r) == 64 and g.ids == r, name


def test_smollm2_float64_matches_transformers_in_float64_throughout(smol, monkeypatch):
    """float64: ours equals transformers' model to 1e-12 once its float32-only steps (FLOAT32_STEPS) are lifted."""
    path, _, hf = smol
    ours = refimpl.load(path, dtype=np.float64)
    assert ours.params.dtype == np.float64
    lifted = float64_throughout(copy.deepcopy(hf), monkeypatch)
    ids = [PROMPTS["chat"]]
    err = max_rel_diff(refimpl.logits(ours, np.array(ids)), hf_logits(lifted, ids))
    DIFFS.show("smollm2 Q4_1 float64 'chat' vs transformers in float64 throughout", max_rel=err, tol=1e-12)
    assert err <= 1e-12, FLOAT32_STEPS


# ----------------------------------------------------------------------------- Gemma 3 270M Q4_K_M

# Gemma 3 270M prompts: text, and its ids through transformers' GGUF tokenizer (the BOS first).
GEMMA3_PROMPTS = {
    "capital": ("The capital of France is", [2, 818, 5279, 529, 7001, 563]),
    "story": ("Once upon a time, there was a little girl who lived in a village near the forest.",
              [2, 14946, 3324, 496, 990, 236764, 993, 691, 496, 2268, 3953, 1015, 11742, 528, 496, 9744, 3541, 506,
               6426, 236761]),
}


@pytest.fixture(scope="module")
def gemma3(gemma3_f32):
    """(path, ours float32 through the front door (conftest's, shared), transformers' model of the same file)."""
    path = resolve_model("gemma-3-270m")
    return path, gemma3_f32, hf_from_gguf(path)


def test_gemma3_270m_is_read_by_the_front_door(gemma3):
    """The config equals transformers' field by field (the rms_norm_eps both read is the file's float32
    9.99999997e-07); the layout and local RoPE llama.cpp fixes for gemma3 (not in the file) are Hugging Face's."""
    path, ours, hf = gemma3
    assert family_of(path) == family_of("gemma-3-270m") == "llama"
    c = ours.config
    assert c.model_type == "gemma3_text" and ours.params.dtype == np.float32
    assert_agrees(c, hf.config)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.vocab_size) == (18, 640, 4, 1, 256, 262144)
    assert c.rms_norm_eps == float(np.float32(1e-6)) == hf.config.rms_norm_eps
    assert [i for i, t in enumerate(c.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert (c.sliding_window, c.query_pre_attn_scalar, c.rope.rope_theta, c.rope_local.rope_theta) == (
        512, 256, 1e6, 1e4)
    assert c.tie_word_embeddings and ours.params.lm_head is None and ours.chat_template is None


def test_gemma3_norms_stored_as_one_plus_w_come_back_exactly(gemma3):
    """w = stored - 1 in float32 is exact for every norm weight of the file (equal to the float64 difference,
    and to transformers' weight), though most stored values lie outside [0.5, 2], where Sterbenz's lemma
    would promise it."""
    from refimpl.gguf import read_gguf
    from refimpl.quant import dequantize

    path, ours, hf = gemma3
    f = read_gguf(path)
    ours_state, hf_state = ours.params.to_checkpoint(ours.config), hf.state_dict()
    outside = total = 0
    for name, hf_name in gguf_names(ours.config).items():
        if name.endswith("norm.weight"):
            t = f.tensors[name]
            stored = dequantize(f.tensor_bytes(name), t.ggml_type, tuple(t.shape)).astype(np.float64)
            assert np.array_equal(ours_state[hf_name].astype(np.float64), stored - 1), name
            assert np.array_equal(hf_state[hf_name].numpy(), ours_state[hf_name]), name
            outside += int(np.count_nonzero((stored < 0.5) | (stored > 2)))
            total += stored.size
    print(f"\ngemma-3-270m: {total} norm weights, {outside} stored outside [0.5, 2], all recovered exactly")
    assert total == 18 * (4 * 640 + 2 * 256) + 640


def test_gemma3_270m_has_the_tokenizer_of_its_metadata(gemma3):
    """The file's SentencePiece-style tokenizer: a text prompt's ids (BOS first) are transformers'."""
    _, ours, _ = gemma3
    assert ours.tokenizer.vocab_size == 262144 and ours.tokenizer.bos_token == 2
    for name, (text, ids) in GEMMA3_PROMPTS.items():
        assert refimpl.generate(ours, text, max_new_tokens=0).prompt_ids == ids, name


def test_gemma3_270m_logits_match_transformers_float32(gemma3):
    """float32: within 2e-6 of transformers on these short prompts. scripts/gemma3_gguf_check.py runs both in
    float64 throughout, where they agree to 4e-15 here and to 9.5e-15 on 600 tokens (past the 512-key window);
    against that, ours float32 lies 1.2e-6 away here and transformers' 1.3e-6, and on 600 tokens 2.8e-6 and
    4.8e-6 (so float32 ours vs transformers 5.7e-6 there: beyond 2e-6 by transformers' own rounding)."""
    _, ours, hf = gemma3
    for name, (_, ids) in GEMMA3_PROMPTS.items():
        z, ref = refimpl.logits(ours, np.array([ids])), hf_logits(hf, [ids])
        assert z.dtype == np.float32 and z.shape == ref.shape == (1, len(ids), 262144)
        err = max_rel_diff(z, ref)
        DIFFS.show(f"gemma-3-270m Q4_K_M float32 '{name}' ({len(ids)} tokens) vs transformers", max_rel=err, tol=2e-6)
        assert err <= 2e-6


def test_gemma3_270m_greedy_32_tokens_equal_transformers_generate(gemma3):
    """The two prompts as one left-padded batch on both sides (refimpl's batch equals one prompt at a time)."""
    _, ours, hf = gemma3
    hf.generation_config.eos_token_id = None  # run all 32 steps, as ours with eos_token_id=None
    prompts = [ids for _, ids in GEMMA3_PROMPTS.values()]
    width = max(map(len, prompts))
    padded = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        ref = hf.generate(padded, attention_mask=mask, max_new_tokens=32, do_sample=False, pad_token_id=0)
    got = refimpl.decoding.generate_batch(ours, [text for text, _ in GEMMA3_PROMPTS.values()], max_new_tokens=32,
                                          eos_token_id=None)
    for name, g, r in zip(GEMMA3_PROMPTS, got, ref[:, width:].tolist()):
        assert len(r) == 32 and g.ids == r, name
    assert [g.prompt_ids for g in got] == prompts


# ----------------------------------------------------------------------------- convention 1: the RoPE row order

def converter_permute(w, n_heads):
    """llama.cpp's convert_hf_to_gguf.py reordering of q / k rows, in its own form:
    [n, 2, D/2, ...], axes 1, 2 swapped."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_heads, D", [(6, 8), (2, 16), (1, 64), (3, 2)])
def test_half_split_rows_inverts_the_converters_permutation(n_heads, D):
    rng = np.random.default_rng(n_heads)
    w, b = rng.standard_normal((n_heads * D, 5)), rng.standard_normal(n_heads * D)
    assert np.array_equal(interleaved_rows(w, n_heads), converter_permute(w, n_heads))
    assert np.array_equal(interleaved_rows(b, n_heads), converter_permute(b, n_heads))
    assert np.array_equal(half_split_rows(converter_permute(w, n_heads), n_heads), w)
    assert np.array_equal(converter_permute(half_split_rows(w, n_heads), n_heads), w)


def test_permuted_rows_with_interleaved_rope_give_the_same_scores():
    """q_gguf = x W_q_gguf^T rotated in adjacent pairs has the scores of q = x W_q^T rotated
    in half-split pairs (GQA)."""
    rng = np.random.default_rng(0)
    H, K, D, C, T = 4, 2, 8, 12, 7
    wq, wk, x = rng.standard_normal((H * D, C)), rng.standard_normal((K * D, C)), rng.standard_normal((T, C))
    pos = np.arange(T)

    def scores(wq, wk, interleaved):
        q = apply_rope((x @ wq.T).reshape(T, H, D).transpose(1, 0, 2), pos, interleaved=interleaved)
        k = apply_rope((x @ wk.T).reshape(T, K, D).transpose(1, 0, 2), pos, interleaved=interleaved)
        return q @ np.repeat(k, H // K, axis=0).transpose(0, 2, 1)  # [H, T, T]

    hf = scores(wq, wk, False)
    gguf_rows = scores(converter_permute(wq, H), converter_permute(wk, K), True)
    err = float(np.max(np.abs(gguf_rows - hf)) / np.max(np.abs(hf)))
    DIFFS.show("permuted rows + interleaved RoPE vs half-split (scores, float64)", max_rel=err, tol=1e-14)
    assert err <= 1e-14
    wrong = scores(converter_permute(wq, H), converter_permute(wk, K), False)  # the permuted rows read as HF's
    assert np.max(np.abs(wrong - hf)) > 0.1 * np.max(np.abs(hf))


# ----------------------------------------------------------------------------- random models of each architecture

SHAPES = dict(vocab_size=97, hidden_size=48, intermediate_size=72, num_hidden_layers=3, num_attention_heads=6,
              max_position_embeddings=256, rms_norm_eps=2.0**-17, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# rms_norm_eps is a float32 number: GGUF stores it in float32. arch -> Hugging Face config changes; head_dim, where
# transformers' GGUF reading takes its config class's default instead of the file's (qwen3: 128; gemma2's
# query_pre_attn_scalar: 256), is that default, so that both read the same model.
ARCHS = {
    "llama": dict(num_key_value_heads=2, rope_parameters=dict(rope_type="default", rope_theta=5e5)),
    "qwen2": dict(num_key_value_heads=2, rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    "qwen3": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=128),
    "gemma": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16),
    "gemma2": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                   sliding_window=6),
    "gemma3_text": dict(num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                        query_pre_attn_scalar=256, sliding_window=6),  # layer 5 full, the others windowed
    "phi3": dict(num_key_value_heads=2, sliding_window=None),
}
T = 12  # longer than gemma2's window


def hf_random(arch: str, seed: int = 0):
    """A random *ForCausalLM of ARCHS[arch],
    every parameter random (Hugging Face's init zeroes biases, sets norms to 1)."""
    config = transformers.AutoConfig.for_model(arch, **{**SHAPES, **ARCHS[arch]})
    gemma = arch in ("gemma", "gemma2", "gemma3_text")
    config.tie_word_embeddings = gemma
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if "norm" in name:
                p.copy_((0.0 if gemma else 1.0) + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(0.5 * noise / (math.sqrt(config.hidden_size) if gemma else 1.0))
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))
    return model.eval()


def write_like_llama_cpp(model, path, *, arch=None, drop=(), reshape=None, extra=None, more_tensors=None):
    """Write `model` as llama.cpp's converter would (F32): its metadata keys, GGUF tensor names, q / k rows of
    `llama` permuted, Gemma's norm weights as 1 + w. drop / reshape / extra / more_tensors spoil it for error tests."""
    c = model.config
    own_arch = {"gemma3_text": "gemma3"}.get(c.model_type, c.model_type)  # the GGUF architecture of the model
    arch = arch or own_arch
    gemma = c.model_type in ("gemma", "gemma2", "gemma3_text")
    D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters.get("full_attention", c.rope_parameters)["rope_theta"])
    w.add_rope_dimension_count(D)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_vocab_size(c.vocab_size)
    if c.model_type in ("gemma2", "gemma3_text"):
        w.add_sliding_window(c.sliding_window)
    if c.model_type == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    w.add_pad_token_id(c.pad_token_id)
    for key, value in (extra or {}).items():
        (w.add_string if isinstance(value, str) else w.add_float32 if isinstance(value, float) else w.add_uint32)(
            key, value)
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == own_arch),
                                     c.num_hidden_layers)
    tensors = {}
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        stem, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(stem) + "." + suffix
        a = t.detach().numpy().astype(np.float32)
        if c.model_type == "llama" and (".attn_q." in name or ".attn_k." in name):
            a = converter_permute(a, c.num_attention_heads if ".attn_q." in name else c.num_key_value_heads)
        if gemma and name.endswith("norm.weight"):
            a = a + np.float32(1)
        tensors[name] = a
    tensors.update(more_tensors or {})
    for name, a in tensors.items():
        if name in drop:
            continue
        w.add_tensor(name, (reshape or {}).get(name, a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """arch -> (the Hugging Face model, the GGUF file written from it); built on first use."""
    cache = {}

    def get(arch):
        if arch not in cache:
            model = hf_random(arch)
            cache[arch] = model, write_like_llama_cpp(model, tmp_path_factory.mktemp(arch) / f"{arch}.gguf")
        return cache[arch]
    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_random_model_matches_transformers(arch, written):
    """Ours from the GGUF file vs transformers' GGUF loading of it (gemma: vs the model it was written from)."""
    model, path = written(arch)
    config, params = load_gguf(path)[:2]
    ids = np.random.default_rng(1).integers(0, SHAPES["vocab_size"], (2, T))
    ours = forward(params, config, ids)
    if arch != "gemma":  # transformers reads no Gemma-1 GGUF
        hf = hf_from_gguf(path)
        assert_agrees(config, hf.config)
        err = max_rel_diff(ours, hf_logits(hf, ids))
        DIFFS.show(f"{arch} random F32 float32 vs transformers' GGUF loading", max_rel=err, tol=2e-6)
        assert err <= 2e-6
    assert_agrees(config, model.config)
    err = max_rel_diff(ours, hf_logits(model, ids))
    DIFFS.show(f"{arch} random F32 float32 vs the Hugging Face model written", max_rel=err, tol=2e-6)
    assert err <= 2e-6


# ----------------------------------------------------------------------------- errors name the file and the key

def _error(path) -> str:
    with pytest.raises(WeightFileError) as e:
        load_gguf(path)
    return str(e.value)


@pytest.mark.parametrize("spoil, names", [
    (dict(arch="mamba"), ["'mamba'", "not supported", "llama, qwen2"]),
    (dict(drop=("blk.1.ffn_up.weight",)), ["missing", "blk.1.ffn_up.weight"]),
    (dict(reshape={"blk.2.attn_k.weight": np.zeros((8, 48), np.float32)}),
     ["blk.2.attn_k.weight", "[8, 48]", "[16, 48]"]),
    (dict(more_tensors={"blk.0.attn_rot_embd.weight": np.zeros(4, np.float32)}), ["unexpected", "attn_rot_embd"]),
    (dict(more_tensors={"rope_freqs.weight": np.ones(4, np.float32)}), ["rope_freqs.weight", "not implemented"]),
    (dict(extra={"llama.attention.layer_norm_epsilon": 1e-5}), ["llama.attention.layer_norm_epsilon"]),
    (dict(extra={"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}), ["yarn", "rope.scaling"]),
    (dict(extra={"llama.attention.sliding_window": 16}), ["llama.attention.sliding_window"]),
])
def test_a_bad_file_is_one_error_naming_the_file_and_the_fault(spoil, names, written, tmp_path):
    model, _ = written("llama")
    path = write_like_llama_cpp(model, tmp_path / "bad.gguf", **spoil)
    msg = _error(path)
    assert str(path) in msg and all(n in msg for n in names), msg


def test_a_folder_of_several_gguf_files_is_an_error(written, tmp_path):
    model, _ = written("llama")
    write_like_llama_cpp(model, tmp_path / "a.gguf")
    write_like_llama_cpp(model, tmp_path / "b.gguf")
    with pytest.raises(WeightFileError, match="2 GGUF files"):
        refimpl.load(tmp_path)


# ----------------------------------------------------------------------------- metadata rules, the command line

def _metadata(arch, **keys):
    base = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 96, "attention.head_count": 4,
            "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-6, "context_length": 128}
    return {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in {**base, **keys}.items()}}


def test_metadata_rules_that_transformers_does_not_read():
    """llama.cpp's readings where transformers keeps its config class's defaults: Gemma-2's query scale (head_dim;
    C / H for the 46-layer 27B), linear RoPE scaling, Phi-3's partial rotation."""
    from refimpl.llama.gguf import config_from_gguf

    def blocks(n):
        return {"token_embd.weight": (50, 64), **{f"blk.{i}.attn_norm.weight": (64,) for i in range(n)}}

    shapes = blocks(2)
    g2 = config_from_gguf(_metadata("gemma2", **{"attention.key_length": 32, "attention.sliding_window": 8}), shapes)
    assert g2.query_pre_attn_scalar == 32 and g2.attention_scale == 32 ** -0.5 and g2.sliding_window == 8
    assert (g2.attn_logit_softcapping, g2.final_logit_softcapping) == (50.0, 30.0)
    g27 = config_from_gguf(_metadata("gemma2", block_count=46, **{"attention.key_length": 32,
                                                                  "attention.sliding_window": 8}), blocks(46))
    assert g27.query_pre_attn_scalar == 64 // 4
    lin = config_from_gguf(_metadata("llama", **{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}), shapes)
    assert (lin.rope.rope_type, lin.rope.factor) == ("linear", 4.0)
    phi = config_from_gguf(_metadata("phi3", **{"rope.dimension_count": 8}), {**shapes, "output.weight": (50, 64)})
    assert phi.rotary_dim == 8 and phi.rope.partial_rotary_factor == 0.5 and not phi.tie_word_embeddings
    assert phi.sliding_window is None
    phi4 = config_from_gguf(_metadata("phi3", **{"attention.sliding_window": 0}), shapes)  # Phi-4: no window
    assert phi4.sliding_window is None and set(phi4.layer_types) == {"full_attention"}
    assert config_from_gguf(_metadata("phi3", **{"attention.sliding_window": 9}), shapes).window(1) == 9
    with pytest.raises(WeightFileError, match="rope.dimension_count=8"):
        config_from_gguf(_metadata("qwen2", **{"rope.dimension_count": 8}), shapes, "x.gguf")
    with pytest.raises(WeightFileError, match=r"x.gguf: llama.block_count=1000000000 but the tensors' blocks are "
                                              r"blk.0 .. blk.1 \(2 blocks\)"):  # checked before O(L) work
        config_from_gguf(_metadata("llama", block_count=10**9), shapes, "x.gguf")
    with pytest.raises(WeightFileError, match="x.gguf.*context_length"):
        config_from_gguf({k: v for k, v in _metadata("qwen3").items() if "context" not in k}, shapes, "x.gguf")


def test_gemma3_metadata_rules_of_llama_cpp():
    """gemma3: llama.cpp's fixed 5:1 layout and local RoPE (theta 1e4, unscaled: rope.scaling.* is the full
    layers'), the query scale head_dim or, for the 62-layer 27B, C / H; a missing or zero window and the keys
    this code does not read are errors naming them."""
    from refimpl.llama.gguf import config_from_gguf

    def blocks(n):
        return {"token_embd.weight": (50, 64), **{f"blk.{i}.attn_norm.weight": (64,) for i in range(n)}}

    keys = {"attention.key_length": 32, "attention.sliding_window": 8}
    g = config_from_gguf(_metadata("gemma3", block_count=12, **keys, **{"rope.scaling.type": "linear",
                                                                         "rope.scaling.factor": 8.0}), blocks(12))
    assert g.model_type == "gemma3_text" and g.query_pre_attn_scalar == 32 and g.window(0) == 8
    assert [i for i, t in enumerate(g.layer_types) if t == "full_attention"] == [5, 11] and g.window(5) is None
    assert (g.rope.rope_type, g.rope.factor, g.rope.rope_theta) == ("linear", 8.0, 10000.0)
    assert (g.rope_local.rope_type, g.rope_local.rope_theta) == ("default", 10000.0) and g.rope_of(0) == g.rope_local
    assert config_from_gguf(_metadata("gemma3", block_count=62, **keys), blocks(62)).query_pre_attn_scalar == 64 // 4
    for spoil, message in (({"attention.sliding_window": None}, "no gemma3.attention.sliding_window"),
                           ({"attention.sliding_window": 0}, "sliding_window=0"),
                           ({"final_logit_softcapping": 30.0}, "soft-capping"),
                           ({"attention.sliding_window_pattern": 6}, "sliding_window_pattern.*not implemented")):
        metadata = {k: v for k, v in _metadata("gemma3", **{**keys, **spoil}).items() if v is not None}
        with pytest.raises(WeightFileError, match="x.gguf: .*" + message):
            config_from_gguf(metadata, blocks(2), "x.gguf")


def test_the_command_lines_thread_rule_reads_a_gguf_models_width_from_its_config(written, smol):
    """The one-BLAS-thread rule of `python -m refimpl` (refimpl._threads) takes a GGUF model's width from its
    loaded config, as any other's: narrower than SMALL_MODEL_WIDTH for the random model, wider for SmolLM2."""
    from refimpl.__main__ import blas_threads_for
    from refimpl._threads import SMALL_MODEL_WIDTH, width_of

    _, small = written("llama")
    assert blas_threads_for(["generate", "--model", str(small)], {}) is None  # decided after the load
    assert width_of(load_gguf(small)[0]) == 48 < SMALL_MODEL_WIDTH <= width_of(smol[1].config) == 576


def test_a_fetched_models_name_runs_the_fetch_script_when_its_file_is_missing(tmp_path, monkeypatch):
    """resolve_model("smollm2-135m-instruct"): the file under REFIMPL_DATA_DIR, fetched by scripts/fetch_data.py when
    missing; without the script (an installed package), a one-line error saying the command."""
    import subprocess

    import refimpl.models as models

    monkeypatch.setenv("REFIMPL_DATA_DIR", str(tmp_path / "data"))
    target = tmp_path / "data" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ran = []

    def fake_run(argv, check):
        ran.append(argv)
        target.parent.mkdir(parents=True)
        target.write_bytes(b"GGUF")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert resolve_model("smollm2-135m-instruct") == target
    assert ran[0][1:] == [str(models._REPO / "scripts" / "fetch_data.py"), "smollm2-135m-instruct"]
    assert resolve_model("smollm2-135m-instruct") == target and len(ran) == 1  # present: not fetched again
    monkeypatch.setattr(models, "_REPO", tmp_path / "installed")
    with pytest.raises(WeightFileError, match=r"'gemma-3-270m' is not downloaded.*python scripts/fetch_data.py "
                                              r"gemma-3-270m"):
        resolve_model("gemma-3-270m")


def test_export_writes_a_gguf_model_as_a_hugging_face_folder(written, tmp_path):
    """export (GGUF -> config.json + model.safetensors, float32):
    Hugging Face's from_pretrained reads the model written."""
    from refimpl.llama import load_weights

    model, path = written("llama")
    out = refimpl.models.export(path, tmp_path / "out")
    config, params = load_weights(out)
    assert config == load_gguf(path)[0]
    ids = np.random.default_rng(2).integers(0, SHAPES["vocab_size"], (1, T))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert np.array_equal(hf_logits(hf, ids), hf_logits(model, ids))  # the same float32 weights, bit for bit
    with pytest.raises(WeightFileError, match="bfloat16"):
        refimpl.models.export(path, tmp_path / "bf16", dtype="bfloat16")


def test_f64_and_f16_tensors_are_read_exactly(written, tmp_path):
    """An F64 file loads bit for bit in float64; an F16 one to the F16 values, which every loader sees."""
    model, _ = written("qwen2")
    f32 = load_gguf(write_like_llama_cpp(model, tmp_path / "f32.gguf"))[1]
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, 3)
    f64 = {names.get_name(k.rsplit(".", 1)[0]) + "." + k.rsplit(".", 1)[1]: v.astype(np.float64) * (1 + 2.0 ** -40)
           for k, v in sd.items()}  # values float32 does not hold
    p = write_like_llama_cpp(model, tmp_path / "f64.gguf", reshape=f64)
    _, params, _ = load_gguf(p, dtype=np.float64)
    assert np.array_equal(params.blocks[1].attn.q.b, f64["blk.1.attn_q.bias"])
    assert np.array_equal(params.embed, f64["token_embd.weight"])
    p16 = write_like_llama_cpp(model, tmp_path / "f16.gguf", reshape={k: v.astype(np.float16) for k, v in f64.items()})
    _, h, _ = load_gguf(p16)
    assert h.embed.dtype == np.float32 and np.array_equal(h.embed, f64["token_embd.weight"].astype(np.float16))
    assert not np.array_equal(h.embed, f32.embed)
