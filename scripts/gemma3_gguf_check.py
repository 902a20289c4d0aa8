"""One-off checks of Gemma 3 270M (GGUF, Q4_K_M) against transformers, too slow or too big for CI.

    PYTHONPATH=. python scripts/gemma3_gguf_check.py [n_tokens]

Prints max|ours - ref| / max|ref| over all logits, on tests/test_gguf_models.py's short prompts and on one
of n_tokens (default 600: past the 512-key window of the sliding layers): float32 ours vs transformers; ours
float64 vs transformers run in float64 throughout (its float32-only steps lifted:
tests/llama_oracle.float64_throughout); and each side's float32 logits vs that float64 reference.
Needs about 9 GB of memory.
"""

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import refimpl  # noqa: E402
from refimpl._tokens import encode_prompt  # noqa: E402
from refimpl.models import resolve_model  # noqa: E402
from llama_oracle import float64_throughout, hf_logits, max_rel_diff  # noqa: E402
from test_gguf_models import GEMMA3_PROMPTS, hf_from_gguf  # noqa: E402

TEXT = ("The history of the city begins with a small settlement on the river, where traders stopped to rest and "
        "exchange goods. Over the centuries it grew into a market town, then a centre of learning, and finally a "
        "capital whose bridges, churches and libraries drew visitors from every part of the continent. ")


def main(n_tokens: int = 600) -> None:
    path = resolve_model("gemma-3-270m")
    ours = refimpl.load(path)
    long = encode_prompt(ours.tokenizer, TEXT * 20)[:n_tokens]
    assert len(long) == n_tokens
    prompts = {**{name: ids for name, (_, ids) in GEMMA3_PROMPTS.items()}, f"{n_tokens} tokens": long}
    hf = hf_from_gguf(path)
    t = time.perf_counter()
    z32 = {name: refimpl.logits(ours, np.array([ids])) for name, ids in prompts.items()}
    print(f"ours float32 forwards: {time.perf_counter() - t:.1f} s")
    r32 = {name: hf_logits(hf, [ids]) for name, ids in prompts.items()}
    del ours
    with pytest.MonkeyPatch.context() as mp:
        lifted = float64_throughout(hf, mp)
        r64 = {name: hf_logits(lifted, [ids]) for name, ids in prompts.items()}
    del hf, lifted
    ours64 = refimpl.load(path, dtype=np.float64)
    for name, ids in prompts.items():
        z64 = refimpl.logits(ours64, np.array([ids]))
        print(f"'{name}' ({len(ids)} tokens): float32 ours vs transformers {max_rel_diff(z32[name], r32[name]):.3g}; "
              f"float64 ours vs transformers {max_rel_diff(z64, r64[name]):.3g}; vs transformers float64: "
              f"ours float32 {max_rel_diff(z32[name], r64[name]):.3g}, "
              f"transformers float32 {max_rel_diff(r32[name], r64[name]):.3g}")
        del z64


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*map(int, sys.argv[1:]))
