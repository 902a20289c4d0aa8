"""Make tests/data/llamacpp_tokens.json and tests/data/llamacpp_logits.json: llama.cpp's own
tokenizations and logits of the two real GGUF files, for tests/test_llamacpp_parity.py.

    /path/to/llamacpp-venv/bin/python scripts/make_llamacpp_fixtures.py [--smollm2 PATH] [--gemma3 PATH]

Runs where llama-cpp-python is installed (keep it in its own virtual environment: it is built from
source and is no test dependency); it needs only llama_cpp, NumPy and the standard library. The
files default to the ones scripts/fetch_data.py puts under .cache/.

Tokens (both files, each loaded with vocab_only=True): a fixed corpus of ~170 texts (English
prose, code, CJK, Arabic, Devanagari, combining marks, emoji and ZWJ sequences, runs of spaces,
tabs and newlines, digits, control characters, punctuation, text that looks like special tokens)
built here from a seeded generator and stored in the fixture, so the test reads it and never
rebuilds it. For each text and file:

    ids   = llama_tokenize(vocab, utf8, add_special=True, parse_special=False)
            (add_special puts the BOS in front only where the file's add_bos_token says so)
    bytes = llama_detokenize(vocab, ids without that BOS, remove_special=False, unparse_special=False)
            stored as hex (a decode need not be valid UTF-8)

Logits (SmolLM2 only): three prompts of 8 to 16 token ids evaluated in one batch with logits at every
position (logits_all=True, n_threads=2, n_ctx=64). The full [T, 49152] rows are not kept: per position
the 32 largest logits with their ids, the logits of 128 fixed random ids (the same ids at every
position), the log-sum-exp of the whole row and its argmax, as float32 values.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKENS_OUT = ROOT / "tests" / "data" / "llamacpp_tokens.json"
LOGITS_OUT = ROOT / "tests" / "data" / "llamacpp_logits.json"
SMOLLM2 = ROOT / ".cache" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = ROOT / ".cache" / "gemma-3-270m" / "gemma-3-270m-q4_k_m.gguf"

# Hand-written texts: each a case a tokenizer gets wrong in its own way.
FIXED = [
    "", " ", "  ", "\n", "\n\n", "\t", " \n ", "a", " a", "a ", "Hello", " Hello", "Hello world", "hello  world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "It's, I'm, you're, they've, we'll, he'd, IT'S, I'M, Don't, can't",
    "Mr. O'Neil's cat (aged 3½) said: \"Meow\" — and left…",
    "e-mail: someone@example.com, https://example.org/path?q=1&r=2#frag",
    "0 1 12 123 1234 12345 123456 1234567 3.14159 -42 1e-10 0x1F 1,000,000 007",
    "2026-12-07T19:23:27Z",
    "    indented\n\tTabbed\n\n\n  two spaces\r\nCRLF\rCR",
    "                                                                 (65 spaces before)",
    "tabs\t\t\t\tand\t \t spaces",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\nprint(f(3))\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; }",
    "SELECT name, COUNT(*) FROM t WHERE x <> 'y' GROUP BY name;",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "$ ls -la | grep '^d' && echo \"done\" >> /tmp/log.txt",
    "你好，世界！今天天气很好。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다.",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "नमस्ते दुनिया",
    "Привет, мир! Ёжик в тумане.",
    "Γειά σου Κόσμε",
    "ไทย ภาษา",
    "e\u0301 a\u0300 n\u0303 o\u0308 (combining) vs é à ñ ö (precomposed)",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dalgo",
    "\U0001F600\U0001F601 \U0001F44D\U0001F3FD \U0001F1FA\U0001F1F8 \U0001F468\u200D\U0001F469\u200D\U0001F467",
    "\u2764\ufe0f \u263a \U0001F9D1\u200D\U0001F4BB",
    "ﬁ ﬂ ① ² ½ Ⅻ ＡＢＣ ｶﾀｶﾅ",  # compatibility characters (no normalization should touch them)
    "\u200b\u200c\u200d\ufeff zero width",
    "\x00\x01\x02\x03\x07\x08\x0b\x0c\x1b\x1f\x7f",
    "a\x00b", "line\u2028sep\u2029para\x85nel",
    "\u00a0nbsp\u3000ideographic space\u2003em",
    "<s></s><|endoftext|><|im_start|>user<|im_end|><bos><eos><start_of_turn><end_of_turn><pad><unk>",
    "<0x41><0xFF> <mask>[INST] [/INST]",
    "!!!???...,,,;;;:::---___===+++***&&&%%%$$$###@@@",
    "'''\"\"\"```~~~^^^|||\\\\\\///",
    "ALL CAPS SENTENCE WITH NUMBERS 123ABC abc123 a1b2c3",
    "Ünïcödé façade naïve coöperate Œuvre ß ẞ İstanbul",
    "\U00010348\U0001D11E\U0001F9EC \U00020000\U0002A6D6",  # outside the BMP: Gothic, music, CJK ext. B
]

# Pieces the random texts are drawn from.
POOLS = {
    "words": "the of and to in is was for that with as on by it at from be this an which or are have had".split()
    + "model token weight tensor layer attention rotary norm gradient matrix vector quantize".split(),
    "code": ["def", "(", ")", ":", "    ", "\n", "return", "x", "=", "+=", "[", "]", "{", "}", ";", "//", "#", "->",
             "0", "1", "self", ".", ",", "\"", "'", "import", "numpy", "as", "np", "\t", "if", "else", "None"],
    "cjk": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后"
                "小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长"
                "知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最"
                "间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市"
                "眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计"
                "或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让"
                "认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办"
                "运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持"
                "取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单亲"),
    "arabic": "في من على إلى أن هذا التي الذي كان عن مع هو هي لا ما ثم كل قد".split(),
    "emoji": ["\U0001F600", "\U0001F680", "\U0001F44D\U0001F3FB", "\u2764\ufe0f", "\U0001F1EF\U0001F1F5",
              "\U0001F469\u200D\U0001F52C", "\u2728", "\U0001F525", "\U0001F914", "\u00A9", "\u2122"],
    "space": [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "      ", "\u00a0", "\u3000"],
    "digits": ["0", "7", "42", "123", "2048", "65535", "3.5", "1,024", "10^9", "000", "99999999"],
    "marks": ["\u0301", "\u0300", "\u0308", "\u0327", "\u064e", "\u093f", "\u200d", "\ufe0f", "\u0651"],
    "punct": list(".,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`…—–«»„“”‘’¿¡·•"),
    "controls": ["\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\u2028", "\x9f"],
    "latin": list("aeioubcdfghjklmnpqrstvwxyzAEIOUBCDFGHJKLMNPQRSTVWXYZéèêëàâäîïôöùûüçñßøåæœ"),
}


def corpus(seed: int = 20261207, n_random: int = 120) -> list[str]:
    """FIXED and n_random texts of 1 to 40 pieces drawn from one or several POOLS (seeded)."""
    rng = random.Random(seed)
    names = sorted(POOLS)
    texts = list(FIXED)
    for i in range(n_random):
        pools = [names[i % len(names)]] if i < 2 * len(names) else rng.sample(names, rng.randint(2, 4))
        pieces = []
        for _ in range(rng.randint(1, 40)):
            pool = POOLS[rng.choice(pools)]
            pieces.append(pool[rng.randrange(len(pool))])
            if rng.random() < 0.4:
                pieces.append(" ")
        texts.append("".join(pieces))
    return texts


def llama_module():
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llama-cpp-python is not installed here: run this with the Python of its virtual environment")
    return llama_cpp


def detokenize(llama_cpp, vocab, ids: list[int]) -> bytes:
    """llama_detokenize(ids): the bytes llama.cpp writes for them (no special tokens removed or spelled out)."""
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 64 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, False)
        if n >= 0:
            return buf.raw[:n]
        size = -n


def tokenize_all(llama_cpp, path: Path, texts: list[str]) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos = llama_cpp.llama_vocab_bos(vocab)
    ids, decoded = [], []
    for text in texts:
        t = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        ids.append(t)
        decoded.append(detokenize(llama_cpp, vocab, t[1:] if add_bos and t[:1] == [bos] else t).hex())
    return {"file": path.name, "pre": llm.metadata.get("tokenizer.ggml.pre"),
            "model": llm.metadata.get("tokenizer.ggml.model"), "add_bos": add_bos, "bos": bos,
            "n_vocab": llm.n_vocab(), "ids": ids, "decoded_hex": decoded}


LOGIT_PROMPTS = [  # texts whose SmolLM2 ids are the prompts (8 to 16 tokens each)
    "The capital of France is Paris, and the capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


def f32_list(a: np.ndarray) -> list:
    """Nested lists of the float32 values, each written with the fewest digits that read back as it."""
    return [f32_list(r) for r in a] if a.ndim > 1 else [float(str(v)) for v in a.astype(np.float32)]


def logits_of(llama_cpp, path: Path, n_top: int = 32, n_random: int = 128, seed: int = 0) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, n_threads=2,
                          n_threads_batch=2, verbose=False)
    n_vocab = llm.n_vocab()
    random_ids = np.sort(np.random.default_rng(seed).choice(n_vocab, n_random, replace=False))
    prompts = []
    for text in LOGIT_PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        if not 8 <= len(ids) <= 16:
            sys.exit(f"prompt {text!r} is {len(ids)} tokens; wanted 8 to 16")
        llm.reset()
        llm.eval(ids)
        z = np.array(llm.scores[:len(ids)], dtype=np.float32)  # [T, V]
        top = np.argsort(-z, axis=1, kind="stable")[:, :n_top]
        m = z.max(axis=1, keepdims=True).astype(np.float64)
        lse = (m[:, 0] + np.log(np.exp(z - m).sum(axis=1)))
        prompts.append({"text": text, "ids": ids, "top_ids": top.tolist(),
                        "top_logits": f32_list(np.take_along_axis(z, top, 1)),
                        "random_logits": f32_list(z[:, random_ids]), "logsumexp": f32_list(lse),
                        "argmax": z.argmax(axis=1).tolist()})
    return {"file": path.name, "n_vocab": n_vocab, "n_threads": 2, "random_ids": random_ids.tolist(),
            "prompts": prompts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", type=Path, default=SMOLLM2)
    ap.add_argument("--gemma3", type=Path, default=GEMMA3)
    args = ap.parse_args(argv)
    llama_cpp = llama_module()
    llama_cpp.llama_backend_init()
    about = {"llama_cpp_python": llama_cpp.__version__,
             "system_info": llama_cpp.llama_print_system_info().decode().strip(),
             "machine": platform.machine(), "script": "scripts/make_llamacpp_fixtures.py"}
    texts = corpus()
    tokens = {"about": about, "texts": texts,
              "models": {"smollm2": tokenize_all(llama_cpp, args.smollm2, texts),
                         "gemma3": tokenize_all(llama_cpp, args.gemma3, texts)}}
    TOKENS_OUT.write_text(json.dumps(tokens, ensure_ascii=True, separators=(",", ":")) + "\n")
    logits = {"about": about, "smollm2": logits_of(llama_cpp, args.smollm2)}
    LOGITS_OUT.write_text(json.dumps(logits, separators=(",", ":")) + "\n")
    for out in (TOKENS_OUT, LOGITS_OUT):
        print(f"{out.relative_to(ROOT)}: {out.stat().st_size / 1024:.0f} KB")
    for name, m in tokens["models"].items():
        print(f"{name}: {len(texts)} texts, {sum(map(len, m['ids']))} ids")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
