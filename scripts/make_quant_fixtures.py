"""Make tests/data/quant_fixtures.npz: llama.cpp's own quantizer and dequantizer outputs, for
tests/test_quant.py to compare refimpl.quant with bit for bit.

    python scripts/make_quant_fixtures.py                    # ggml from an installed llama-cpp-python
    python scripts/make_quant_fixtures.py --ggml PATH.so     # any build of ggml's base library
    .venv/bin/python scripts/make_quant_fixtures.py --ggml .../llama_cpp/lib/libggml-base.so.0 \
        --check-model-quantize                              # also llama_model_quantize (needs gguf)

The first form needs only NumPy and llama-cpp-python (keep that in its own virtual environment).

The oracle is ggml's base library (libggml-base, shipped inside llama-cpp-python's wheel as
llama_cpp/lib/libggml-base.so), called through ctypes:

- quantize: `ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row, NULL)`, the function
  llama.cpp's quantizer (`llama_model_quantize`, i.e. llama-quantize) calls on each tensor; without
  an importance matrix it runs ggml-quants.c's `quantize_row_*_ref`. Inputs: rows of 256 float32 of
  14 kinds (Gaussian at scales from 1e-30 to 1e18, heavy-tailed, sparse, one-signed, constant, signed
  zeros, exact .5 ties, outliers), for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
- dequantize: `dequantize_row_<type>` on random blocks (with special f16 scales: zero, subnormal,
  inf, NaN) for every block format refimpl.quant decodes, Q8_K and IQ4_NL / IQ4_XS included.
- conversions: f16 / bf16 -> f32 of all 65536 bit patterns (stored as a SHA-256), and f32 -> f16 /
  bf16 (ggml_fp32_to_fp16_row, ggml_fp32_to_bf16_row_ref) of random float32 bit patterns.

With --check-model-quantize it also runs llama.cpp's whole file quantizer: it writes a small F32
LLaMA-architecture GGUF with the gguf package (t(4)-distributed weights), quantizes it with
`llama_model_quantize` (libllama, `pure` so every matrix gets the requested type) to each of the
eight types, and prints how many blocks of each output equal refimpl.quant.quantize's.

Everything is seeded; the file is ~140 KB. Build llama-cpp-python from source without a GPU, e.g.
`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` then
`CMAKE_ARGS="-DGGML_NATIVE=OFF" pip wheel --no-deps <sdist>` into its own virtual environment (the
reference quantizers are plain C: GGML_NATIVE=OFF keeps the compiler from fusing a*b+c into FMAs).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "quant_fixtures.npz"

# ggml's enum ggml_type ids and block sizes (the same as refimpl.quant's table; repeated here so the
# script runs in a bare environment next to llama-cpp-python).
TYPES = {  # name: (id, values per block, bytes per block)
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34),
    "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210), "Q8_K": (15, 256, 292), "IQ4_NL": (20, 32, 18), "IQ4_XS": (23, 256, 136),
}
QUANTIZED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0]}
SPECIAL_F16 = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x7D01, 0xFE5A]


def find_ggml() -> Path:
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llama-cpp-python is not installed here: pass --ggml PATH to libggml-base")
    libs = sorted(Path(llama_cpp.__file__).parent.glob("lib/libggml-base.*"))
    if not libs:
        sys.exit(f"no libggml-base under {Path(llama_cpp.__file__).parent / 'lib'}: pass --ggml PATH")
    return libs[0]


def input_rows(rng: np.random.Generator, per_kind: int = 4, n: int = 256) -> tuple[np.ndarray, list[str]]:
    """float32 [rows, n] of the kinds below, `per_kind` rows each, and each row's kind."""
    kinds = {
        "gauss": lambda: rng.standard_normal(n),
        "gauss_1e-4": lambda: 1e-4 * rng.standard_normal(n),
        "gauss_1e3": lambda: 1e3 * rng.standard_normal(n),
        "gauss_1e-30": lambda: 1e-30 * rng.standard_normal(n),   # f16 scales underflow to zero / subnormals
        "gauss_1e18": lambda: 1e18 * rng.standard_normal(n),     # f16 scales overflow; k-quant sums of x^2 too
        "student_t2": lambda: rng.standard_t(2, n),
        "sparse": lambda: rng.standard_normal(n) * (rng.random(n) < 0.1),
        "positive": lambda: np.abs(rng.standard_normal(n)) + 0.5,
        "negative": lambda: -np.abs(rng.standard_normal(n)) - 0.1,
        "uniform": lambda: rng.uniform(-1, 1, n),
        "outlier": lambda: np.where(np.arange(n) == rng.integers(n), 50.0, rng.standard_normal(n)),
        "constant": lambda: np.full(n, rng.standard_normal()),
        "signed_zeros": lambda: np.where(rng.random(n) < 0.5, -0.0, 0.0),
        "ties": lambda: np.where(np.arange(n) % 32 == 0, 8.0, rng.integers(-16, 17, n) / 2.0),
    }
    rows, names = [], []
    for name, make in kinds.items():
        for _ in range(per_kind):
            rows.append(make())
            names.append(name)
    return np.array(rows, dtype=np.float32), names


def random_blocks(rng: np.random.Generator, name: str, n_blocks: int) -> np.ndarray:
    """uint8 [n_blocks * bytes_per_block]: random bytes, one all-0x00 and one all-0xFF block, and special
    f16 scales in some blocks."""
    _, _, bpb = TYPES[name]
    b = rng.integers(0, 256, (n_blocks, bpb), dtype=np.uint8)
    b[0], b[1] = 0x00, 0xFF
    for at in F16_FIELDS.get(name, []):
        for i in range(2, n_blocks, 2):
            b[i, at:at + 2] = np.frombuffer(np.uint16(SPECIAL_F16[(i + at) % len(SPECIAL_F16)]).tobytes(), np.uint8)
    return b.reshape(-1)


class _QuantizeParams(ctypes.Structure):  # llama.h's llama_model_quantize_params (llama.cpp of llama-cpp-python 0.3.36)
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int), ("output_tensor_type", ctypes.c_int),
                ("token_embedding_type", ctypes.c_int), ("allow_requantize", ctypes.c_bool),
                ("quantize_output_tensor", ctypes.c_bool), ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool), ("imatrix", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("tt_overrides", ctypes.c_void_p),
                ("prune_layers", ctypes.c_void_p), ("max_buf_size", ctypes.c_size_t)]


# llama_ftype
LLAMA_FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18}


def check_model_quantize(lib_dir: Path, work: Path) -> None:
    """llama_model_quantize an F32 GGUF to each type; count the blocks equal to refimpl.quant.quantize's."""
    import gguf

    sys.path.insert(0, str(ROOT))
    from refimpl.quant import ggml_type, quantize

    for name in ("libggml-base", "libggml-cpu", "libggml"):
        ctypes.CDLL(str(next(lib_dir.glob(f"{name}.so*"))), mode=ctypes.RTLD_GLOBAL)
    llama = ctypes.CDLL(str(next(lib_dir.glob("libllama.so*"))))
    llama.llama_model_quantize_default_params.restype = _QuantizeParams
    llama.llama_backend_init()
    rng = np.random.default_rng(5)
    C, F, V, L = 256, 512, 512, 2
    src = work / "f32.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_context_length(128), w.add_embedding_length(C), w.add_block_count(L), w.add_feed_forward_length(F)
    w.add_head_count(4), w.add_head_count_kv(4), w.add_layer_norm_rms_eps(1e-5), w.add_rope_dimension_count(64)
    w.add_file_type(0), w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}".encode() for i in range(V)]), w.add_token_scores([0.0] * V), w.add_token_types([1] * V)
    weights = {}
    shapes = {"token_embd.weight": (V, C), "output_norm.weight": (C,), "output.weight": (V, C)}
    for i in range(L):
        shapes.update({f"blk.{i}.{n}.weight": s for n, s in [
            ("attn_norm", (C,)), ("attn_q", (C, C)), ("attn_k", (C, C)), ("attn_v", (C, C)), ("attn_output", (C, C)),
            ("ffn_norm", (C,)), ("ffn_gate", (F, C)), ("ffn_up", (F, C)), ("ffn_down", (C, F))]})
    for tname, shape in shapes.items():
        weights[tname] = (0.02 * rng.standard_t(4, shape)).astype(np.float32)
        w.add_tensor(tname, weights[tname])
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    for name, ftype in LLAMA_FTYPES.items():
        params = llama.llama_model_quantize_default_params()
        params.ftype, params.pure, params.nthread = ftype, True, 1
        dst = work / f"{name}.gguf"
        if llama.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
            sys.exit(f"llama_model_quantize failed for {name}")
        same = total = 0
        for t in gguf.GGUFReader(dst).tensors:
            if t.tensor_type.name == name:
                bpb = ggml_type(name).bytes_per_block
                ours = quantize(weights[t.name], name).reshape(-1, bpb)
                eq = np.all(ours == np.asarray(t.data).reshape(-1).view(np.uint8).reshape(-1, bpb), axis=1)
                same, total = same + int(eq.sum()), total + eq.size
        print(f"llama_model_quantize {name}: {same} / {total} blocks identical to refimpl.quant.quantize")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ggml", type=Path, help="path of libggml-base (default: llama-cpp-python's)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check-model-quantize", action="store_true",
                    help="also quantize a small F32 GGUF with llama_model_quantize (libllama next to libggml-base)")
    args = ap.parse_args()
    path = args.ggml or find_ggml()
    if args.check_model_quantize:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            check_model_quantize(path.parent, Path(tmp))
    lib = ctypes.CDLL(str(path))
    ptr = ctypes.c_void_p
    rng = np.random.default_rng(20240607)
    out: dict[str, np.ndarray] = {}

    x, kinds = input_rows(rng)
    out["quantize_input"] = x
    out["quantize_kinds"] = np.array(kinds)
    chunk = getattr(lib, "ggml_quantize_chunk", None)
    for name in QUANTIZED:
        tid, vpb, bpb = TYPES[name]
        dst = np.zeros(x.size // vpb * bpb, dtype=np.uint8)
        if chunk is not None:
            chunk.restype = ctypes.c_size_t
            written = chunk(ctypes.c_int(tid), ptr(x.ctypes.data), ptr(dst.ctypes.data), ctypes.c_int64(0),
                            ctypes.c_int64(x.shape[0]), ctypes.c_int64(x.shape[1]), ptr(None))
            assert written == dst.size, (name, written, dst.size)
        else:  # ggml-quants.c built alone: its reference quantizer, which ggml_quantize_chunk calls
            getattr(lib, f"quantize_row_{name.lower().replace('_k', '_K')}_ref")(
                ptr(x.ctypes.data), ptr(dst.ctypes.data), ctypes.c_int64(x.size))
        out[f"quantize_{name}"] = dst

    for name, (tid, vpb, bpb) in TYPES.items():
        data = random_blocks(rng, name, 24 if vpb == 32 else 6)
        y = np.zeros(data.size // bpb * vpb, dtype=np.float32)
        fn = getattr(lib, f"dequantize_row_{name.lower().replace('_k', '_K')}")
        fn(ptr(data.ctypes.data), ptr(y.ctypes.data), ctypes.c_int64(y.size))
        out[f"dequantize_{name}_bytes"] = data
        out[f"dequantize_{name}_values"] = y

    # f16 / bf16 -> f32 on all 65536 bit patterns (kept as a SHA-256 of the 256 KB of float32), and
    # f32 -> f16 / bf16 on random float32 bit patterns (every exponent, NaN payloads, exact ties)
    if hasattr(lib, "ggml_fp16_to_fp32_row"):
        import hashlib
        every = np.arange(65536, dtype=np.uint16)
        for name, fn in (("f16", lib.ggml_fp16_to_fp32_row), ("bf16", lib.ggml_bf16_to_fp32_row)):
            y = np.zeros(65536, dtype=np.float32)
            fn(ptr(every.ctypes.data), ptr(y.ctypes.data), ctypes.c_int64(65536))
            out[f"{name}_to_f32_all_sha256"] = np.array(hashlib.sha256(y.tobytes()).hexdigest())
        bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
        bits[:512] = (bits[:512] & 0xFFFF0000) | 0x8000      # bf16 ties
        bits[512:1024] = (bits[512:1024] & 0xFFFFE000) | 0x1000  # f16 ties
        f = bits.view(np.float32)
        out["f32_to_half_input"] = f
        for name, fn in (("f16", lib.ggml_fp32_to_fp16_row), ("bf16", lib.ggml_fp32_to_bf16_row_ref)):
            h = np.zeros(f.size, dtype=np.uint16)
            fn(ptr(f.ctypes.data), ptr(h.ctypes.data), ctypes.c_int64(f.size))
            out[f"f32_to_{name}"] = h

    out["ggml_library"] = np.array(path.name)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **out)
    print(f"{args.out}: {args.out.stat().st_size} bytes from {path}")


if __name__ == "__main__":
    main()
