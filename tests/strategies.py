"""Hypothesis strategies, named by the shape letters of the glossary (README.md, "Using it").

B batch, T queries, S keys, C model width, H heads, K key/value heads, D head dim,
F FFN width, V vocab. Sizes are kept small: properties are about structure, and the
suite must run in minutes on 2 cores.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FLOAT_DTYPES = (np.float32, np.float64)


def dims(min_value: int = 1, max_value: int = 8) -> st.SearchStrategy[int]:
    """One axis length."""
    return st.integers(min_value=min_value, max_value=max_value)


def finite_arrays(shape, dtype=np.float64, *, scale: float = 3.0) -> st.SearchStrategy[np.ndarray]:
    """Arrays of `shape` with finite values in [-scale, scale] (exactly representable in `dtype`)."""
    elements = st.floats(
        min_value=-scale, max_value=scale, allow_nan=False, allow_infinity=False,
        width=np.dtype(dtype).itemsize * 8,
    )
    return hnp.arrays(dtype=dtype, shape=shape, elements=elements)


@st.composite
def random_arrays(draw, shape, dtype=np.float64, *, scale: float = 1.0) -> np.ndarray:
    """Standard-normal arrays from a drawn seed: fast to draw at any size, and shrinkable by seed."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal(shape)).astype(dtype)


@st.composite
def batch_shapes(draw, max_dims: int = 2, max_side: int = 3) -> tuple[int, ...]:
    """Leading batch axes: () or up to `max_dims` axes."""
    return tuple(draw(st.lists(dims(1, max_side), min_size=0, max_size=max_dims)))


@st.composite
def qkv_BHTD(draw, dtype=np.float64, *, max_T: int = 7, max_S: int = 9, max_D: int = 9, same_TS: bool = False):
    """(q [B, H, T, D], k [B, H, S, D], v [B, H, S, Dv]) with T != S allowed and odd sizes."""
    B = draw(dims(1, 2))
    H = draw(dims(1, 3))
    T = draw(dims(1, max_T))
    S = T if same_TS else draw(dims(1, max_S))
    D = draw(dims(1, max_D))
    Dv = draw(dims(1, max_D))
    q = draw(random_arrays((B, H, T, D), dtype))
    k = draw(random_arrays((B, H, S, D), dtype))
    v = draw(random_arrays((B, H, S, Dv), dtype))
    return q, k, v


@st.composite
def qkv_BHKTD(draw, dtype=np.float64, *, max_K: int = 3, max_G: int = 3, max_T: int = 7, max_S: int = 9,
              max_D: int = 8):
    """Grouped-query (q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv]) with H = K * G; T != S allowed."""
    B = draw(dims(1, 2))
    K = draw(dims(1, max_K))
    H = K * draw(dims(1, max_G))
    T = draw(dims(1, max_T))
    S = draw(dims(1, max_S))
    D = draw(dims(1, max_D))
    Dv = draw(dims(1, max_D))
    q = draw(random_arrays((B, H, T, D), dtype))
    k = draw(random_arrays((B, K, S, D), dtype))
    v = draw(random_arrays((B, K, S, Dv), dtype))
    return q, k, v


# ---- kernel inputs as dims dicts for accel.verify.make_case -------------------------------
# Each draws the sizes and options of one kernel's call (accel.verify's case builders make the
# arrays from a seed); `tiny` keeps the sizes small enough for the CUDA simulator. Used by
# tests/test_accel_differential.py (every registry entry) and tests/test_accel_cuda.py.

def lead_dims(max_dims: int, max_side: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Leading axes of a row kernel's input: () or up to `max_dims` axes of 1..max_side."""
    return st.lists(dims(1, max_side), min_size=0, max_size=max_dims).map(tuple)


@st.composite
def softmax_dims(draw, tiny: bool = False) -> dict:
    """x of any rank 1..3 with a drawn axis; NaN / inf entries and an all -inf row when `special`."""
    shape = (*draw(lead_dims(1 if tiny else 2, 3 if tiny else 4)), draw(dims(1, 6 if tiny else 40)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return dict(shape=shape, axis=axis, special=draw(st.booleans()))


@st.composite
def layer_norm_dims_NC(draw, tiny: bool = False) -> dict:
    """x [..., C] (optionally offset by 50, so |mean| >> std), gamma, beta [C]."""
    return dict(lead=draw(lead_dims(1 if tiny else 2, 3)), C=draw(dims(1, 8 if tiny else 64)),
                special=draw(st.booleans()), offset=draw(st.sampled_from([0.0, 50.0])))


@st.composite
def rms_norm_dims_NC(draw, tiny: bool = False) -> dict:
    """x [..., C], gamma [C]."""
    return dict(lead=draw(lead_dims(1 if tiny else 2, 3)), C=draw(dims(1, 8 if tiny else 64)),
                special=draw(st.booleans()))


@st.composite
def gelu_dims_NF(draw, tiny: bool = False) -> dict:
    """x [..., F] at a drawn scale (up to 20: the tanh saturates), b [F]."""
    return dict(lead=draw(lead_dims(1 if tiny else 2, 3)), F=draw(dims(1, 8 if tiny else 64)),
                scale=draw(st.sampled_from([1.0, 5.0, 20.0])), special=draw(st.booleans()))


@st.composite
def rope_dims_NTD(draw, tiny: bool = False) -> dict:
    """x [..., T, D] (D even), positions [T] or per batch row, partial rotary_dim, both pairings, and
    scaled frequencies with an attention factor (accel.verify's `scaling`) or none."""
    D = 2 * draw(dims(1, 3 if tiny else 8))
    rotary = draw(st.one_of(st.none(), dims(1, D // 2).map(lambda r: 2 * r)))
    return dict(lead=draw(lead_dims(1 if tiny else 2, 3)), T=draw(dims(1, 4 if tiny else 9)), D=D,
                rotary_dim=rotary, interleaved=draw(st.booleans()), per_row=draw(st.booleans()),
                max_pos=draw(st.sampled_from([16, 10000])),
                scaling=draw(st.sampled_from([None, "llama3", "yarn", "longrope"])))


@st.composite
def rope_table_dims_NTD(draw, tiny: bool = False) -> dict:
    """x [..., T, D] (D even) with cos / sin tables [..., T, R/2] per batch row or shared, partial R,
    both pairings, an attention factor a (the tables' scale) of 1 or more. Full sizes: x [B, n, T, D] and
    tables [B|1, 1, T, R/2], LlamaOps.rope's layout (rope_rotate[numba] is that operation)."""
    D = 2 * draw(dims(1, 3 if tiny else 8))
    rotary = draw(st.one_of(st.none(), dims(1, D // 2).map(lambda r: 2 * r)))
    lead = draw(lead_dims(1, 3)) if tiny else (draw(dims(1, 3)), draw(dims(1, 3)))
    return dict(lead=lead, T=draw(dims(1, 4 if tiny else 9)), D=D,
                rotary_dim=rotary, interleaved=draw(st.booleans()), per_row=draw(st.booleans()),
                factor=draw(st.sampled_from([1.0, 1.3])))


@st.composite
def glu_gate_dims_NF(draw, tiny: bool = False) -> dict:
    """g, u [..., F], each activation, g at a drawn scale (SiLU up to 800: exp(-g) overflows for g < -708),
    NaN / inf in g and u (`special`), maybe the two halves of one [..., 2F] array (`strided`)."""
    activation = draw(st.sampled_from(["silu", "gelu_tanh", "gelu_erf"]))
    scales = [1.0, 5.0, 20.0] + ([800.0] if activation == "silu" else [])
    return dict(lead=draw(lead_dims(1 if tiny else 2, 3)), F=draw(dims(1, 8 if tiny else 64)),
                scale=draw(st.sampled_from(scales)), activation=activation, special=draw(st.booleans()),
                strided=draw(st.booleans()))


@st.composite
def attention_dims_BHKTSD(draw, tiny: bool = False, *, max_G: int | None = None, max_T: int | None = None,
                          max_S: int | None = None, max_D: int | None = None, max_Dv: int | None = None,
                          random_slopes: bool = False) -> dict:
    """q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv] with H = K G, T != S (T > S too), and the
    options: causal, window, sinks (causal windows only), padding (one sequence all padding), ALiBi
    (slopes 2^-h, or also random ones), scale, NaN / inf in q and k (`special`)."""
    K = draw(dims(1, 2 if tiny else 3))
    G = draw(dims(1, max_G or (2 if tiny else 3)))
    causal = draw(st.booleans())
    window = draw(st.one_of(st.none(), dims(1, 4 if tiny else 20)))
    n_sink = draw(st.integers(0, 3)) if (window and causal) else 0
    alibi = draw(st.sampled_from([False, True, "random"] if random_slopes else [False, True]))
    return dict(B=draw(dims(1, 2)), H=K * G, K=K, T=draw(dims(1, max_T or (6 if tiny else 40))),
                S=draw(dims(1, max_S or (8 if tiny else 80))), D=draw(dims(1, max_D or (5 if tiny else 33))),
                Dv=draw(dims(1, max_Dv or (4 if tiny else 17))), causal=causal, window=window, n_sink=n_sink,
                padding=draw(st.booleans()), alibi=alibi,
                scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))), special=draw(st.booleans()))


@st.composite
def decode_dims_BHKSD(draw, tiny: bool = False, *, max_G: int | None = None, max_S: int | None = None,
                      max_D: int | None = None, max_Dv: int | None = None) -> dict:
    """q [B, H, D], a cache k [B, K, S, D], v [B, K, S, Dv] with H = K G, ragged key lengths 0..S
    (`lengths`), NaN / inf in q, k and in v past the lengths (`special`)."""
    K = draw(dims(1, 2 if tiny else 3))
    G = draw(dims(1, max_G or (2 if tiny else 3)))
    return dict(B=draw(dims(1, 3)), H=K * G, K=K, S=draw(dims(1, max_S or (8 if tiny else 200))),
                D=draw(dims(1, max_D or (5 if tiny else 33))), Dv=draw(dims(1, max_Dv or (4 if tiny else 17))),
                lengths=draw(st.booleans()), special=draw(st.booleans()))


@st.composite
def quantized_matvec_dims(draw, tiny: bool = False) -> dict:
    """W [N, K] in Q8_0 or Q4_1 blocks (K a multiple of 32, up to 512;
    N with tails past whole row blocks), x [..., K]."""
    return dict(fmt=draw(st.sampled_from(["Q8_0", "Q4_1"])), lead=draw(lead_dims(1, 2)),
                N=draw(dims(1, 8 if tiny else 200)), K=32 * draw(dims(1, 2 if tiny else 16)))


@st.composite
def quantized_matmul_dims(draw, tiny: bool = False) -> dict:
    """W [N, K] in Q8_0 or Q4_1 blocks (K a multiple of 32, up to 256), x [..., K] with up to 20 rows: tails of rows
    of x and of W past whole 4 x 4 tiles."""
    return dict(fmt=draw(st.sampled_from(["Q8_0", "Q4_1"])), lead=(draw(dims(1, 6 if tiny else 20)),),
                N=draw(dims(1, 8 if tiny else 90)), K=32 * draw(dims(1, 2 if tiny else 8)))


@st.composite
def linear_dims(draw, tiny: bool = False) -> dict:
    """x [..., in], W [in, out] C- or F-contiguous (a stored [out, in] read transposed), with or without a bias;
    in <= 96 (the registry's linear tolerance assumes it)."""
    return dict(lead=draw(lead_dims(2, 3)), n_in=draw(dims(1, 8 if tiny else 96)),
                n_out=draw(dims(1, 8 if tiny else 64)), bias=draw(st.booleans()),
                layout=draw(st.sampled_from(["C", "F"])))


@st.composite
def lm_head_dims(draw, tiny: bool = False) -> dict:
    """h [B, T, C] of a tiny LLaMA-family model (accel.steps.FAMILIES; Gemma-2's capped logits): up to 8 rows on
    the numba lm_head's matvec path, more on its BLAS path."""
    return dict(family=draw(st.sampled_from(["llama", "qwen2", "gemma2"])),
                lead=(draw(dims(1, 3)), draw(dims(1, 2 if tiny else 6))))


KERNEL_DIMS = {  # kernel name -> its dims strategy (called with tiny=...)
    "softmax": softmax_dims,
    "layer_norm": layer_norm_dims_NC,
    "rms_norm": rms_norm_dims_NC,
    "gelu_tanh_bias": gelu_dims_NF,
    "gelu_tanh": gelu_dims_NF,
    "apply_rope": rope_dims_NTD,
    "rope_rotate": rope_table_dims_NTD,
    "glu_gate": glu_gate_dims_NF,
    "masked_attention": attention_dims_BHKTSD,
    "decode_attention": decode_dims_BHKSD,
    "quantized_matvec": quantized_matvec_dims,
    "quantized_matvec_q8": quantized_matvec_dims,
    "quantized_matmul": quantized_matmul_dims,
    "linear": linear_dims,
    "lm_head": lm_head_dims,
}


# ---- text for the tokenizer (tests/test_tokenizer.py) ------------------------------------

# Characters where GPT-2's pre-tokenizer is easy to get wrong: White_Space and its look-alikes
# (U+001C..U+001F are str.isspace() but not White_Space), apostrophes, combining marks, ZWJ.
TRICKY_CHARS = (
    " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2009\u200a\u200b\u2028\u2029\u202f\u205f\u3000\ufeff"
    "'’‘\"`sdmtlrevSDMTLREVaZ09٣۳߃१²½Ⅻ!?.,;:-_()[]{}<>|/\\@#$%^&*+=~"
    "\u0301\u0308\u200d\ufe0féßøДжαΩ你好世界こんにちはカタカナ한국어😀👩🏽🧑‍💻\U0001f1ef\U0001f1f5"
)


def unicode_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Text over every character assigned in Python's Unicode database (no surrogates).

    Unassigned code points (category Cn) are left out: tiktoken's regex knows a later
    Unicode version, where some of them are letters or numbers (see refimpl.gpt2.bpe).
    """
    return st.text(st.characters(exclude_categories=("Cs", "Cn")), max_size=max_size)


def tricky_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Mixes of whitespace, apostrophes, letters, digits, punctuation, marks and emoji."""
    return st.text(st.sampled_from(TRICKY_CHARS), max_size=max_size)


def seam_attention_problem(rng, B, H, T, S, D, kwargs: dict, n_pad: int):
    """(q, k, v, kwargs) for a call of an Ops seam's attention: float64 q [B, H, T, D], k, v [B, H, S, D],
    and kwargs with key_mask="padded" made a [B, S] mask whose row 0 pads its first n_pad keys, and a
    list of alibi_slopes made an array (the parametrized cases keep plain values)."""
    q = rng.standard_normal((B, H, T, D))
    k, v = rng.standard_normal((B, H, S, D)), rng.standard_normal((B, H, S, D))
    if kwargs.get("key_mask") == "padded":
        key = np.ones((B, S), dtype=bool)
        key[0, :n_pad] = False
        kwargs = {**kwargs, "key_mask": key}
    if "alibi_slopes" in kwargs:
        kwargs = {**kwargs, "alibi_slopes": np.array(kwargs["alibi_slopes"])}
    return q, k, v, kwargs


# ---- Gemma-2 / Mistral options for the attention kernels (soft cap, decode window) ----------

def softcaps() -> st.SearchStrategy:
    """A soft cap c for c tanh(s / c): None (no cap), a strong one (scores here reach ~5), or Gemma-2's 50."""
    return st.one_of(st.none(), st.sampled_from([0.5, 1.0, 3.0, 50.0]))


@st.composite
def attention_dims_softcap_BHKTSD(draw, tiny: bool = False, **kwargs) -> dict:
    """attention_dims_BHKTSD's dims with a drawn `softcap` (None for about half the draws)."""
    return dict(draw(attention_dims_BHKTSD(tiny, **kwargs)), softcap=draw(softcaps()))


@st.composite
def decode_dims_window_softcap_BHKSD(draw, tiny: bool = False, **kwargs) -> dict:
    """decode_dims_BHKSD's dims with a drawn sliding `window` (None, or 1 .. S + 2: inside the cache and past it)
    and `softcap`."""
    d = draw(decode_dims_BHKSD(tiny, **kwargs))
    return dict(d, window=draw(st.one_of(st.none(), dims(1, d["S"] + 2))), softcap=draw(softcaps()))


# The differential suite (and tests/test_accel_cuda.py) draw these options for every backend's
# attention kernels.
KERNEL_DIMS["masked_attention"] = attention_dims_softcap_BHKTSD
KERNEL_DIMS["decode_attention"] = decode_dims_window_softcap_BHKSD
