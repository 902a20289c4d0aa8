"""python -m refimpl compare: is my port right? The reference's activations against theirs, point by point.

    python -m refimpl compare --model DIR --ids '1 2 3' --theirs acts.npz      # a dump of theirs
    python -m refimpl compare --model DIR --prompt "Hello" --hf HF_DIR         # a live Hugging Face model
    python -m refimpl compare --model DIR --ids '1 2 3' --write-reference ref.safetensors

Options: --dtype float32|float64 (the reference's), --hf-dtype (the live model's), --their-dtype
NAME (the precision their side computed in, when the file does not show it), --scale X (every
tolerance times X), --json FILE ('-' for stdout), --plot PNG.
Exit status: 0 when every compared point agrees, 1 on a divergence, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .._threads import one_blas_thread_for
from .core import compare
from .sources import dump, dump_limit, hf_activations, n_layers, read_activations, read_ids, reference_activations


class _Usage(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m refimpl compare",
                                 description="compare a port's activations with the reference's, point by point")
    ap.add_argument("--model", required=True, help="the reference: any model directory or file refimpl reads")
    ap.add_argument("--ids", nargs="+", metavar="ID", help="token ids: 1 2 3 or '1,2,3' (or taken from the dump's "
                    "__ids__)")
    ap.add_argument("--prompt", help="text, when the model has a tokenizer")
    side = ap.add_mutually_exclusive_group(required=True)
    side.add_argument("--theirs", help=".safetensors or .npz of their activations")
    side.add_argument("--hf", help="a Hugging Face model directory to run live (needs transformers)")
    side.add_argument("--write-reference", metavar="FILE", help="write the reference's activations and ids, then stop")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="the reference's dtype")
    ap.add_argument("--hf-dtype", default=None, choices=["float32", "float64", "bfloat16", "float16"],
                    help="the live model's dtype (default: --dtype)")
    ap.add_argument("--their-dtype", default=None, choices=["float64", "float32", "float16", "bfloat16"],
                    help="the precision their side computed in (default: what the file stores)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every tolerance by this")
    ap.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    ap.add_argument("--plot", metavar="PNG", help="draw err / tol along the data flow")
    return ap


def _load(path: str, dtype: str):
    """refimpl.load(path); a LLaMA-family model whose tokenizer file cannot be read loads without it (--ids still
    run, and a --prompt is refused naming the file: refimpl.models.no_tokenizer_reason)."""
    import refimpl
    from refimpl.tokenizers import TokenizerFileError

    try:
        return refimpl.load(path, dtype=np.dtype(dtype))
    except TokenizerFileError:
        from refimpl.llama import LlamaModel, load_weights
        from refimpl.models import resolve_model

        return LlamaModel(*load_weights(resolve_model(path), dtype=np.dtype(dtype)), None)


def _ids(args, model, stored_ids):
    from refimpl.gpt2.checks import parse_token_ids

    if args.ids is not None and args.prompt is not None:
        raise _Usage("give either --ids or --prompt, not both")
    if args.ids is not None:
        ids = np.asarray(parse_token_ids(args.ids, model.config.vocab_size, flag="--ids"), dtype=np.int64)
    elif args.prompt is not None:
        if model.tokenizer is None:
            from refimpl.models import no_tokenizer_reason

            raise _Usage(f"{no_tokenizer_reason(args.model, 'this model has no tokenizer this project reads')}; "
                         "give token ids with --ids")
        from refimpl._tokens import encode_prompt

        ids = np.asarray(encode_prompt(model.tokenizer, args.prompt), dtype=np.int64)  # the BOS too, as generate
    elif stored_ids is not None:
        return np.asarray(stored_ids, dtype=np.int64)
    else:
        raise _Usage("give the token ids: --ids '1 2 3' or --prompt TEXT (or a dump that stores __ids__)")
    if stored_ids is not None and not np.array_equal(np.asarray(stored_ids).reshape(-1), ids.reshape(-1)):
        raise _Usage(f"the ids given ({ids.reshape(-1)[:8].tolist()}...) differ from the ids their dump was made "
                     f"from ({np.asarray(stored_ids).reshape(-1)[:8].tolist()}...)")
    return ids


_PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _check_outputs(args) -> None:
    """Every path the command will write, checked before any work (refimpl._files.check_output_file)."""
    from .._files import check_output_file

    if args.json is not None and args.json != "-":
        check_output_file(args.json, "--json", (".json",))
    if args.plot is not None:
        check_output_file(args.plot, "--plot", _PLOT_SUFFIXES)
    if args.write_reference is not None:
        check_output_file(args.write_reference, "--write-reference", (".safetensors", ".npz"))


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        _check_outputs(args)
        model = _load(args.model, args.dtype)
        one_blas_thread_for(model.config)  # python -m refimpl: a small model runs on one BLAS thread
        if args.write_reference:
            ids = _ids(args, model, None)
            path = dump(args.write_reference, reference_activations(model, ids), ids=ids)
            print(f"wrote {path}")
            return 0
        their_dtype = args.their_dtype
        if args.theirs:
            stored_ids = read_ids(args.theirs)
            ids = _ids(args, model, stored_ids)
            reference = reference_activations(model, ids)
            theirs, _, stored_dtype = read_activations(args.theirs, max_bytes=dump_limit(reference))
            their_dtype = their_dtype or stored_dtype
        else:
            ids = _ids(args, model, None)
            theirs, hf_dtype = hf_activations(args.hf, ids, dtype=args.hf_dtype or args.dtype)
            their_dtype = their_dtype or hf_dtype
            reference = reference_activations(model, ids)
        report = compare(reference, theirs, n_layers=n_layers(model), their_dtype=their_dtype, scale=args.scale)
        print(report.table())
        if args.json == "-":
            print(report.to_json())
        elif args.json:
            from .._files import write_output

            print(f"wrote {write_output(args.json, report.to_json().encode('utf-8'), '--json', ('.json',))}")
        if args.plot:
            try:
                report.plot(args.plot)
            except ImportError as e:
                raise _Usage(f"--plot: {e}") from None
            except OSError as e:
                raise _Usage(f"--plot {args.plot}: cannot write it ({e.strerror or e})") from None
            print(f"wrote {args.plot}")
    except (_Usage, ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if report.ok else 1
