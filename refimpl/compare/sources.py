"""Where activations come from: the reference model, a file of theirs, a live Hugging Face model; and the dump writer.

    reference_activations(model, ids)  {refimpl name: array} at every hook point, in data-flow
                                       order, and "logits" (refimpl.interp.run_with_cache)
    read_activations(path, max_bytes)  (arrays, ids or None, their stored dtype) from .safetensors
                                       or .npz (never a pickle); ids under the key "__ids__"
    read_ids(path)                     only the ids "__ids__" of such a file (or None)
    dump_limit(reference)              the most bytes a dump comparable with `reference` needs
    dump(path, activations, ids=None)  write such a file (.safetensors or .npz by the suffix)
    hf_activations(path, ids, dtype)   a Hugging Face *ForCausalLM directory run with
                                       output_hidden_states / output_attentions (needs transformers)

The file format is a plain dict of arrays so that any framework can write it; the README
shows a five-line NumPy function for a porter's side that needs nothing from this package.
"""

from __future__ import annotations

import zipfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from .._files import write_bytes_atomic
from ..checkpoint import NPZ_ERRORS, WeightFileError, npz_read, open_weights
from ..safetensors import SafetensorsError, read_header, read_tensor, save

__all__ = ["IDS_KEY", "n_layers", "reference_activations", "read_activations", "read_ids", "dump_limit", "dump",
           "hf_activations"]

IDS_KEY = "__ids__"
MAX_IDS_BYTES = 1 << 24  # the token ids of a dump: 2^21 int64 ids at most

_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def n_layers(model) -> int:
    """The number of blocks of a refimpl model (GPT-2's n_layer, the LLaMA family's num_hidden_layers)."""
    from ..families import of_model

    return of_model(model).n_layers(model.config)


def reference_activations(model, ids) -> dict[str, np.ndarray]:
    """Every hook point of the reference run on ids ([T] or [B, T]),
    in the order the forward reaches them, then "logits"."""
    from ..interp.capture import run_with_cache

    logits, acts = run_with_cache(model, ids)
    acts["logits"] = logits
    return acts


def dump_limit(reference: dict) -> int:
    """The most bytes of arrays a dump compared with `reference` is read up to: every reference point twice
    (names of two conventions) in float64, plus 1 MiB; a file declaring more is refused before it is read."""
    return 2 * 8 * sum(int(np.asarray(a).size) for a in reference.values()) + (1 << 20)


def _npz_members(path: Path, stack: ExitStack) -> tuple[zipfile.ZipFile, list[str]]:
    z = stack.enter_context(zipfile.ZipFile(stack.enter_context(open_weights(path, "activation file"))))
    members = z.namelist()
    if len(set(members)) != len(members):
        raise WeightFileError("an entry appears twice in the archive")
    for m in members:
        if not m.endswith(".npy"):
            raise WeightFileError(f"npz entry {m!r} is not a .npy array")
    return z, members


def read_ids(path) -> np.ndarray | None:
    """The token ids stored under "__ids__" in a .safetensors or .npz dump (at most MAX_IDS_BYTES), or None;
    nothing else of the file is read (its size checks are read_activations')."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        try:
            header = read_header(path)
            if IDS_KEY not in header.tensors:
                return None
            if header.tensors[IDS_KEY].numel * 8 > MAX_IDS_BYTES:
                raise SafetensorsError(f"{IDS_KEY!r} holds more than {MAX_IDS_BYTES // 8:,} ids")
            ids = read_tensor(path, header, IDS_KEY)
        except (SafetensorsError, OSError) as e:
            raise ValueError(f"{path}: not a readable .safetensors file: {e}") from None
    elif suffix == ".npz":
        with ExitStack() as stack, _npz_errors(path):
            z, members = _npz_members(path, stack)
            if IDS_KEY + ".npy" not in members:
                return None
            ids = npz_read(z, IDS_KEY + ".npy", max_bytes=MAX_IDS_BYTES)
    else:
        raise ValueError(f"{path}: activations must be a .safetensors or .npz file (no pickle); got "
                         f"{suffix or 'no suffix'!r}")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{path}: {IDS_KEY!r} must hold integer token ids; got dtype {ids.dtype}")
    return ids


def read_activations(path, max_bytes: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None]:
    """(name -> array, the token ids stored under "__ids__" or None, the least precise stored float dtype).

    .safetensors (BF16 widened exactly to float32; the stored dtype is still reported as
    bfloat16) or .npz (np.savez or np.savez_compressed; members must be .npy arrays with no Python
    objects). max_bytes: the most bytes of arrays the caller reads (dump_limit); a file whose entries
    declare more is refused before any is read (an .npz entry's declared size is checked against its
    compressed bytes too, and read in bounded chunks: refimpl.checkpoint.npz_read).
    Errors: another suffix (a pickle is refused), a damaged file, ids that are not integers.
    """
    path = Path(path)
    suffix = path.suffix.lower()

    def over(total: int) -> None:
        if max_bytes is not None and total > max_bytes:
            raise WeightFileError(f"its arrays hold {total:,} bytes; a dump of these activations needs at most "
                                  f"{max_bytes:,}")

    if suffix == ".safetensors":
        try:
            header = read_header(path)
        except (SafetensorsError, OSError) as e:
            raise ValueError(f"{path}: not a readable .safetensors file: {e}") from None
        try:
            over(sum(i.data_offsets[1] - i.data_offsets[0] for i in header.tensors.values()))
        except WeightFileError as e:
            raise ValueError(f"{path}: {e}") from None
        try:
            arrays = {name: read_tensor(path, header, name) for name in header.tensors}
        except (SafetensorsError, OSError) as e:
            raise ValueError(f"{path}: not a readable .safetensors file: {e}") from None
        stored = [_SAFETENSORS_DTYPES.get(info.dtype) for info in header.tensors.values()]
    elif suffix == ".npz":
        arrays = {}
        with ExitStack() as stack, _npz_errors(path):
            z, members = _npz_members(path, stack)
            over(sum(z.getinfo(m).file_size for m in members))  # declared sizes, checked again per entry
            for m in members:
                arrays[m[:-4]] = npz_read(z, m, max_bytes=max_bytes)
        stored = [a.dtype.name for a in arrays.values()]
    else:
        raise ValueError(f"{path}: activations must be a .safetensors or .npz file (no pickle); got "
                         f"{suffix or 'no suffix'!r}")
    ids = arrays.pop(IDS_KEY, None)
    if ids is not None and ids.dtype.kind not in "iu":
        raise ValueError(f"{path}: {IDS_KEY!r} must hold integer token ids; got dtype {ids.dtype}")
    order = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3}
    floats = [s for s in stored if s in order]
    return arrays, ids, (max(floats, key=order.get) if floats else None)


def dump(path, activations: dict, ids=None) -> Path:
    """Write {name: array} (and the token ids under "__ids__") to .safetensors or .npz, by the path's suffix.

    Arrays must be floating-point NumPy arrays (or convertible: np.asarray); names any strings
    (refimpl's, Hugging Face's or TransformerLens's, refimpl.compare.names). The write is atomic.
    """
    path = Path(path)
    if not isinstance(activations, dict) or not activations:
        raise ValueError("activations must be a non-empty dict of name -> array")
    out: dict[str, np.ndarray] = {}
    for name, a in activations.items():
        if not isinstance(name, str) or name == IDS_KEY:
            raise ValueError(f"activation names must be strings other than {IDS_KEY!r}; got {name!r}")
        a = np.ascontiguousarray(np.asarray(a))
        if a.dtype.kind != "f":
            raise ValueError(f"activation {name!r} has dtype {a.dtype}; expected floating-point values")
        out[name] = a
    if ids is not None:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise ValueError(f"ids must be integer token ids; got dtype {ids.dtype}")
        out[IDS_KEY] = np.ascontiguousarray(ids.astype(np.int64))
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        data = save(out)
    elif suffix == ".npz":
        import io

        buf = io.BytesIO()
        np.savez(buf, **out)
        data = buf.getvalue()
    else:
        raise ValueError(f"{path}: write .safetensors or .npz; got {suffix or 'no suffix'!r}")
    return write_bytes_atomic(path, data)


def hf_activations(model, ids, *, dtype: str = "float32") -> tuple[dict[str, np.ndarray], str]:
    """({hidden_states.i, attentions.i, logits}, dtype) of a Hugging Face *ForCausalLM on ids [T] or [B, T].

    model: a directory to load (in `dtype`: float32, float64, bfloat16, float16; eager attention,
    so the attention weights are returned), or a loaded torch model (run as it is; `dtype` is
    then what is reported). Needs torch and transformers (the test extra).
    """
    if isinstance(model, (str, Path)) and not Path(model).is_dir():  # before the seconds torch takes to import
        what = "is not a directory" if Path(model).exists() else "no such directory"
        raise ValueError(f"{model}: {what}; a Hugging Face model directory (config.json + weights) is needed")
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise ValueError(f"--hf needs torch and transformers (pip install -e '.[oracle]'): {e}") from None
    dtypes = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}; got {dtype!r}")
    if isinstance(model, (str, Path)):
        model = AutoModelForCausalLM.from_pretrained(model, dtype=dtypes[dtype], attn_implementation="eager")
    model.eval()
    x = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    single = x.ndim == 1
    with torch.no_grad():
        out = model(x[None] if single else x, output_hidden_states=True, output_attentions=True, use_cache=False)

    def host(t):
        a = t.detach().to(torch.float64 if t.dtype == torch.float64 else torch.float32).cpu().numpy()
        return a[0] if single else a

    acts = {f"hidden_states.{i}": host(h) for i, h in enumerate(out.hidden_states)}
    acts.update({f"attentions.{i}": host(a) for i, a in enumerate(out.attentions)})
    acts["logits"] = host(out.logits)
    return acts, dtype


@contextmanager
def _npz_errors(path):
    """A failed .npz read as one ValueError naming the file (a missing file's own message names it)."""
    try:
        yield
    except WeightFileError as e:
        raise ValueError(f"{path}: {e}") from None
    except OSError as e:
        raise ValueError(str(e)) from None
    except NPZ_ERRORS as e:
        raise ValueError(f"{path}: not a readable .npz archive: {type(e).__name__}: {e}") from None
