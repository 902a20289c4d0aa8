"""Command line: python -m refimpl {generate, tokenize, export, verify, embed, inspect, demo} ...

    python -m refimpl generate [--model NAME|PATH] [--prompt TEXT | --ids '1 2 3' | --chat TEXT [--system TEXT]]
                               [--max-new-tokens N]
                               [--greedy | --temperature T --top-k K --top-p P --seed S]
                               [--beams N --length-penalty L] [--repetition-penalty R] [--stop STR]
                               [--no-eos] [--on-context-limit error|stop] [--backend numpy|numba|cuda]
                               [--weights float|quantized]
                               [--no-causal-mask] [--attention-scale S|head-dim|model-width]
                               [--logprobs [K]] [--timing [--compare-beam N]]
    python -m refimpl tokenize [--model NAME|PATH] [--allow-special] TEXT
    python -m refimpl export --model DIR_OR_HUB_NAME --out DIR [--dtype source|float32|bfloat16|float16]
    python -m refimpl export --model DIR_OR_GGUF --out FILE.gguf [--gguf-type F32|F16|BF16|Q8_0|Q4_0|...|Q6_K]
    python -m refimpl verify [--backend numba|numba_cuda|cupy|cuda] [--seed S]
    python -m refimpl embed [--model PATH] [--similarity] TEXT...
    python -m refimpl inspect {lens,attention,sinks,streaming,steer,patch,encodings,
                               patchscope,context,memory,neurons,training,chat} [--model PATH] [--out DIR]
    python -m refimpl compare --model PATH (--ids '1 2 3' | --prompt TEXT) (--theirs FILE | --hf DIR)
                              [--json F] [--plot P]
    python -m refimpl demo

--model takes a shipped model's name, shakespeare-gpt2 (the default) or shakespeare-llama, a fetched
one's, smollm2-135m-instruct or gemma-3-270m (GGUF files, fetched on first use), or a path (a GGUF file too); a path
that exists wins over a name (refimpl.models.resolve_model).

Every subcommand prints a one-line error (no traceback) and exits with status 2 on bad
input: a missing file, a malformed model, an out-of-range argument. A closed output pipe
(`... | head`) ends it quietly with status 0.

BLAS threads (`blas_threads_for`, refimpl._threads): when none of OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS, MKL_NUM_THREADS is set (a value you set always wins), generate / inspect / embed /
compare / demo on a model narrower than SMALL_MODEL_WIDTH (the shipped GPT-2 and LLaMA, MiniLM: their
matrices are too small to share out) run with one thread: set before NumPy loads for the shipped
default models, else after the model is loaded, from its config object (by name or path alike; no
file is read for it; threadpoolctl, which the numba extra installs, changes the count at run time:
without it the library's default stays); wider models (a real LLaMA checkpoint), the accelerated backends
(generate --backend numba|cuda: their kernels set their own threads) and the other commands keep the
library's default. benchmarks/NOTES.md ("refimpl command line: BLAS threads") has the measurements.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from refimpl._compile_note import note_numba_compile as _note_numba_compile  # (inspect says it too)
from refimpl._threads import BLAS_THREAD_VARS, SMALL_MODEL_WIDTH, one_blas_thread_for  # noqa: F401 (re-exported)


class UsageError(Exception):
    """A problem with what the user asked for: printed without a traceback."""


# ----------------------------------------------------------------------------- BLAS threads

_MODEL_COMMANDS = ("generate", "inspect", "embed", "compare", "demo")


def _flag_value(argv, flag: str):
    """The value of `flag VALUE` or `flag=VALUE` in argv (the last one given), else None."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value


def _thread_rule_applies(argv, environ) -> bool:
    """Whether the one-thread rule may act on `argv`: a model command on NumPy's BLAS,
    no thread count set by the user."""
    if any(v in environ for v in BLAS_THREAD_VARS) or not argv or argv[0] not in _MODEL_COMMANDS:
        return False
    return not (argv[0] in ("generate", "inspect") and (_flag_value(argv, "--backend") or "numpy") != "numpy")


def blas_threads_for(argv, environ) -> str | None:
    """The BLAS thread count to set before NumPy loads, for the command line `argv`: "1" for a model command on
    the shipped small models (no --model: GPT-2, MiniLM for embed, demo's), None (decided after the load, from the
    model's config: refimpl._threads.one_blas_thread_for; or the library's default) otherwise. No file is read."""
    if not _thread_rule_applies(argv, environ):
        return None
    return "1" if argv[0] == "demo" or _flag_value(argv, "--model") is None else None


def set_blas_threads(argv, environ=os.environ) -> str | None:
    """Put blas_threads_for(argv) into OPENBLAS_NUM_THREADS and MKL_NUM_THREADS (before NumPy is imported), and let
    the loaded model's width decide otherwise (refimpl._threads.enabled); returns what it set."""
    from refimpl import _threads

    _threads.enabled = _thread_rule_applies(argv, environ)
    n = blas_threads_for(argv, environ)
    if n is not None:
        environ["OPENBLAS_NUM_THREADS"] = environ["MKL_NUM_THREADS"] = n
    return n


# ----------------------------------------------------------------------------- generate

def _existing_model(name_or_path) -> Path:
    """The path `--model` stands for (refimpl.models.resolve_model), or a FileNotFoundError naming the flag, the path
    and the shipped models' names when nothing is there."""
    from refimpl.models import FETCHED_MODELS, MODEL_NAMES, resolve_model

    path = resolve_model(name_or_path)
    if not path.exists():
        raise FileNotFoundError(f"--model {name_or_path}: no such file or directory (nor a shipped model's name: "
                                f"{', '.join([*MODEL_NAMES, *FETCHED_MODELS])})")
    return path


def _load_model(path, weights: str = "float"):
    """The decoder at `path`, a path or a shipped model's name (None: shakespeare-gpt2), by refimpl.models.family_of:
    a LLaMA-family model, GPT-2 or a registered family's; an unknown model_type or an encoder is an error saying
    so. weights="quantized": a GGUF file's block-quantized matrices kept as their blocks (refimpl.llama.gguf.load_gguf).
    """
    from refimpl.llama.gguf import gguf_path
    from refimpl.models import family_of

    path = _existing_model(path)
    family = family_of(path)  # an unknown model_type: a WeightFileError listing the known ones
    if weights != "float" and gguf_path(path) is None:
        raise UsageError(f"--weights {weights} reads a GGUF file's blocks; {path} is not a GGUF file")
    if family == "llama":
        import refimpl
        from refimpl.tokenizers import TokenizerFileError

        try:  # with its tokenizer where refimpl reads it (refimpl.models.llama_tokenizer)
            return refimpl.load(path, **({} if weights == "float" else {"weights": weights}))
        except TokenizerFileError:  # a tokenizer file that cannot be read: prompts as --ids still run, and a
            from refimpl.llama import LlamaModel, load_weights  # --prompt is refused naming the file

            return LlamaModel(*load_weights(path), None)  # (path: resolved by _existing_model)
    if family == "bert":
        raise UsageError(f"{path} holds a BERT encoder, which does not generate text (python -m refimpl embed --help)")
    import refimpl
    from refimpl.families import named

    if not named(family).is_decoder:
        raise UsageError(f"{path} holds a {named(family).label} model, which does not generate text: "
                         f"{named(family).not_a_decoder}")
    return refimpl.load(path)  # (GPT-2's: refimpl.gpt2.load; a registered family's: its Family.load)


def cmd_generate(args) -> int:
    from refimpl import decoding
    from refimpl.gpt2.model import parse_token_ids

    model = _load_model(args.model, args.weights)  # None: the shipped default model
    one_blas_thread_for(model.config)  # a small model: one BLAS thread (module docstring)
    if args.ids is not None and args.prompt is not None:
        raise UsageError("give either --prompt or --ids, not both")
    if args.system is not None and args.chat is None:
        raise UsageError("--system is the system message of a --chat conversation: add --chat TEXT")
    if args.chat is not None:  # the conversation through the model's chat template (refimpl.tokenizers.chat)
        if args.ids is not None or args.prompt is not None:
            raise UsageError("--chat is the prompt: it cannot be combined with --prompt or --ids")
        if model.tokenizer is None:
            from refimpl.models import no_tokenizer_reason

            raise UsageError(f"--chat needs a tokenizer: {no_tokenizer_reason(args.model)}")
        if getattr(model, "chat_template", None) is None:
            from refimpl.llama.gguf import gguf_path

            gguf = gguf_path(_existing_model(args.model)) if args.model else None
            where = ("its GGUF file has no tokenizer.chat_template (a base model's usually has none)" if gguf else
                     "a chat model's tokenizer_config.json chat_template or chat_template.jinja")
            raise UsageError(f"--chat needs a chat template, and {args.model or 'this model'} has none ({where}); "
                             "use --prompt")
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + [
            {"role": "user", "content": args.chat}]
        prompt = decoding.chat_prompt(model, messages)
    elif args.ids is not None:
        prompt = parse_token_ids(args.ids, model.config.vocab_size, flag="--ids")
    elif args.prompt is not None:
        if model.tokenizer is None:
            from refimpl.models import no_tokenizer_reason

            raise UsageError(f"{no_tokenizer_reason(args.model)}; give the prompt as token ids with --ids")
        prompt = args.prompt
    else:  # no prompt: start from the end-of-text token, as GPT-2's unconditional samples do
        start = model.config.bos_token_id if model.config.bos_token_id is not None else model.config.eos_token_id
        start = start[0] if isinstance(start, (list, tuple)) and start else start
        if start is None or start == []:
            raise UsageError("give a prompt: --prompt TEXT (or --ids '1 2 3' for token ids)")
        prompt = [start]
    sampling = any(v is not None for v in (args.temperature, args.top_k, args.top_p))
    if args.greedy and sampling:
        raise UsageError("--greedy cannot be combined with --temperature / --top-k / --top-p")
    if args.beams > 1 and sampling:
        raise UsageError("--beams cannot be combined with sampling options")
    if args.seed is not None and not sampling:
        raise UsageError("--seed only matters when sampling: add --temperature / --top-k / --top-p")
    if args.length_penalty != 1.0 and args.beams == 1 and args.compare_beam is None:
        raise UsageError("--length-penalty only applies to beam search: add --beams N (N >= 2)")
    if args.compare_beam is not None:
        if args.compare_beam < 2:
            raise UsageError(f"--compare-beam must be a number of beams >= 2; got {args.compare_beam}")
        if sampling or args.beams > 1 or args.stop:
            raise UsageError("--compare-beam runs greedy decoding and beam search side by side: it cannot be "
                             "combined with --temperature / --top-k / --top-p, --beams or --stop")
        if not args.timing:
            raise UsageError("--compare-beam compares the timings of greedy decoding and beam search: add --timing")
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=sampling,
              repetition_penalty=args.repetition_penalty, num_beams=args.beams,
              length_penalty=args.length_penalty, seed=args.seed, stop=tuple(args.stop or ()),
              on_context_limit=args.on_context_limit, backend=args.backend,
              causal=not args.no_causal_mask, attention_scale=args.attention_scale)
    if args.no_eos:
        kw["eos_token_id"] = None
    if sampling:
        kw.update(temperature=1.0 if args.temperature is None else args.temperature,
                  top_k=args.top_k, top_p=args.top_p)
    if args.backend == "numba":
        _note_numba_compile(model)
    elif args.weights == "quantized" and args.backend == "numpy":
        from refimpl._progress import note_once

        note_once("numpy-quantized", "--weights quantized on --backend numpy: refimpl's product decodes each matrix "
                  "from its blocks on every use, several times slower per token than --weights float (SmolLM2-135M "
                  "Q4_1: 7-9x); --backend numba computes straight from the blocks")
    if args.no_causal_mask:
        print("note: --no-causal-mask: every position attends to the whole sequence, later tokens too; the model "
              "was trained with the mask, and each step recomputes every position (no KV cache)", file=sys.stderr)
    if args.compare_beam is not None:
        return _compare_beam(model, prompt, kw, args)
    trace = decoding.Trace(alternatives=args.logprobs or 0) if (args.logprobs is not None or args.timing) else None
    kw["trace"] = trace
    declined = _declined_now(model, args.backend) if args.timing else None
    out = sys.stdout
    # Every flag is checked by stream_text / stream at the call, before the prompt is printed.
    # An error that only the model's numbers can raise (NaN logits, a repetition penalty that
    # overflows a logit) comes mid-line: the line is ended first, so the error has its own.
    written = False
    try:
        if model.tokenizer is not None and args.ids is None:
            chunks = decoding.stream_text(model, prompt, **kw)
            if isinstance(prompt, str):
                out.write(prompt)
                out.flush()
                written = True
            text = ""
            for chunk in chunks:
                out.write(chunk)
                out.flush()
                written = True
                text += chunk
            out.write("\n")
            written = False
            if text and not text.strip():  # e.g. greedy decoding from <|endoftext|> repeating "\n\n"
                print(f"note: the continuation is {len(text)} whitespace characters only; give --prompt, or sample "
                      "(--temperature 0.8 --top-k 40 --seed 1)", file=sys.stderr)
        else:
            for tok in decoding.stream(model, prompt, **kw):
                out.write(f"{tok} ")
                out.flush()
                written = True
            out.write("\n")
            written = False
    except (ValueError, TypeError):
        if written:
            out.write("\n")
            out.flush()
        raise
    if args.logprobs is not None:
        print(_logprob_table(model, trace, sampling or args.repetition_penalty != 1.0))
    if args.timing:
        print(_timing_lines(trace, args.backend, f"beam search, {args.beams} beams" if args.beams > 1 else None,
                            beams=args.beams))
        if declined is not None:
            print(_declined_line(*declined))
    return 0


def _declined_now(model, backend):  # -> (the backend's Ops.declined, a copy of it now), or None for numpy's
    """What the run's report of refimpl's part starts from: a backend's Counter of the fused steps it declined and
    the operations that refused their input (refimpl's ran there)."""
    from refimpl.families import of_model

    ops = of_model(model).get_ops(backend)
    return None if ops.name == "numpy" else (ops.declined, ops.declined.copy())


def _declined_line(counter, before) -> str:
    """The refusals counted since `before`: each reason and how many forwards or operation calls it covered."""
    new = counter - before
    if not new:
        return "  declined: nothing (the backend ran every fused step and operation itself)"
    return "  declined (refimpl's ran there): " + "; ".join(f"{reason} x{n}" for reason, n in new.most_common())


def _piece(model, token: int) -> str:
    """A token as the table shows it: its piece in quotes when the model has a tokenizer (byte fragments as
    <0xNN>, an id its tokenizer names no token with as <id N>: refimpl._tokens.token_pieces), else its id."""
    if model.tokenizer is None:
        return str(token)
    from refimpl._tokens import token_pieces

    piece = token_pieces(model.tokenizer, [token], vocab_size=model.config.vocab_size)[0]
    quote = '"' if "'" in piece and '"' not in piece else "'"  # as repr quotes
    return f"{quote}{piece}{quote}"


def _logprob_table(model, trace, processed: bool) -> str:
    """The generated tokens' log-probabilities, ranks and top alternatives (refimpl.decoding.Trace.tokens)."""
    import math

    lines = ["log-probabilities under the model's own distribution (log_softmax of its logits"
             + ("; before the repetition penalty, temperature, top-k and top-p that chose the tokens)" if processed
                else ")")]
    lines.append(f"{'#':>3}  {'token':<16} {'logprob':>8} {'p':>7} {'rank':>5}  top alternatives (logprob)")
    for i, r in enumerate(trace.tokens, 1):
        alts = ", ".join(f"{_piece(model, t)} {lp:.2f}" for t, lp in r.top)
        lines.append(f"{i:>3}  {_piece(model, r.token)[:16]:<16} {r.logprob:>8.3f} {math.exp(r.logprob):>7.4f} "
                     f"{r.rank:>5}  {alts}")
    total = math.fsum(r.logprob for r in trace.tokens)
    lines.append(f"sum: {total:.3f} = log p(these {len(trace.tokens)} tokens | the prompt) (the chain rule: "
                 f"p = {math.exp(total):.3g})")
    return "\n".join(lines)


def _timing_lines(trace, backend: str, what: str | None = None, beams: int = 1) -> str:
    """Prefill and per-step milliseconds of a run (refimpl.decoding.Trace.timing), one summary and the steps.

    A step makes one token per row: with beam search, one for each of the N beams (ms/step).
    """
    t = trace.timing()
    unit = "ms/token" if beams == 1 else f"ms/step of {beams} beams"
    head = f"timing ({what + ', ' if what else ''}backend {backend}, wall clock):"
    if t["prefill_ms"] is None:
        return head + " nothing was computed (no new tokens)"
    lines = [head, f"  prefill  {t['prompt_tokens']} tokens: {t['prefill_ms']:.2f} ms "
                   f"({t['prefill_ms_per_token']:.3f} ms/token)"]
    if t["steps"]:
        lines.append(f"  decode   {t['steps']} steps: mean {t['mean_step_ms']:.2f} {unit}, "
                     f"median {t['median_step_ms']:.2f} {unit}")
        lines.append("  steps ms: " + " ".join(f"{ms:.2f}" for ms in trace.step_ms))
    else:
        lines.append("  decode   0 steps (the only new token came from the prefill)")
    return "\n".join(lines)


def _compare_beam(model, prompt, kw, args) -> int:
    """Greedy decoding and beam search (args.compare_beam beams) on the same prompt: both outputs and timings."""
    from refimpl import decoding

    kw = {k: v for k, v in kw.items() if k not in ("do_sample", "seed", "stop")}
    decoding.generate(model, prompt, **{**kw, "max_new_tokens": 1})  # warm-up: first-call costs fall on neither
    runs = []
    for beams in (1, args.compare_beam):
        trace = decoding.Trace(alternatives=args.logprobs or 0)
        g = decoding.generate(model, prompt, **{**kw, "num_beams": beams, "trace": trace})
        runs.append(("greedy" if beams == 1 else f"beam search, {beams} beams", beams, g, trace))
    for name, _, g, trace in runs:
        shown = (g.text if g.text is not None else " ".join(map(str, g.ids)))
        print(f"{name}: {shown!r} ({len(g.ids)} tokens, {g.finish_reason}"
              + (f", score {g.score:.4f})" if g.score is not None else ")"))
    for name, beams, g, trace in runs:
        if args.logprobs is not None:
            print(f"{name}:")
            print(_logprob_table(model, trace, args.repetition_penalty != 1.0))
        print(_timing_lines(trace, args.backend, name, beams=beams))
    return 0


# ----------------------------------------------------------------------------- tokenize

def _llama_tokenizer(path: Path):
    """The tokenizer of a LLaMA-family model folder (refimpl.models.llama_tokenizer),
    or a UsageError saying what is missing."""
    from refimpl.llama.io import load_config
    from refimpl.models import llama_tokenizer, tokenizer_absence

    why = tokenizer_absence(path)
    if why is not None:
        raise UsageError(f"{why}. Without a tokenizer, give prompts as token ids: generate --ids '1 2 3', "
                         "inspect ... --ids '1 2 3'")
    return llama_tokenizer(path, load_config(path).vocab_size)


def _gguf_tokenizer(path: Path):
    """The tokenizer a GGUF file's metadata holds (refimpl.tokenizers.gguf), or a UsageError saying it has none."""
    from refimpl.gguf import read_gguf
    from refimpl.tokenizers.gguf import tokenizer_from_gguf

    tok = tokenizer_from_gguf(read_gguf(path).metadata, str(path))
    if tok is None:
        raise UsageError(f"{path}: its metadata holds no tokenizer refimpl reads. Without a tokenizer, give prompts "
                         "as token ids: generate --ids '1 2 3', inspect ... --ids '1 2 3'")
    return tok


def cmd_tokenize(args) -> int:
    from refimpl.gpt2 import load_tokenizer

    from refimpl.llama.gguf import gguf_path
    from refimpl.models import family_of

    path = _existing_model(args.model)  # a path, or a shipped model's name
    if path.is_file() and path.suffix in (".safetensors", ".npz", ".bin"):  # a weights file: its directory's tokenizer
        path = path.parent                                                       # (as `generate --model FILE` finds it)
    if gguf_path(path) is not None:
        tok = _gguf_tokenizer(gguf_path(path))
    elif path.is_dir() and family_of(path) == "llama":
        tok = _llama_tokenizer(path)
    else:
        tok = load_tokenizer(path)
    from refimpl._tokens import encode_prompt

    ids = encode_prompt(tok, args.text, allowed_special="all" if args.allow_special else ())  # + the model's BOS
    text_bytes = args.text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")
    lost = sorted(set(text_bytes) & getattr(tok, "unrepresentable_bytes", frozenset()))
    if lost:  # a byte-level vocabulary without these bytes: they are dropped (or the unknown token), as in tokenizers
        print(f"note: the tokenizer cannot represent byte{'s' if len(lost) > 1 else ''} "
              f"{', '.join(f'0x{b:02x}' for b in lost)} of the text "
              f"(no token for {'them' if len(lost) > 1 else 'it'}): "
              "dropped, or the unknown token where the tokenizer has one", file=sys.stderr)
    print(f"{len(ids)} token{'' if len(ids) == 1 else 's'}")
    print("ids:   ", " ".join(map(str, ids)))
    from refimpl._tokens import token_pieces

    print("pieces:", " ".join(f"'{p}'" for p in token_pieces(tok, ids)))  # byte fragments as <0xNN>
    return 0


# ----------------------------------------------------------------------------- export

def cmd_export(args) -> int:
    from refimpl.gpt2.io import _looks_like_path
    from refimpl.models import export

    if args.gguf_type is not None or str(args.out).lower().endswith(".gguf"):
        return _export_gguf(args)
    if _looks_like_path(args.model):  # (anything else may be a Hugging Face hub name)
        _existing_model(args.model)  # a missing path: the same line as every other command's
    out = export(args.model, args.out, dtype=args.dtype)
    print(f"wrote {out}")
    return 0


def _export_gguf(args) -> int:
    """export --out FILE.gguf [--gguf-type T]: a LLaMA-family model as one GGUF file (refimpl.llama.gguf_write)."""
    from collections import Counter

    from refimpl.llama.gguf_write import save_gguf
    from refimpl.models import family_of

    if args.dtype != "source":
        raise UsageError("--dtype applies to a folder; a GGUF file's tensors take --gguf-type")
    path = _existing_model(args.model)  # a path, or a shipped model's name
    if family_of(path) != "llama":
        raise UsageError(f"{path} is a {family_of(path)} model; GGUF export writes the LLaMA family only")
    saved = save_gguf(path, args.out, type=args.gguf_type or "F32")
    counts = Counter(saved.tensor_types.values())
    print(f"wrote {saved.path} ({', '.join(f'{n} {t}' for t, n in counts.most_common())} tensors)")
    if saved.note:
        print(f"note: {saved.note}")
    return 0


# ----------------------------------------------------------------------------- verify

def cmd_verify(args) -> int:
    from accel import verify

    return verify.main(backend=args.backend, seed=args.seed)


# ----------------------------------------------------------------------------- demo

def cmd_demo(args) -> int:
    from refimpl import demo

    return demo.main()


# ----------------------------------------------------------------------------- parser

def _non_negative_int(text: str) -> int:  # an argparse type
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer; got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m refimpl", description="Readable NumPy transformer math, checked: "
                                 "GPT-2 and the LLaMA family (LLaMA, Mistral, Qwen2/3, Gemma/2/3, Phi-3) run from "
                                 "their files (generate, tokenize, export), a look inside (inspect), a port checked "
                                 "point by point (compare), sentence embeddings (embed), and the accel kernels "
                                 "verified against their NumPy twins (verify).")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="continue a prompt with a GPT-2 or LLaMA-family model, streaming tokens "
                       "as they come")
    g.add_argument("--model", metavar="NAME|PATH", help="a shipped model's name: shakespeare-gpt2 (the default, a "
                   "small GPT-2 trained on Shakespeare) or shakespeare-llama (a small LLaMA, the same text); a "
                   "fetched one's: smollm2-135m-instruct or gemma-3-270m (GGUF files, fetched on first use "
                   "into .cache/); or a GPT-2 directory or weights file (see refimpl.gpt2.io), a Hugging Face LLaMA / "
                   "Mistral / Qwen2 / Qwen3 / Gemma / Gemma-2 / Gemma-3 / Phi-3 directory (config.json's "
                   "model_type), or a GGUF file of these. A path that exists wins over a name")
    g.add_argument("--prompt", help="the prompt text (default: start from <|endoftext|>)")
    g.add_argument("--ids", nargs="+", metavar="ID", help="the prompt as token ids (1 2 3, or '1,2,3'), for models "
                   "without tokenizer files")
    g.add_argument("--chat", metavar="TEXT", help="a user message, put through the model's chat template (its "
                   "tokenizer_config.json chat_template, chat_template.jinja, or a GGUF's tokenizer.chat_template); "
                   "prints the reply")
    g.add_argument("--system", metavar="TEXT", help="with --chat: the system message before it")
    g.add_argument("--max-new-tokens", type=int, default=50, help="at most this many new tokens (default 50)")
    g.add_argument("--greedy", action="store_true", help="greedy decoding (the default without sampling options)")
    g.add_argument("--temperature", type=float, help="sample, with logits divided by T (default 1 when sampling)")
    g.add_argument("--top-k", type=int, help="sample from the K most likely tokens (0 = no filter; "
                   "Hugging Face's generate uses 50 unless told otherwise)")
    g.add_argument("--top-p", type=float, help="sample from the smallest set of tokens with mass >= P")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="penalise tokens already in the text: their positive logits divided by R, negative ones "
                   "multiplied by R (default 1 = off; CTRL's rule as Hugging Face applies it)")
    g.add_argument("--beams", type=int, default=1, help="beam search with N beams")
    g.add_argument("--length-penalty", type=float, default=1.0, help="beam search: score / length^L (default 1)")
    g.add_argument("--stop", action="append", help="stop string (repeatable); taken literally, so pass a "
                   "newline as $'\\n' in bash")
    g.add_argument("--seed", type=int, help="seed for reproducible sampling")
    g.add_argument("--on-context-limit", choices=("error", "stop"), default="error",
                   help="at the model's context length: error (default) or stop generating")
    g.add_argument("--no-eos", action="store_true", help="do not stop at the end-of-text token")
    g.add_argument("--backend", default="numpy", help="numpy (default), numba, cuda")
    g.add_argument("--weights", choices=("float", "quantized"), default="float",
                   help="a GGUF model's weights: float (default: decoded to float32 at load) or quantized (kept as "
                   "their blocks: a quarter of the memory; --backend numba multiplies straight from them)")
    from refimpl._switches import parse_attention_scale

    g.add_argument("--no-causal-mask", action="store_true",
                   help="attention sees every position of the sequence, later ones too (the model was trained "
                   "with the mask); each step recomputes the whole sequence, without a KV cache")
    g.add_argument("--attention-scale", type=parse_attention_scale, metavar="S",
                   help="the factor on q.k in attention: a positive number, head-dim (1/sqrt(head dim)) or "
                   "model-width (1/sqrt(model width)); default: the model's own (1/sqrt(head dim); Gemma-2's "
                   "query_pre_attn_scalar)")
    g.add_argument("--logprobs", type=_non_negative_int, nargs="?", const=5, metavar="K",
                   help="after the text, a table of each new token's log-probability, rank and the K most likely "
                   "alternatives (default K 5), under the model's own distribution (before temperature, top-k, "
                   "top-p and the repetition penalty)")
    g.add_argument("--timing", action="store_true",
                   help="after the text, the milliseconds of the prefill and of each decoding step (mean, median); "
                   "on a small or busy CPU set OPENBLAS_NUM_THREADS=1 first, or the BLAS thread pool dominates")
    g.add_argument("--compare-beam", type=int, metavar="N",
                   help="with --timing: run greedy decoding and beam search with N beams on the same prompt and "
                   "print both outputs and timings")
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser("tokenize", help="print the token ids and pieces of a text")
    t.add_argument("--model", metavar="NAME|PATH", help="shakespeare-gpt2 (default), shakespeare-llama, "
                   "smollm2-135m-instruct, gemma-3-270m, or a model directory (GPT-2 or LLaMA family), a GGUF "
                   "file, a weights file or a tokenizer file")
    t.add_argument("text")
    t.add_argument("--allow-special", action="store_true", help="treat special-token text as special tokens")
    t.set_defaults(func=cmd_tokenize)

    e = sub.add_parser("export", help="write our format (config.json + model.safetensors) from a Hugging Face model: "
                       "GPT-2 or the LLaMA family; or a LLaMA-family model as a GGUF file (--out FILE.gguf)")
    e.add_argument("--model", required=True, metavar="NAME|PATH", help="a local Hugging Face directory (GPT-2, or "
                   "a LLaMA-family model_type: llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, "
                   "or gemma3's text decoder), a GGUF file of one, a shipped or fetched model's name "
                   "(shakespeare-gpt2, shakespeare-llama, smollm2-135m-instruct, gemma-3-270m: GGUF files), or "
                   "a Hugging Face hub name (org/name) of any of "
                   "these model types, fetched into the Hugging Face cache (or read from it alone with "
                   "HF_HUB_OFFLINE=1)")
    e.add_argument("--out", required=True, help="output directory (a FILE.gguf: one GGUF file, as --gguf-type); "
                   "from a GGUF source the folder gets its byte-level BPE tokenizer as tokenizer.json + "
                   "tokenizer_config.json (chat template, bos / eos); a SentencePiece-style one (Gemma, LLaMA 2) "
                   "is not written, as tokenizer.json's ranked merges do not reproduce its score order: export to "
                   "FILE.gguf keeps it")
    e.add_argument("--gguf-type", type=str.upper, choices=("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q4_K", "Q5_K", "Q6_K"), help="write --out as a GGUF file (llama.cpp's format) whose 2-D weights "
                   "take this type (norms and biases stay F32; k-quant rows not a multiple of 256 fall back as "
                   "llama-quantize does); LLaMA-family models; default F32 for an --out ending in .gguf")
    e.add_argument("--dtype", choices=("source", "float32", "bfloat16", "float16"), default="source",
                   help="dtype of the written tensors: source (default) keeps each tensor's stored dtype (a bfloat16 "
                   "or float16 checkpoint stays so, bit for bit); float32 widens every tensor (exact); bfloat16 / "
                   "float16 store every tensor so only if each value fits exactly, else the export is refused "
                   "naming the tensor (export never rounds)")
    e.set_defaults(func=cmd_export)

    v = sub.add_parser("verify", help="run every registered kernel against its refimpl twin and print a table")
    v.add_argument("--backend", choices=("numba", "numba_cuda", "cupy", "cuda"),
                   help="only this backend's kernels; cuda: both GPU backends (numba_cuda and cupy), the kernels "
                   "of generate --backend cuda (default: every backend; those that cannot run here are skipped)")
    v.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the random inputs (default 0)")
    v.epilog = "exit status: 0 every kernel that ran passed, 1 a kernel failed, 2 none could run here"
    v.set_defaults(func=cmd_verify)

    sub.add_parser("embed", help="sentence embeddings with all-MiniLM-L6-v2 (see: python -m refimpl embed --help)",
                   add_help=False)

    sub.add_parser("inspect", help="look inside a GPT-2 or LLaMA-family model: lens, attention, sinks, streaming, "
                   "steer, patch, "
                   "encodings, patchscope, context, memory, neurons, training, chat "
                   "(see: python -m refimpl inspect --help)", add_help=False)
    sub.add_parser("compare", help="is my port right? compare its activations with the reference's, point by point "
                   "(see: python -m refimpl compare --help)", add_help=False)

    d = sub.add_parser("demo", help="a short tour of what refimpl computes, checked as it goes")
    d.set_defaults(func=cmd_demo)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] == "embed":  # its own parser: refimpl.bert.cli
            from refimpl.bert import cli

            return cli.main(argv[1:])
        if argv and argv[0] == "inspect":  # its own parser: refimpl.interp.cli
            from refimpl.interp import cli

            return cli.main(argv[1:])
        if argv and argv[0] == "compare":  # its own parser: refimpl.compare.cli
            from refimpl.compare import cli

            return cli.main(argv[1:])
        from refimpl._argparse import parse_args

        args = parse_args(build_parser(), argv)  # an unknown flag: the subcommand's usage
        try:
            return args.func(args)
        except (UsageError, ValueError, TypeError, OSError) as e:  # OSError: FileNotFoundError, NotADirectoryError, ...
            if isinstance(e, BrokenPipeError):
                raise
            print(f"error: {_cli_words(e, args.command)}", file=sys.stderr)
            return 2
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 0
    except KeyboardInterrupt:
        return 130


# The library's messages name its keyword arguments; on the command line, name the flags instead.
_FLAG_NAMES = {
    "generate": (("(use do_sample=False for greedy)", "(use --greedy for greedy decoding)"),
                 ("pass on_context_limit='stop'", "pass --on-context-limit stop"),
                 ("pass eos_token_id=... (or None) explicitly", "pass --no-eos"),
                 ("pass do_sample=True with them", "give them without --greedy"),
                 ("must be a positive integer or None", "must be a positive integer (0 = off)"),
                 ("must be a number in [0, 1] or None", "must be a number in [0, 1]"),
                 ("temperature must", "--temperature must"), ("seed must", "--seed must"),
                 ("max_new_tokens", "--max-new-tokens"), ("num_beams", "--beams"),
                 ("repetition_penalty", "--repetition-penalty"), ("length_penalty", "--length-penalty"),
                 ("top_k", "--top-k"), ("top_p", "--top-p"), ("attention_scale", "--attention-scale"),
                 ("stop must", "--stop must"),
                 ("causal=False", "--no-causal-mask")),
    "export": (("out_dir ", "--out "),),
}


def _cli_words(err: Exception, command: str) -> str:
    msg = str(err)
    for old, new in _FLAG_NAMES.get(command, ()):
        msg = msg.replace(old, new)
    return msg


if __name__ == "__main__":
    set_blas_threads(sys.argv[1:])  # before anything imports NumPy
    sys.exit(main())
