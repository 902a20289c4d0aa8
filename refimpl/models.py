"""The front door: load(path) reads a model of any family refimpl implements; logits(model, ids) runs it.

    model = refimpl.load("path/to/model")     # a GPT2Model, LlamaModel or BertModel
    model = refimpl.load("shakespeare-llama") # a model shipped with the package, by name (MODEL_NAMES)
    z = refimpl.logits(model, ids)            # ids [B, T] -> [B, T, V] float32; [T] -> [T, V]

Names (`resolve_model`): the shipped models are "shakespeare-gpt2" (the default: a small GPT-2,
refimpl/data/default/) and "shakespeare-llama" (a small LLaMA, refimpl/data/shakespeare-llama/),
both trained on Shakespeare; FETCHED_MODELS are pretrained GGUF files fetched into the data
directory on first use ("smollm2-135m-instruct"; "gemma-3-270m", Gemma 3's text decoder of 270M
parameters). Wherever a model path is taken (load, family_of, export, every command's --model), a
path that exists is that path, and otherwise a name in MODEL_NAMES is its shipped directory (a name
in FETCHED_MODELS its file): so ./shakespeare-gpt2, if there is such a folder, is that folder. A
name whose directory is missing from this installation is a one-line error saying so.

Which family reads `path` (`family_of`) is decided by the files, in this order:

    a GGUF file (*.gguf, or a folder holding one *.gguf and no config.json)
                                -> refimpl.llama.gguf.load_gguf_model: general.architecture
                                   llama, qwen2, qwen3, gemma, gemma2, gemma3 or phi3 (else an error naming it),
                                   with the tokenizer and chat template of its metadata
    config.json's model_type    (in the directory, or beside a weights file)
        "gpt2"                  -> refimpl.gpt2.load    (every format it reads)
        refimpl.llama.MODEL_TYPES (llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3),
        "gemma3" (its text decoder: refimpl.llama.config.TEXT_PARTS)
                                -> refimpl.llama.load_weights + the tokenizer rule below
        "bert"                  -> refimpl.bert.load    (MiniLM / sentence-transformers directories)
        anything else           -> an error listing the supported model types
    no config.json, or one without model_type
                                -> GPT-2 (its own layouts carry their config: model.npz,
                                   safetensors metadata, llm.c's .bin; GPT-2's config.json
                                   may omit model_type, and GPT-2's reader assumes it); an
                                   error instead where the tensors are the LLaMA family's
    path None                   -> the GPT-2 shipped with the package ("shakespeare-gpt2")

Tokenizer of a LLaMA-family model (`llama_tokenizer`): GPT-2's byte-level BPE files
(refimpl.gpt2.tokenizer) where they apply, else refimpl.tokenizers (tokenizer.json of any BPE
kind, a SentencePiece BPE tokenizer.model, tekken.json). A directory with no tokenizer file, or
one of a kind neither implements (a Unigram or WordPiece model, say), gets tokenizer None, and
prompts are then token ids; `tokenizer_absence(directory)` says why in
one sentence. A tokenizer file that is there but cannot be read (cut short, not valid JSON, a
protobuf that is no SentencePiece model) is an error naming the file, for every format.

`export(source, out_dir, dtype="source")` writes our format (config.json + model.safetensors,
tokenizer files copied) for GPT-2 (refimpl.gpt2.io.export) and the LLaMA family
(refimpl.llama.io.export), from a local folder or file or from a Hugging Face hub name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from .checkpoint import WeightFileError, config_object, read_small_file

__all__ = ["load", "logits", "export", "family_of", "llama_tokenizer", "tokenizer_absence", "no_tokenizer_reason",
           "SUPPORTED_MODEL_TYPES", "MODEL_NAMES", "FETCHED_MODELS", "DEFAULT_MODEL", "resolve_model"]


def _llama_types() -> tuple[str, ...]:
    from .llama.config import MODEL_TYPES, TEXT_PARTS

    return MODEL_TYPES + tuple(TEXT_PARTS)  # (a multimodal gemma3: its text decoder)


SUPPORTED_MODEL_TYPES = ("gpt2", *_llama_types(), "bert")

# Tokenizer classes of tokenizer_config.json that are GPT-2's byte-level BPE with GPT-2's pre-tokenizer.
_GPT2_TOKENIZER_CLASSES = ("GPT2Tokenizer", "GPT2TokenizerFast")


# ----------------------------------------------------------------------------- shipped models, by name

_DATA = Path(__file__).resolve().parent / "data"

#: name -> the directory of a model shipped with the package (module docstring: the rule).
MODEL_NAMES: dict[str, Path] = {
    "shakespeare-gpt2": _DATA / "default",
    "shakespeare-llama": _DATA / "shakespeare-llama",
}
DEFAULT_MODEL = "shakespeare-gpt2"

#: name -> a pretrained GGUF model fetched on first use into the data directory (<repo>/.cache, or
#: REFIMPL_DATA_DIR) by `scripts/fetch_data.py NAME` (sha256-checked): the path under that directory.
FETCHED_MODELS: dict[str, str] = {
    "smollm2-135m-instruct": "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m": "gemma-3-270m/gemma-3-270m-q4_k_m.gguf",
}
_REPO = Path(__file__).resolve().parent.parent


def _fetched_model(name: str) -> Path:
    """The GGUF file of FETCHED_MODELS[name], fetched first when missing (scripts/fetch_data.py, in a source
    checkout), or a one-line WeightFileError saying the command that fetches it."""
    import subprocess

    path = Path(os.environ.get("REFIMPL_DATA_DIR") or _REPO / ".cache") / FETCHED_MODELS[name]
    if path.is_file():
        return path
    script = _REPO / "scripts" / "fetch_data.py"
    command = f"python scripts/fetch_data.py {name}"
    if not script.is_file():
        raise WeightFileError(f"the model {name!r} is not downloaded ({path} is missing) and this installation has no "
                              f"scripts/fetch_data.py: in a source checkout of refimpl, run `{command}`")
    print(f"fetching {name!r} into {path.parent} ({command})", file=sys.stderr)
    done = subprocess.run([sys.executable, str(script), name], check=False)
    if done.returncode != 0 or not path.is_file():
        raise WeightFileError(f"fetching the model {name!r} failed (`{command}` exited with {done.returncode}); "
                              f"{path} is missing")
    return path


def resolve_model(name_or_path) -> Path:
    """The path a model name or path stands for: an existing path; else a name's shipped directory; else the path.

    None is DEFAULT_MODEL. A name in MODEL_NAMES whose directory (with its config.json) is missing is
    a WeightFileError saying so in one line. A name in FETCHED_MODELS is its GGUF file, fetched first
    when missing (_fetched_model). A path that does not exist and is no name comes back as
    it is, for the loader to report (or for export, a hub name).
    """
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    p = Path(os.path.expanduser(os.fspath(name_or_path)))
    if p.exists():
        return p
    name = os.fspath(name_or_path)
    if name in FETCHED_MODELS:
        return _fetched_model(name)
    if name in MODEL_NAMES:
        d = Path(MODEL_NAMES[name])
        if not (d / "config.json").is_file():
            raise WeightFileError(f"the shipped model {name!r} is not in this installation: {d} "
                                  f"{'has no config.json' if d.is_dir() else 'is missing'}; pass a model directory "
                                  f"instead, or another name ({', '.join(n for n in MODEL_NAMES if n != name)})")
        return d
    return p


def _names_hint() -> str:
    """A hint for a path that does not exist: the names a model may also be given by."""
    return f" (nor a shipped model's name: {', '.join([*MODEL_NAMES, *FETCHED_MODELS])})"


# ----------------------------------------------------------------------------- which family

def _config_json(path: Path) -> Path:
    return (path if path.is_dir() else path.parent) / "config.json"


def family_of(path) -> str:
    """"gpt2", "llama" or "bert" (or a registered family's name, by its Family.model_types): the family whose loader
    reads `path` (module docstring: the rule).

    path: a path or a shipped model's name (resolve_model); None is the default model.
    An unknown model_type in config.json is a WeightFileError (a ValueError) naming the file and
    listing the supported model types; a missing path is a WeightFileError naming it.
    """
    from .llama.gguf import gguf_path

    p = resolve_model(path)
    if not p.exists():
        raise WeightFileError(f"{p}: no such file or directory{_names_hint()}")
    if gguf_path(p) is not None:  # llama.cpp's format: its architecture is checked when it is read
        return "llama"
    config_json = _config_json(p)
    if not config_json.exists():
        if _llama_tensor_names(p):
            raise WeightFileError(f"{p}: no config.json {'in it' if p.is_dir() else 'beside it'}, and its tensors "
                                  "(model.embed_tokens.weight, model.layers.*) are a LLaMA-family checkpoint's, whose "
                                  "model_type, head counts and norms only a config.json gives")
        return "gpt2"
    d = config_object(read_small_file(config_json, "config"), str(config_json))
    model_type = d.get("model_type")
    if model_type is None and _llama_tensor_names(p):
        raise WeightFileError(f"{config_json}: no model_type, and the tensors (model.embed_tokens.weight, "
                              "model.layers.*) are a LLaMA-family checkpoint's; add \"model_type\": one of "
                              f"{', '.join(_llama_types())}")
    if model_type is None or model_type == "gpt2":
        return "gpt2"
    if model_type in _llama_types():
        return "llama"
    if model_type == "bert":
        return "bert"
    from .families import of_model_type, registered_model_types

    fam = of_model_type(model_type) if isinstance(model_type, str) else None  # a family added by families.register
    if fam is not None:
        return fam.name
    raise WeightFileError(f"{config_json}: model_type {model_type!r:.60} is not supported; refimpl reads "
                          f"{', '.join((*SUPPORTED_MODEL_TYPES, *registered_model_types()))}")


def _llama_tensor_names(p: Path) -> bool:
    """Whether the safetensors weights at p (a file, or a folder's model.safetensors or index) hold the LLaMA
    family's names: what the header or index says, read within their size limits; False where there are none."""
    from .llama.io import _weight_names

    try:
        names = _weight_names(p)
    except (OSError, ValueError):  # (unreadable: the GPT-2 loader's error names the file)
        return False
    return names is not None and any(n == "model.embed_tokens.weight" or n.startswith("model.layers.") for n in names)


# ----------------------------------------------------------------------------- load

def load(path=None, **kw):
    """The model at `path`: a GPT2Model, a LlamaModel or a BertModel, chosen by family_of(path).

    kw: passed to the family's loader: dtype (every family; float32 by default), mmap (LLaMA
    family: map single safetensors files; not for GGUF), weights (GGUF: "float", the default, or "quantized": the
    block-quantized matrices kept as their blocks, refimpl.llama.gguf.load_gguf) and activations ("q8": products
    round x as llama.cpp's do), flavor (BERT's tokenizer flavor). A keyword the
    family's loader does not take is a TypeError naming it.
    path: a path, or a shipped model's name ("shakespeare-gpt2", "shakespeare-llama"; resolve_model).
    path=None: the default, "shakespeare-gpt2" (the GPT-2 shipped with the package).
    """
    from .llama.gguf import gguf_path, load_gguf_model

    path = resolve_model(path)
    family = family_of(path)
    if gguf_path(path) is not None:
        if set(kw) - {"dtype", "weights", "activations"}:
            raise TypeError(f"load() of a GGUF model takes the keywords dtype, weights, activations; got "
                            f"{sorted(set(kw) - {'dtype', 'weights', 'activations'})}")
        return load_gguf_model(gguf_path(path), **kw)
    from .families import named

    loader = named(family)
    unknown = sorted(set(kw) - set(loader.load_keywords))
    if unknown:
        raise TypeError(f"load() of a {family} model takes the keywords {list(loader.load_keywords)}; got {unknown}")
    if loader.front_door_tokenizer:  # (a rule that reads other families' tokenizer files too: llama_tokenizer)
        return loader.load(path, tokenizer=llama_tokenizer, **kw)
    return loader.load(path, **kw)


# ----------------------------------------------------------------------------- the LLaMA family's tokenizer

def tokenizer_absence(directory) -> str | None:
    """Why the directory has no tokenizer refimpl reads (one sentence), or None when it has one (llama_tokenizer)
    or a file that cannot be read (llama_tokenizer's error then names it).

    GPT-2's loader reads GPT-2-style files (`_gpt2_tokenizer_absence`); refimpl.tokenizers
    reads the rest (tokenizer.json of any BPE kind, a SentencePiece BPE tokenizer.model,
    tekken.json).
    """
    why = _gpt2_tokenizer_absence(directory)
    if why is None:
        return None
    from .tokenizers import TokenizerFileError, load as load_tokenizer
    from .tokenizers.formats import TokenizerNotImplemented

    try:
        load_tokenizer(directory)
    except FileNotFoundError:  # no tokenizer file at all
        return (f"{directory}: no tokenizer refimpl reads: it looks for tokenizer.json, tokenizer.model, tekken.json "
                "or vocab.json + merges.txt")
    except TokenizerNotImplemented as e:  # files of a kind neither loader implements
        return f"{why}; refimpl.tokenizers: {e}"
    except TokenizerFileError:  # broken: llama_tokenizer's error names the file
        return None
    return None


def no_tokenizer_reason(name_or_path, none: str = "this model has no tokenizer files") -> str:
    """Why a loaded model has no tokenizer, for a command's one-line error: the error refimpl.tokenizers
    gives for the tokenizer file beside it (a file cut short, which the command's loader set aside, or a
    kind it does not implement); else `none`."""
    from .tokenizers import TokenizerFileError, load as load_tokenizer

    p = resolve_model(name_or_path)
    try:
        load_tokenizer(p if p.is_dir() else p.parent)
    except TokenizerFileError as e:
        return str(e)
    except FileNotFoundError:
        pass
    return none


def _gpt2_tokenizer_absence(directory) -> str | None:
    """Why GPT-2's tokenizer loader does not apply to the directory (one sentence), or None when it does.

    GPT-2's loader applies when the directory holds GPT-2-style tokenizer files
    (refimpl.gpt2.tokenizer.tokenizer_files) and nothing says they are of another kind:
    tokenizer_config.json's tokenizer_class, if given, is GPT-2's, and tokenizer.json, if
    there, is a BPE model with a ByteLevel pre-tokenizer (or none) and no normalizer. A
    tokenizer.json that is not valid JSON is left to the loader, which names the broken file.
    """
    import json

    from .gpt2.tokenizer import tokenizer_files

    d = Path(directory)
    if (d / "tokenizer_config.json").is_file():
        try:
            cls = json.loads(read_small_file(d / "tokenizer_config.json", "tokenizer config")).get("tokenizer_class")
        except (ValueError, AttributeError, OSError):
            cls = None
        if isinstance(cls, str) and cls not in _GPT2_TOKENIZER_CLASSES:
            return (f"{d}: its tokenizer_config.json names tokenizer_class {cls!r:.60}; refimpl reads GPT-2's "
                    f"byte-level BPE only ({', '.join(_GPT2_TOKENIZER_CLASSES)})")
    if not tokenizer_files(d):
        spm = " (tokenizer.model, a SentencePiece model, is there: refimpl does not read it)" if (
            d / "tokenizer.model").exists() else ""
        return (f"{d}: no tokenizer refimpl reads{spm}; it reads GPT-2-style byte-level BPE files "
                "(vocab.json + merges.txt, or a ByteLevel tokenizer.json)")
    if (d / "tokenizer.json").is_file():
        try:
            data = json.loads(read_small_file(d / "tokenizer.json", "tokenizer file"))
        except (ValueError, OSError):
            return None  # broken: the loader's error names it
        if isinstance(data, dict):
            other = _other_kind(data)
            if other:
                return (f"{d / 'tokenizer.json'}: a tokenizer of another kind ({', '.join(other)}); refimpl reads "
                        "GPT-2's byte-level BPE only (model BPE, pre_tokenizer ByteLevel, no normalizer, no "
                        "tokens added to every encoding)")
    return None


def _other_kind(data: dict) -> list[str]:
    """What makes a tokenizer.json's tokenizer other than GPT-2's byte-level BPE ([] if nothing): its model type,
    pre-tokenizer, normalizer, a post-processor that adds tokens (a BOS), or BPE options GPT-2 does not use."""
    from .gpt2.tokenizer import _adds_no_tokens

    model, pre, norm = data.get("model"), data.get("pre_tokenizer"), data.get("normalizer")
    model = model if isinstance(model, dict) else {}
    kind = model.get("type", "BPE")
    pre_kind = pre.get("type") if isinstance(pre, dict) else pre
    norm_kind = norm.get("type") if isinstance(norm, dict) else norm
    found = []
    if kind != "BPE":
        found.append(f"model {kind!r:.30}")
    if pre_kind not in (None, "ByteLevel"):
        found.append(f"pre_tokenizer {pre_kind!r:.30}")
    elif isinstance(pre, dict) and (pre.get("add_prefix_space") or pre.get("use_regex") is False):
        found.append(f"ByteLevel with add_prefix_space={pre.get('add_prefix_space')}, use_regex={pre.get('use_regex')}")
    decoder = data.get("decoder")
    if decoder is not None and not (isinstance(decoder, dict) and decoder.get("type") == "ByteLevel"):
        found.append(f"decoder {decoder.get('type') if isinstance(decoder, dict) else decoder!r:.30}")
    if norm is not None:
        found.append(f"normalizer {norm_kind!r:.30}")
    if not _adds_no_tokens(data.get("post_processor")):
        found.append("a post_processor that adds tokens")
    for key, off in (("continuing_subword_prefix", (None, "")), ("end_of_word_suffix", (None, "")),
                     ("byte_fallback", (None, False)), ("dropout", (None, 0, 0.0)), ("unk_token", (None,))):
        if model.get(key) not in off:
            found.append(f"model.{key} {model.get(key)!r:.30}")
    return found


def llama_tokenizer(directory, vocab_size: int):
    """The tokenizer of a LLaMA-family model folder, or None when it has none refimpl reads (tokenizer_absence).

    GPT-2-style byte-level files: refimpl.gpt2.tokenizer.load_model_tokenizer (broken files are an
    error naming the file). Otherwise refimpl.tokenizers.load (tokenizer.json, then
    tokenizer.model, then tekken.json); a folder where it finds none, or only components it does
    not implement, gets None, and a file it cannot read is a TokenizerFileError naming the file.
    Either way the tokenizer's ids must fit vocab_size.
    """
    from .gpt2.tokenizer import load_model_tokenizer

    if _gpt2_tokenizer_absence(directory) is None:
        return load_model_tokenizer(directory, vocab_size)
    from .tokenizers import load as load_tokenizer
    from .tokenizers.formats import TokenizerNotImplemented

    try:
        tok = load_tokenizer(directory)
    except (FileNotFoundError, TokenizerNotImplemented):  # none, or of a kind refimpl does not implement
        return None  # (a file that exists but is broken is a TokenizerFileError naming it)
    if tok.vocab_size > vocab_size:
        raise ValueError(f"{directory}: the tokenizer has ids up to {tok.vocab_size - 1}, more than the model's "
                         f"vocab_size {vocab_size}")
    return tok


# ----------------------------------------------------------------------------- logits

def logits(model, ids, *, backend: str = "numpy", attention_mask=None, causal: bool = True,
           attention_scale=None) -> np.ndarray:  # [B, T] -> [B, T, V]; [T] -> [T, V]
    """Next-token scores at every position, by the model's family (refimpl.gpt2.logits, refimpl.llama.logits).

    Shapes: ids [B, T] -> [B, T, V]; [T] -> [T, V], in the parameters' dtype (float32 for
    load()ed models). attention_mask [B, T] (or [T]), 1 / True = real token, for left-padded
    batches. backend: a name in the family's BACKENDS (an unknown one is a ValueError listing them).
    A BertModel is an encoder without a language-model head: a TypeError says what to call instead.
    causal=False: attention without the causal mask (every position sees the whole sequence);
    attention_scale: the factor on q k^T, None (the model's own), "head-dim" (1/sqrt(D)),
    "model-width" (1/sqrt(C)) or a positive number. refimpl._switches says what they show.
    """
    from .families import of_model

    return of_model(model).logits(model, ids, backend=backend, attention_mask=attention_mask, causal=causal,
                                  attention_scale=attention_scale)


# ----------------------------------------------------------------------------- export

def export(source, out_dir, *, dtype: str = "source") -> Path:
    """Write `source` in our format (config.json + model.safetensors, tokenizer files copied) to out_dir.

    source: a local folder or file (or a shipped model's name): exported by
    refimpl.llama.io.export when its config.json names a LLaMA-family model_type, else by
    refimpl.gpt2.io.export (GPT-2 files, a pickled GPT-2 checkpoint). A BERT directory is
    refused: it is already in the format refimpl reads. Anything else is a Hugging Face hub name
    ("org/name"): its config.json is fetched first (huggingface_hub's hf_hub_download, from the
    cache HF_HUB_CACHE, and the network unless HF_HUB_OFFLINE=1), its model_type picks the
    family (gpt2 or a LLaMA-family type; any other is refused, naming it), out_dir is checked,
    and then only that model's weights (the first of model.safetensors.index.json and its
    shards, model.safetensors, pytorch_model.bin.index.json and its shards, pytorch_model.bin)
    and tokenizer files are fetched and exported as a local folder.
    dtype: "source" (default: each tensor as stored, bfloat16 kept), "float32", "bfloat16" or
    "float16" (exact only, else refused): refimpl.llama.io.export says how.
    """
    from .checkpoint import check_export_dtype, check_export_out

    check_export_dtype(dtype)
    src = resolve_model(source)  # (a shipped model's name, too)
    check_export_out(out_dir, src if src.exists() else None)  # never "", the current folder or the source
    if src.exists():
        family = family_of(src)
    else:
        from .gpt2.io import _looks_like_path

        if _looks_like_path(os.fspath(source)):
            raise WeightFileError(f"{os.fspath(source)}: no such file or directory{_names_hint()}")
        src, family = _hub_source(os.fspath(source), out_dir)
    from .families import named

    exporter = named(family)
    if exporter.export is None:
        raise WeightFileError(f"{src}: a {exporter.label} directory is read as it is by refimpl.load; there is "
                              "nothing to export")
    return exporter.export(src, out_dir, dtype=dtype)


def _hub_source(name: str, out_dir) -> tuple[Path, str]:
    """(the cache folder holding hub model `name`'s files, its family): config.json first, then, once its
    model_type is one export supports and out_dir may be replaced, the weights and tokenizer files."""
    from .checkpoint import hub_config_file, hub_model_folder
    from .gpt2.io import TOKENIZER_FILES, check_model_folder
    from .llama.io import COPIED_FILES

    config_file = hub_config_file(name)
    model_type = config_object(read_small_file(config_file, "config"), f"config.json of {name}").get("model_type")
    if model_type is None or model_type == "gpt2":
        family, files, also = "gpt2", (*TOKENIZER_FILES, "generation_config.json"), ()
    elif model_type in _llama_types():
        family, files, also = "llama", COPIED_FILES, COPIED_FILES
    else:
        raise WeightFileError(f"{name}: its config.json on the hub says model_type {model_type!r:.60}, which refimpl "
                              f"does not export; it exports {', '.join(('gpt2', *_llama_types()))}")
    check_model_folder(Path(out_dir), also=also)  # before the weights are fetched
    return hub_model_folder(name, config_file, files), family
