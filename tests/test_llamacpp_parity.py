"""refimpl against llama.cpp itself on the two real GGUF files: tokenizations and logits.

The oracle is llama.cpp (llama-cpp-python 0.3.36, built from source), run once by
scripts/make_llamacpp_fixtures.py; its outputs are committed (tests/data/llamacpp_tokens.json,
tests/data/llamacpp_logits.json), so these tests need neither llama.cpp nor its build.

Tokens: for every text of the fixture's corpus (stored in it) and both files (SmolLM2: byte-level
BPE, pre-tokenizer "smollm"; Gemma 3: SentencePiece-style BPE, tokenizer.ggml.model "llama"),
refimpl.tokenizers.gguf.tokenizer_from_gguf's ids (with the BOS in front where the file asks for
one, as llama_tokenize(add_special=True) puts it) equal llama_tokenize's, and decode_bytes of
those ids equals llama_detokenize's bytes.

Logits: SmolLM2 Q4_1, refimpl's float32 forward on the dequantized weights (refimpl.load) against
llama.cpp's logits of the same ids (CPU backend, 2 threads). They differ by design: ggml's CPU dot
products for quantized weights first round the activation vector to 8-bit blocks (Q8_1 for Q4_1
weights, Q8_0 for the Q8_0 embedding / LM head), then multiply integers. The test's tolerance
comes from that error (test_smollm2_logits_agree_with_llama_cpp_within_its_activation_rounding).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from real_files import real_gguf
from report import MaxDiffs

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("REFIMPL_DATA_DIR") or ROOT / ".cache")
REAL_FILES = {  # fixture key -> (scripts/fetch_data.py name, path)
    "smollm2": ("smollm2-135m-instruct", DATA / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": ("gemma-3-270m", DATA / "gemma-3-270m" / "gemma-3-270m-q4_k_m.gguf"),
}
TOKENS = ROOT / "tests" / "data" / "llamacpp_tokens.json"
LOGITS = ROOT / "tests" / "data" / "llamacpp_logits.json"
DIFFS = MaxDiffs("refimpl vs llama.cpp (llama-cpp-python 0.3.36), SmolLM2-135M-Instruct Q4_1 logits")


def real_file(key: str) -> Path:
    return real_gguf(REAL_FILES[key][0])


@pytest.fixture(scope="module")
def tokens_fixture() -> dict:
    return json.loads(TOKENS.read_text())


# ---- tokens ---------------------------------------------------------------------------------------


# llama.cpp's vocabulary loader (src/llama-vocab.cpp, llama_vocab::impl::load) retypes some tokens by
# their spelling, whatever the file says: each of these end-of-generation markers becomes a control
# token (it logs "control-looking token ... was not control-type; this is probably a bug in the
# model"), so that llama_tokenize(parse_special=False) no longer matches it in text. Gemma 3's file
# types "</s>" (id 212) user-defined, which refimpl (as the file says) matches in any text.
LLAMA_CPP_CONTROL_BY_NAME = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>")
_CONTROL, _USER_DEFINED = 3, 4


def as_llama_cpp_types_them(metadata: dict) -> tuple[dict, list[str]]:
    """The metadata with the tokens llama.cpp retypes (LLAMA_CPP_CONTROL_BY_NAME, user-defined in the file)
    typed control, and those tokens' spellings."""
    tokens = metadata["tokenizer.ggml.tokens"]
    types = np.array(metadata["tokenizer.ggml.token_type"], dtype=np.int64)
    index = {t: i for i, t in enumerate(tokens)}
    retyped = [t for t in LLAMA_CPP_CONTROL_BY_NAME if t in index and types[index[t]] == _USER_DEFINED]
    types[[index[t] for t in retyped]] = _CONTROL
    return {**metadata, "tokenizer.ggml.token_type": types}, retyped


def compare_tokens(tok, fx: dict, texts: list[str], allowed=()) -> tuple[list[str], list[str]]:
    """(texts whose ids differ from llama.cpp's, each with the first differing pieces; texts whose decode differs).
    allowed: the special tokens matched in text (encode's allowed_special)."""
    id_diffs, byte_diffs = [], []
    for text, theirs, hexed in zip(texts, fx["ids"], fx["decoded_hex"], strict=True):
        ours = ([tok.bos_token] if fx["add_bos"] else []) + tok.encode(text, allowed_special=allowed)
        if ours != theirs:
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            id_diffs.append(f"{text!r:.50}: from token {first}, ours {tok.pieces(ours[first:first + 4])} "
                            f"llama.cpp {tok.pieces(theirs[first:first + 4])}")
        body = theirs[1:] if fx["add_bos"] else theirs
        if tok.decode_bytes(body) != bytes.fromhex(hexed):
            byte_diffs.append(f"{text!r:.50}: ours {tok.decode_bytes(body)!r:.80} llama.cpp "
                              f"{bytes.fromhex(hexed)!r:.80}")
    return id_diffs, byte_diffs


@pytest.mark.parametrize("key", list(REAL_FILES))
def test_gguf_tokenizer_gives_llama_cpps_ids_and_bytes(key, tokens_fixture):
    """Every text's ids and decoded bytes equal llama.cpp's once its retyping by name is applied; without it,
    only the texts holding a retyped token's spelling differ (Gemma 3: the one holding "</s>")."""
    from refimpl.gguf import read_gguf
    from refimpl.tokenizers.gguf import tokenizer_from_gguf

    path = real_file(key)
    fx = tokens_fixture["models"][key]
    assert fx["file"] == path.name
    metadata = read_gguf(path).metadata
    as_llama_cpp, retyped = as_llama_cpp_types_them(metadata)
    tok = tokenizer_from_gguf(as_llama_cpp, str(path))
    assert (tok.bos_token is not None) == fx["add_bos"]
    if fx["add_bos"]:
        assert tok.bos_token == fx["bos"]
    texts = tokens_fixture["texts"]
    id_diffs, byte_diffs = compare_tokens(tok, fx, texts)
    as_filed, _ = compare_tokens(tok, fx, texts, allowed=retyped)  # matched in text: as the file types them
    n_ids = sum(map(len, fx["ids"]))
    print(f"{key} ({fx['model']}, pre {fx['pre']}): {len(texts)} texts, {n_ids} ids; {len(id_diffs)} texts' ids "
          f"differ, {len(byte_diffs)} decodes differ; with the file's own token types {len(as_filed)} differ "
          f"(llama.cpp retypes {retyped} to control)")
    for line in as_filed:
        print("  as filed:", line)
    assert not id_diffs, "\n".join(id_diffs)
    assert not byte_diffs, "\n".join(byte_diffs)
    assert len(as_filed) == sum(any(r in t for r in retyped) for t in texts), as_filed


def test_the_corpus_covers_what_it_says():
    """The stored corpus holds each kind of text the fixture script promises (and no lone surrogates)."""
    texts = json.loads(TOKENS.read_text())["texts"]
    joined = "".join(texts)
    kinds = {"CJK": "\u4e00-\u9fff", "Arabic": "\u0600-\u06ff", "combining marks": "\u0300-\u036f",
             "emoji": "\U0001F300-\U0001FAFF", "controls": "\x00-\x08\x0b\x0c\x0e-\x1f\x7f", "digits": "0-9",
             "Devanagari": "\u0900-\u097f", "Hangul": "\uac00-\ud7a3"}
    import re

    for kind, chars in kinds.items():
        assert re.search(f"[{chars}]", joined), kind
    assert "      " in joined and "\t\t" in joined and "\n\n" in joined and "" in texts
    assert len(texts) >= 150 and all(t.encode("utf-8", "strict") is not None for t in texts)


# ---- logits ---------------------------------------------------------------------------------------


def ggml_activation_rounding(x: np.ndarray) -> np.ndarray:  # float32 [..., n] -> [..., n], n a multiple of 32
    """x as ggml's CPU products see it: in blocks of 32, q = roundf(x / d) with d = max|x| / 127, then d
    stored as f16 (Q8_0, refimpl.quant's twin of quantize_row_q8_0_ref, and its dequantization).
    Q8_1, which Q4_1 weights take, has the same d and q (plus a stored block sum, d * sum q in f16)."""
    from refimpl.quant import dequantize, quantize

    x = np.ascontiguousarray(x, dtype=np.float32)
    return dequantize(quantize(x, "Q8_0"), "Q8_0", x.shape)


def rounded_ops():
    """The reference backend with every product's activation input rounded as ggml rounds it
    (ggml_activation_rounding): q, k, v, o, gate, up, down and the LM head; the weights stay exact."""
    import dataclasses

    from refimpl.llama.model import NUMPY_OPS, lm_head

    r = ggml_activation_rounding
    return dataclasses.replace(NUMPY_OPS, name="numpy, activations rounded to 8 bits",
                               linear=lambda x, p: NUMPY_OPS.linear(r(x), p),
                               glu_hidden=lambda h, p, act: NUMPY_OPS.glu_hidden(r(h), p, act),
                               lm_head=lambda h, params, config: lm_head(r(h), params, config))


def sampled(z: np.ndarray, prompt: dict, random_ids: np.ndarray) -> np.ndarray:  # [T, V] -> [T, 32 + 128]
    """The logits the fixture keeps per position: at llama.cpp's top-32 ids, then at the fixed random ids."""
    return np.concatenate([np.take_along_axis(z, np.array(prompt["top_ids"]), 1), z[:, random_ids]], axis=1)


def centered_rms(d: np.ndarray) -> float:  # [T, n] -> RMS of each row's differences less their mean
    """Logits matter only up to a constant per position (softmax is shift-invariant): the RMS of the
    differences after each position's mean difference is taken out."""
    d = np.asarray(d, np.float64)
    return float(np.sqrt(np.mean((d - d.mean(axis=1, keepdims=True)) ** 2)))


@pytest.fixture(scope="module")
def smollm2_logits(smollm2_f32):
    """(model, fixture, {prompt: (exact, rounded)} logits [T, V]) for the three prompts."""
    from refimpl.llama.model import logits

    path = real_file("smollm2")
    fx = json.loads(LOGITS.read_text())["smollm2"]
    assert fx["file"] == path.name
    model = smollm2_f32  # refimpl.load of the file: float32, the dequantized weights (conftest.py, shared)
    assert model.config.model_type == "llama" and model.params.dtype == np.float32
    ops = rounded_ops()
    out = {}
    for p in fx["prompts"]:
        ids = np.array(p["ids"])
        out[p["text"]] = (logits(model, ids), logits(model, ids, backend=ops))
    return model, fx, out


def test_smollm2_logits_agree_with_llama_cpp_within_its_activation_rounding(smollm2_logits):
    """refimpl's exact float32 logits against llama.cpp's, with a tolerance from ggml's arithmetic.

    ggml's CPU products with Q4_1 / Q8_0 weights (ggml_vec_dot_q4_1_q8_1, _q8_0_q8_0) first round the
    activation vector to 8 bits per block of 32: each value moves by up to d / 2 = max|block| / 254, an
    error of standard deviation max|block| / (127 sqrt 12) ~ max|block| / 440: ~0.6% of a Gaussian
    block's RMS (max ~ 2.5 RMS), but up to sqrt(32) / 440 ~ 1.3% where one outlier carries the block,
    as in SmolLM2's activations (measured block max / RMS: up to 5.66 = sqrt 32). 210 products over 30
    layers feed that noise into the residual stream, and the logits (spread ~3-4 per position) move by
    ~0.13 RMS, ~1 at worst: orders above float32's ~1e-5. Rather than trust that estimate's constant, the
    test measures it: the same forward with the activations rounded exactly as ggml rounds them
    (rounded_ops) moves the exact logits by g8 (centered RMS, per prompt); llama.cpp must lie within 2 g8
    of the exact logits (measured: llama.cpp / g8 = 0.96-1.02: it is that rounding, with its own
    summation order), and its largest difference within twice rounding's largest. The greedy argmax must agree wherever
    llama.cpp's top-2 margin exceeds twice the largest difference rounding made. A real bug sits far outside: the wrong
    q/k pairing (the next test) gives ~1.9, 13x g8.
    """
    _, fx, out = smollm2_logits
    random_ids = np.array(fx["random_ids"])
    agree = positions = 0
    for p in fx["prompts"]:
        exact, rounded = out[p["text"]]
        theirs = np.concatenate([np.array(p["top_logits"], np.float32), np.array(p["random_logits"], np.float32)], 1)
        ours = sampled(exact, p, random_ids)
        g_cpp, g8 = centered_rms(ours - theirs), centered_rms(sampled(rounded, p, random_ids) - ours)
        max8 = float(np.abs(sampled(rounded, p, random_ids) - ours).max())
        tag = f"{len(p['ids'])} tokens {p['text'][:24]!r}"
        DIFFS.show(f"exact vs llama.cpp, {tag} (rel: to the largest |logit|)",
                   max_abs=float(np.abs(ours - theirs).max()),
                   max_rel=float(np.abs(ours - theirs).max() / np.abs(theirs).max()), tol=f"2 x {max8:.3f}")
        DIFFS.show(f"exact vs llama.cpp, centered RMS, {tag}", max_abs=g_cpp, tol=f"2 x {g8:.3f}")
        DIFFS.show(f"exact vs 8-bit activations, {tag}", max_abs=max8)
        assert 0 < g8 < 0.5 and g_cpp <= 2 * g8, (g_cpp, g8)
        assert np.abs(ours - theirs).max() <= 2 * max8, (np.abs(ours - theirs).max(), max8)
        top = np.array(p["top_logits"])
        margin = top[:, 0] - top[:, 1]
        same = exact.argmax(axis=1) == np.array(p["argmax"])
        assert np.array(p["argmax"]).tolist() == np.array(p["top_ids"])[:, 0].tolist()
        assert same[margin > 2 * max8].all(), (same, margin)
        agree += int(same.sum())
        positions += len(same)
        print(f"  {tag}: greedy argmax agrees at {int(same.sum())}/{len(same)} positions; llama.cpp's top-2 "
              f"margins {np.round(margin, 2).tolist()}")
    print(f"greedy argmax agrees at {agree}/{positions} positions")


def test_a_wrong_qk_pairing_is_far_outside_the_tolerance(smollm2_logits):
    """The comparison has the power to fail: the rotary pairs taken the other way (what a q/k row permutation
    left undone or done twice amounts to) moves the logits ~13x further from llama.cpp's than the tolerance's g8."""
    import dataclasses

    from refimpl.llama.model import LlamaModel, logits

    model, fx, out = smollm2_logits
    wrong = LlamaModel(dataclasses.replace(model.config, rope_interleaved=not model.config.rope_interleaved),
                       model.params)
    random_ids = np.array(fx["random_ids"])
    for p in fx["prompts"][:2]:
        exact, rounded = out[p["text"]]
        theirs = np.concatenate([np.array(p["top_logits"], np.float32), np.array(p["random_logits"], np.float32)], 1)
        g8 = centered_rms(sampled(rounded, p, random_ids) - sampled(exact, p, random_ids))
        g_bug = centered_rms(sampled(logits(wrong, np.array(p["ids"])), p, random_ids) - theirs)
        print(f"wrong q/k pairing, {len(p['ids'])} tokens: centered RMS vs llama.cpp {g_bug:.3f}, "
              f"{g_bug / g8:.1f}x g8 ({g8:.3f})")
        assert g_bug > 4 * g8


# ---- the speed benchmark's llama.cpp worker (benchmarks/llamacpp.py), on a stand-in llama_cpp ----------------

FAKE_LLAMA_CPP = '''
import ctypes
__version__ = "stand-in"
def llama_print_system_info():
    return b"CPU : STAND-IN = 1 | "
class Llama:  # next token's logits: one-hot at (last id fed + 3) mod 7
    def __init__(self, model_path, n_ctx, n_batch, n_threads, n_threads_batch, logits_all, verbose):
        if model_path.endswith("missing.gguf"):
            raise ValueError(f"Failed to load model from file: {model_path}")
        self.buf = (ctypes.c_float * 7)()
        self.ctx = self
    def n_vocab(self):
        return 7
    def reset(self):
        pass
    def eval(self, tokens):
        for i in range(7):
            self.buf[i] = 0.0
        self.buf[(tokens[-1] + 3) % 7] = 1.0
def llama_get_logits_ith(ctx, i):
    return ctypes.cast(ctx.buf, ctypes.POINTER(ctypes.c_float))
'''


def test_the_benchmarks_llama_cpp_worker_decodes_greedily_and_reports_errors(tmp_path, monkeypatch):
    """The worker's loop (prompt, then argmax fed back one token at a time) and its protocol, on a stand-in
    llama_cpp module: the tokens are the argmax chain, a failure is an error naming the request."""
    import sys

    from benchmarks.llamacpp import LlamaCppWorker

    (tmp_path / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    worker = LlamaCppWorker(sys.executable)
    try:
        assert worker.ask("about") == {"llama_cpp_python": "stand-in", "system_info": "CPU : STAND-IN = 1 |"}
        assert worker.ask("load", name="m", path="x.gguf", threads=2, n_ctx=64) == {"n_vocab": 7}
        assert worker.ask("decode", name="m", prompt=[1, 2], new=4) == {"tokens": [5, 1, 4, 0]}
        assert worker.ask("prefill", name="m", ids=[0, 6]) == {"argmax": 2}
        with pytest.raises(RuntimeError, match="'load'.*missing.gguf"):
            worker.ask("load", name="n", path="missing.gguf", threads=1, n_ctx=64)
        with pytest.raises(RuntimeError, match="'decode'.*KeyError"):
            worker.ask("decode", name="never loaded", prompt=[1], new=1)
    finally:
        worker.close()
    assert worker.proc.returncode == 0


def test_the_benchmarks_bytes_per_token_count_quantized_matrices_as_their_blocks(tmp_path):
    """benchmarks.llamacpp.read_bytes, the bound's numerator: weights kept quantized read the file's tensor bytes
    (the tied embedding once, as the LM head); the same file dequantized reads 4 bytes a parameter, the head once."""
    from benchmarks.llamacpp import file_tensor_bytes, read_bytes
    from llama_random import random_llama
    from refimpl.llama.config import LlamaConfig
    from refimpl.llama.gguf import load_gguf_model
    from refimpl.llama.gguf_write import save_gguf

    config = LlamaConfig.from_dict(dict(model_type="llama", vocab_size=97, hidden_size=128, intermediate_size=96,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, rms_norm_eps=1e-5,
                                        tie_word_embeddings=True))  # tied, as both real files are
    path = save_gguf(random_llama(config, seed=1, dtype=np.float32), tmp_path / "m.gguf", type="Q4_1").path
    quantized, dense = load_gguf_model(path, weights="quantized"), load_gguf_model(path)
    n = 97 * 128 + 128 + 2 * (2 * 128 + 128 * 128 * 2 + 2 * 128 * 64 + 3 * 128 * 96)
    print(f"bytes/token: quantized {read_bytes(quantized.params)}, file {file_tensor_bytes(path)}, "
          f"float32 {read_bytes(dense.params)} = 4 x {n}")
    assert read_bytes(quantized.params) == file_tensor_bytes(path)
    assert read_bytes(dense.params) == 4 * n
