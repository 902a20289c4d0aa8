"""The command line's BLAS thread rule: one thread for small models, decided from the loaded model's config.

    width_of(config)                  n_embd / hidden_size / d_model of any family's config object, or None
    one_blas_thread_for(config)       after `python -m refimpl` loaded a model: one BLAS thread if it is small

The BLAS (OpenBLAS, MKL) reads OPENBLAS_NUM_THREADS once, when NumPy loads it; a model's width is known
only once its files are read (and checked), so the thread count is changed at run time, through
threadpoolctl, after the load. Nothing here reads a file. refimpl/__main__.py (module docstring) has the rule.
"""

from __future__ import annotations

import os

__all__ = ["BLAS_THREAD_VARS", "SMALL_MODEL_WIDTH", "width_of", "one_blas_thread_for"]

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
SMALL_MODEL_WIDTH = 512  # model width (n_embd / hidden_size) below which one BLAS thread is faster

# Set by `python -m refimpl` (refimpl/__main__.py) when the user set none of BLAS_THREAD_VARS and the command
# runs a model on NumPy's BLAS: only then does one_blas_thread_for change anything (library callers keep theirs).
enabled = False
_limits = []  # the threadpoolctl limiter, held for the life of the process


def width_of(config) -> int | None:
    """The model width of a config object of any family (GPT-2's n_embd, LLaMA / BERT's hidden_size, d_model)."""
    for key in ("n_embd", "hidden_size", "d_model"):
        value = getattr(config, key, None)
        if type(value) is int:
            return value
    return None


def one_blas_thread_for(config) -> bool:
    """Limit the BLAS to one thread when `enabled` and the model of `config` is narrower than SMALL_MODEL_WIDTH;
    True when it did. Without threadpoolctl (a dependency;
    absent only from a hand-made environment) the library's default stays."""
    width = width_of(config)
    if not enabled or width is None or width >= SMALL_MODEL_WIDTH or any(v in os.environ for v in BLAS_THREAD_VARS):
        return False
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    _limits.append(threadpool_limits(limits=1, user_api="blas"))
    return True
