"""Looking inside a decoder (GPT-2, the LLaMA family): capture, logit lens, attention maps and sinks,
StreamingLLM, steering, patching.

Modules, each a short read:
    capture         run_with_cache / run_with_interventions over the model's hook points
    logit_lens      every layer's residual through the final norm and the LM head
    tuned_lens      the logit lens through an affine translator per layer, fit by ridge least squares
    attention_maps  attention weights per layer and head; attention-sink statistics
    streaming       StreamingLLM cache (sinks + rolling window) and its perplexity comparison (GPT-2, LLaMA family)
    steering        mean-difference directions added to the residual stream
    patching        copy a hidden state from a source run into a target run, per layer and position
    pictures        sinusoidal, RoPE and ALiBi pictures
    patchscope      decode a hidden state by patching it into an identity prompt (Patchscopes)
    context         one word in several contexts: cosine of its states per layer (decoders and BERT)
    memory          naive vs fused attention: peak memory (tracemalloc) and time over T, heads, window
    neurons         FFN neurons as key-value memories: top contexts, tokens their output vector promotes
    training        loss and gradient-norm curves from a model folder's history.json
    cli             `python -m refimpl inspect SUBCOMMAND` (writes PNG + JSON)

Everything runs the model's own forward (refimpl.gpt2.model, refimpl.llama.model) through its `hook`
argument; the family-specific parts (hook names, final norm, LM head, cache) are in _family.py.
"""

from __future__ import annotations

from .attention_maps import attention_weights, sink_share, sink_table, uniform_sink_share
from .capture import Intervention, add, hook_names, replace, run_with_cache, run_with_interventions
from .logit_lens import lens_top_tokens, logit_lens, residual_stream
from .tuned_lens import TunedLens, fit_tuned_lens, tuned_lens
from .patching import logit_diff_metric, patch_points, patch_sweep
from .steering import steered_generate, steered_logprobs, steering_effect, steering_vector
from .streaming import (
    SinkCache,
    recompute_window_logits,
    streaming_generate,
    streaming_logits,
    streaming_perplexity,
    streaming_positions,
    streaming_step,
)

__all__ = [
    "hook_names", "run_with_cache", "run_with_interventions", "Intervention", "replace", "add",
    "residual_stream", "logit_lens", "lens_top_tokens",
    "TunedLens", "fit_tuned_lens", "tuned_lens",
    "attention_weights", "sink_share", "uniform_sink_share", "sink_table",
    "SinkCache", "streaming_positions", "streaming_step", "streaming_logits", "streaming_generate",
    "recompute_window_logits",
    "streaming_perplexity",
    "steering_vector", "steered_generate", "steered_logprobs", "steering_effect",
    "patch_points", "logit_diff_metric", "patch_sweep",
]
