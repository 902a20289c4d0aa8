"""llama.cpp's side of benchmarks/llamacpp.py, run as a script by the interpreter that has llama-cpp-python.

Reads one JSON request per line on stdin and answers one JSON line on stdout (llama.cpp's own log goes to
stderr). Requests:

    {"op": "about"}                                   -> llama_cpp.__version__, llama_print_system_info()
    {"op": "load", "name": N, "path": P, "threads": t, "n_ctx": c}   -> n_vocab
    {"op": "decode", "name": N, "prompt": [ids], "new": n}  -> the n greedy tokens (argmax of each step's logits)
    {"op": "prefill", "name": N, "ids": [ids]}        -> the argmax of the last position's logits
    {"op": "quit"}

decode: the prompt into an empty KV cache in one batch, then one token at a time, each step's last-position
logits read with llama_get_logits_ith(ctx, -1) and their argmax fed back (the loop benchmarks/llama.py's
`greedy` writes out). prefill: the ids into an empty KV cache in one batch, logits of the last position only.
Needs only llama_cpp, NumPy and the standard library.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def main() -> int:
    import llama_cpp

    models = {}
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "quit":
            break
        try:
            if op == "about":
                out = {"llama_cpp_python": llama_cpp.__version__,
                       "system_info": llama_cpp.llama_print_system_info().decode().strip()}
            elif op == "load":
                llm = llama_cpp.Llama(model_path=req["path"], n_ctx=req["n_ctx"], n_batch=req["n_ctx"],
                                      n_threads=req["threads"], n_threads_batch=req["threads"], logits_all=False,
                                      verbose=False)
                models[req["name"]] = llm
                out = {"n_vocab": llm.n_vocab()}
            elif op == "decode":
                llm = models[req["name"]]
                n_vocab = llm.n_vocab()
                llm.reset()
                llm.eval(req["prompt"])
                tokens = []
                for _ in range(req["new"]):
                    z = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
                    tokens.append(int(z.argmax()))
                    if len(tokens) < req["new"]:
                        llm.eval(tokens[-1:])
                out = {"tokens": tokens}
            elif op == "prefill":
                llm = models[req["name"]]
                llm.reset()
                llm.eval(req["ids"])
                z = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
                out = {"argmax": int(z.argmax())}
            else:
                out = {"error": f"unknown op {op!r}"}
        except Exception as e:  # noqa: BLE001 - answered, so the parent reports it instead of waiting
            out = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
