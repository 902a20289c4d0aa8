"""Position-wise feed-forward networks and their activations.

FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. 2017, sec. 3.3), and the gated variants
GLU_act(x) = (act(x W_gate) * (x W_up)) W_down (Shazeer 2020, "GLU Variants Improve
Transformer", eqs. 5-6): SwiGLU (act = SiLU, as in LLaMA) and GeGLU (act = GELU).

Activations: GELU (Hendrycks & Gimpel 2016) exactly, x * Phi(x), and in GPT-2's tanh
approximation; ReLU; SiLU / Swish-1 (Elfwing et al. 2017; Ramachandran et al. 2017).
Every function keeps its input's float dtype; constants are made in that dtype.
Each public function checks its arguments once (the checks are the last section) and calls its
body `_<name>`, the equation with no checks (inputs already validated), which callers that validated once use directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._checks import as_float, check_ndim, check_shape, check_type
from .linear import LinearParams, _check_linear, _linear
from .special import normal_cdf

__all__ = [
    "gelu_tanh",
    "gelu_tanh_bias",
    "gelu_erf",
    "relu",
    "sigmoid",
    "silu",
    "FFNParams",
    "ffn",
    "GLUParams",
    "glu",
    "glu_gate",
    "swiglu",
    "geglu",
]

# Beyond |x| = 20 the tanh in gelu_tanh is +-1 in every float dtype (its argument is
# > 0.79 * (20 + 0.044715 * 8000) = 300; tanh(u) rounds to 1 in float64 once u > 19.1).
# Clamping x there before cubing keeps x*x*x from overflowing (float32 at |x| > 7e12)
# and leaves every result unchanged.
_GELU_TANH_SATURATION = 20.0


def gelu_tanh(x) -> np.ndarray:  # [...] -> [...]
    """GELU(x) ~ x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (Hendrycks & Gimpel 2016, sec. 2).

    The approximation GPT-2 uses ("gelu_new" in Hugging Face, approximate='tanh' in PyTorch).
    Shapes: any -> same shape and dtype.
    Notes: float16 is computed in float32 and rounded once (in float16 arithmetic, 1 + tanh(u)
    cancels for x < 0). The cubic is evaluated on x clamped to [-20, 20], where tanh has already
    saturated to +-1, so |x| up to the dtype's max gives x (x > 0) or -0 (x < 0) with no
    overflow warning. gelu_tanh(x) - gelu_tanh(-x) = x exactly in real arithmetic (tanh is
    odd). Its largest gap to gelu_erf is 4.73e-4 in absolute value, at |x| = 2.70
    (measured in tests/test_ffn.py). x = -inf gives nan (-inf * 0), as in PyTorch.
    See also: gelu_erf; accel fused bias + GELU kernels (twin: gelu_tanh_bias).
    """
    return _gelu_tanh(as_float(x, "x"))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:  # [...] -> [...]; no checks: x is a float array
    xw = x.astype(np.float32) if x.dtype == np.float16 else x  # float16 in float32: 1 + tanh(u) cancels for x < 0
    t = xw.dtype.type
    lim = t(_GELU_TANH_SATURATION)
    xc = np.clip(xw, -lim, lim)
    inner = t(np.sqrt(2.0 / np.pi)) * (xc + t(0.044715) * (xc * xc * xc))
    return (t(0.5) * xw * (t(1) + np.tanh(inner))).astype(x.dtype, copy=False)


def gelu_tanh_bias(x, b) -> np.ndarray:  # [..., F], [F] -> [..., F]
    """gelu_tanh(x + b): the bias add and GELU that follow GPT-2's first FFN matmul.

    Shapes: x [..., F], b [F] -> [..., F]; dtype is NumPy's promotion of x and b.
    Notes: the reference twin of accel's fused bias + GELU kernels.
    See also: gelu_tanh, ffn.
    """
    return _gelu_tanh_bias(*_check_gelu_tanh_bias(x, b))


def _gelu_tanh_bias(x: np.ndarray, b: np.ndarray) -> np.ndarray:  # [..., F], [F] -> [..., F]
    """gelu_tanh(x + b) with no checks: inputs already validated (float arrays, b [F] matching x)."""
    return _gelu_tanh(x + b)


def gelu_erf(x) -> np.ndarray:  # [...] -> [...]
    """GELU(x) = x Phi(x) = x/2 (1 + erf(x / sqrt 2))  (Hendrycks & Gimpel 2016, sec. 2).

    The exact GELU (BERT, approximate='none' in PyTorch), with Phi the standard normal CDF.
    Shapes: any -> same shape and dtype.
    Notes: Phi is evaluated as erfc(-x / sqrt 2) / 2 (refimpl.special, Cody 1969), which
    equals the (1 + erf) form but keeps the left tail: gelu_erf(-10) = -7.6e-23 here, where
    the (1 + erf) form (PyTorch's) cancels to -0. gelu_erf(x) - gelu_erf(-x) = x since
    Phi(x) + Phi(-x) = 1. x = -inf gives nan (-inf * 0), x = +inf gives inf.
    See also: gelu_tanh (the approximation), refimpl.special.normal_cdf.
    """
    return _gelu_erf(as_float(x, "x"))


def _gelu_erf(x: np.ndarray) -> np.ndarray:  # [...] -> [...]; no checks: x is a float array
    return x * normal_cdf(x)


def relu(x) -> np.ndarray:  # [...] -> [...]
    """ReLU(x) = max(x, 0)  (Nair & Hinton 2010; the FFN of Vaswani et al. 2017, eq. 2).

    Shapes: any -> same shape and dtype. Notes: nan stays nan.
    """
    return _relu(as_float(x, "x"))


def _relu(x: np.ndarray) -> np.ndarray:  # [...] -> [...]; no checks: x is a float array
    return np.maximum(x, x.dtype.type(0))


def sigmoid(x) -> np.ndarray:  # [...] -> [...]
    """sigma(x) = 1 / (1 + exp(-x)) = exp(x) / (1 + exp(x))  (the logistic function).

    Shapes: any -> same shape and dtype.
    Notes: evaluated with e = exp(-|x|) <= 1, as 1/(1+e) for x >= 0 and e/(1+e) for x < 0,
    so exp never overflows and sigma(-1e4) = 0, sigma(1e4) = 1 without warnings.
    """
    return _sigmoid(as_float(x, "x"))


def _sigmoid(x: np.ndarray) -> np.ndarray:  # [...] -> [...]; no checks: x is a float array
    one = x.dtype.type(1)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, one, e) / (one + e)


def silu(x) -> np.ndarray:  # [...] -> [...]
    """SiLU(x) = x sigma(x)  (Elfwing et al. 2017; Swish-1 of Ramachandran et al. 2017).

    Shapes: any -> same shape and dtype.
    Notes: stable sigmoid (see `sigmoid`); silu(x) - silu(-x) = x since sigma(x) + sigma(-x) = 1.
    x = -inf gives nan (-inf * 0), as in PyTorch.
    """
    return _silu(as_float(x, "x"))


def _silu(x: np.ndarray) -> np.ndarray:  # [...] -> [...]; no checks: x is a float array
    return x * _sigmoid(x)


@dataclass(frozen=True)
class FFNParams:
    """The two affine maps of FFN(x) = act(x W1 + b1) W2 + b2.

    fc: LinearParams w [C, F]  (GPT-2's mlp.c_fc);  proj: LinearParams w [F, C'] (mlp.c_proj).
    """

    fc: LinearParams
    proj: LinearParams

    def __post_init__(self) -> None:
        for name in ("fc", "proj"):
            check_type(getattr(self, name), LinearParams, f"FFNParams.{name}")
        if self.fc.n_out != self.proj.n_in:
            raise ValueError(
                f"FFNParams widths disagree: fc.w is [C, F] = {self.fc.w.shape} but proj.w must be "
                f"[F, C] with F={self.fc.n_out}; got {self.proj.w.shape}")


def ffn(x, p: FFNParams, *, activation: Callable = gelu_tanh) -> np.ndarray:  # [..., C] -> [..., C]
    """FFN(x) = act(x W1 + b1) W2 + b2  (Vaswani et al. 2017, sec. 3.3, eq. 2).

    Shapes: x [..., C], p.fc.w [C, F], p.proj.w [F, C] -> [..., C].
    Notes: act defaults to gelu_tanh (GPT-2); the paper uses relu. dtype follows NumPy's
    promotion of x and the weights.
    See also: glu, swiglu, geglu.
    """
    return _ffn(_check_ffn(x, p, FFNParams, activation), p, activation)


def _ffn(x: np.ndarray, p: FFNParams, activation: Callable) -> np.ndarray:  # [..., C] -> [..., C]
    """act(x W1 + b1) W2 + b2 with no checks: inputs already validated (x [..., C] float, C = p.fc's input)."""
    h = activation(_linear(x, p.fc.w, p.fc.b))  # [..., F]
    return _linear(h, p.proj.w, p.proj.b)  # [..., C]


@dataclass(frozen=True)
class GLUParams:
    """The three maps of a gated FFN: gate w [C, F], up w [C, F], down w [F, C'] (biases optional)."""

    gate: LinearParams
    up: LinearParams
    down: LinearParams

    def __post_init__(self) -> None:
        from .quant.weights import QuantizedLinear  # (weights kept as GGUF blocks: the same map)

        for name in ("gate", "up", "down"):
            check_type(getattr(self, name), (LinearParams, QuantizedLinear), f"GLUParams.{name}",
                       what="a LinearParams (or QuantizedLinear)")
        g, u, d = ([p.n_in, p.n_out] for p in (self.gate, self.up, self.down))
        if g != u:
            raise ValueError(f"GLUParams.gate.w and GLUParams.up.w must both be [C, F]; got {g} and {u}")
        if d[0] != g[1]:
            raise ValueError(f"GLUParams.down.w must be [F, C] with F={g[1]} (gate's width); got {d}")


def glu(x, p: GLUParams, *, activation: Callable) -> np.ndarray:  # [..., C] -> [..., C]
    """GLU_act(x) = (act(x W_gate) * (x W_up)) W_down  (Shazeer 2020, eqs. 5-6; Dauphin et al. 2017).

    Shapes: x [..., C], p.gate.w / p.up.w [C, F], p.down.w [F, C] -> [..., C].
    Notes: * is the elementwise product; biases are used if present (Shazeer's have none).
    See also: swiglu, geglu, ffn.
    """
    return _glu(_check_ffn(x, p, GLUParams, activation), p, activation)


def _glu(x: np.ndarray, p: GLUParams, activation: Callable) -> np.ndarray:  # [..., C] -> [..., C]
    """(act(x W_gate) * (x W_up)) W_down with no checks: inputs already validated (x [..., C] float)."""
    h = activation(_linear(x, p.gate.w, p.gate.b)) * _linear(x, p.up.w, p.up.b)  # [..., F]
    return _linear(h, p.down.w, p.down.b)  # [..., C]


def glu_gate(gate, up, *, activation: str = "silu") -> np.ndarray:  # [..., F], [..., F] -> [..., F]
    """act(g) * u: the gated hidden layer of GLU_act once the two products g = x W_gate, u = x W_up are made
    (Shazeer 2020, eq. 5).

    Shapes: gate, up [..., F] of one shape -> [..., F] in their common float dtype.
    activation: a name, "silu" (SwiGLU), "gelu_tanh" or "gelu_erf" (GeGLU), so that a fused
    kernel can take it as a compile-time choice.
    See also: glu (the whole layer); accel twins glu_gate (one pass over g and u).
    """
    return _glu_gate(*_check_glu_gate(gate, up, activation))


def _glu_gate(g: np.ndarray, u: np.ndarray, activation: str) -> np.ndarray:  # [..., F], [..., F] -> [..., F]; no checks
    return _GATE_ACTIVATIONS[activation](g) * u


def swiglu(x, p: GLUParams) -> np.ndarray:  # [..., C] -> [..., C]
    """SwiGLU(x) = (SiLU(x W_gate) * (x W_up)) W_down  (Shazeer 2020, eq. 6; LLaMA's FFN).

    Shapes: x [..., C], p.gate.w / p.up.w [C, F], p.down.w [F, C] -> [..., C].
    See also: glu, geglu.
    """
    return _swiglu(_check_ffn(x, p, GLUParams, silu), p)


def _swiglu(x: np.ndarray, p: GLUParams) -> np.ndarray:  # [..., C] -> [..., C]; no checks: inputs already validated
    return _glu(x, p, _silu)


def geglu(x, p: GLUParams, *, gelu: Callable = gelu_erf) -> np.ndarray:  # [..., C] -> [..., C]
    """GEGLU(x) = (GELU(x W_gate) * (x W_up)) W_down  (Shazeer 2020, eq. 6).

    Shapes: x [..., C], p.gate.w / p.up.w [C, F], p.down.w [F, C] -> [..., C].
    Notes: `gelu` defaults to the exact gelu_erf, the paper's GELU; pass gelu=gelu_tanh for
    models trained with the approximation (T5 v1.1's "gated-gelu", Gemma).
    See also: glu, swiglu.
    """
    return _geglu(_check_ffn(x, p, GLUParams, gelu), p, gelu)


def _geglu(x: np.ndarray, p: GLUParams,
           gelu: Callable) -> np.ndarray:  # [..., C] -> [..., C]; no checks: inputs already validated
    return _glu(x, p, gelu)


# ----------------------------------------------------------------------------- checks at the door

def _check_gelu_tanh_bias(x, b) -> tuple[np.ndarray, np.ndarray]:
    x = as_float(x, "x")
    b = as_float(b, "b")
    check_ndim(x, "x", 1, "[..., F]")
    check_shape(b, "b", (x.shape[-1],), f"[F] with F={x.shape[-1]} (x's last axis)")
    return x, b


def _check_activation(activation) -> None:
    if not callable(activation):
        raise TypeError(f"activation must be a callable such as gelu_tanh; got {type(activation).__name__}")


def _check_ffn(x, p, params_type, activation) -> np.ndarray:  # -> x as a float array [..., C]
    check_type(p, params_type, "p")
    _check_activation(activation)
    return _check_linear(x, p.fc if params_type is FFNParams else p.gate)


_GATE_ACTIVATIONS = {"silu": _silu, "gelu_tanh": _gelu_tanh, "gelu_erf": _gelu_erf}


def _check_glu_gate(gate, up, activation) -> tuple[np.ndarray, np.ndarray, str]:
    g, u = as_float(gate, "gate"), as_float(up, "up")
    check_ndim(g, "gate", 1, "[..., F]")
    check_shape(u, "up", g.shape, f"gate's shape {list(g.shape)}")
    if activation not in _GATE_ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_GATE_ACTIVATIONS)}; got {activation!r}")
    dtype = np.result_type(g, u)
    return g.astype(dtype, copy=False), u.astype(dtype, copy=False), activation
