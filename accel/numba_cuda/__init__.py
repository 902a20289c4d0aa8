"""accel.numba_cuda: @cuda.jit kernels, each with the signature of its refimpl twin.

Every public function takes NumPy arrays, copies them to the device, launches, and copies
the result back (the registry's contract); a `*_device` twin of each takes device arrays
(Numba device arrays or CuPy arrays, through __cuda_array_interface__) and writes into an
output array, for GPT-2 on the `cuda` backend. In CI the kernels run on the CPU under
Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), where block sizes default to small values;
`launch_config(threads=..., q_tile=..., k_tile=...)` sets them explicitly.

Kernels (module: versions and how each deliberately differs from its twin in the header):
  attention.softmax            twin refimpl.attention.softmax
  attention.masked_attention   twin refimpl.attention.masked_attention (FlashAttention tiling)
  attention.decode_attention   twin refimpl.attention.decode_attention (split-S, merged)
  norms.layer_norm             twin refimpl.norms.layer_norm
  norms.rms_norm               twin refimpl.norms.rms_norm
  ffn.gelu_tanh_bias           twin refimpl.ffn.gelu_tanh_bias (fused bias + GELU)
  ffn.gelu_tanh                twin refimpl.ffn.gelu_tanh
  ffn.glu_gate                 twin refimpl.ffn.glu_gate (act(g) * u fused)
  positional.apply_rope        twin refimpl.positional.apply_rope
  positional.rope_rotate       twin refimpl.positional.rope_rotate (cos / sin tables given)
"""

from ._common import SIMULATOR, launch_config
from .attention import (
    decode_attention,
    decode_attention_device,
    masked_attention,
    masked_attention_device,
    softmax,
    softmax_device,
)
from .ffn import gelu_tanh, gelu_tanh_bias, gelu_tanh_bias_device, glu_gate, glu_gate_device
from .norms import layer_norm, layer_norm_device, rms_norm, rms_norm_device
from .positional import apply_rope, apply_rope_device, rope_rotate, rope_rotate_device

__all__ = [
    "SIMULATOR",
    "launch_config",
    "softmax",
    "masked_attention",
    "decode_attention",
    "layer_norm",
    "rms_norm",
    "gelu_tanh",
    "gelu_tanh_bias",
    "apply_rope",
    "glu_gate",
    "rope_rotate",
    "softmax_device",
    "masked_attention_device",
    "decode_attention_device",
    "layer_norm_device",
    "rms_norm_device",
    "gelu_tanh_bias_device",
    "apply_rope_device",
    "glu_gate_device",
    "rope_rotate_device",
]
