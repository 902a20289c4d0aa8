"""Training any model family in NumPy: AdamW, clipping, the schedule, batches, evaluation, checkpoints, the loop.

    params, history = train(config, train_ids, val_ids, TrainSettings(steps=2000), family=GPT2_FAMILY)
    grads, norm = clip_by_global_norm(grads, max_norm=1.0)         # BEFORE the optimizer step
    params, state = adamw_step(params, grads, state, lr=lr_at(step, ...), ...)

Everything here knows a model only through named tensors (dicts name -> array) and a
`TrainFamily`, which says how to initialise, differentiate, name and save the model it trains:
refimpl.gpt2.train.GPT2_FAMILY and refimpl.llama.train.LLAMA_FAMILY, each beside its family's
forward with intermediates and its backward.

AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2):

    w <- w - lr * wd * w                                   (decay, decoupled from the gradient)
    m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
    w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

in PyTorch's form (torch.optim.AdamW: eps added after the bias-corrected square root, decay
multiplied by the scheduled lr). Weight decay applies to 2-D weights only: embeddings and the
linear matrices; biases and norm gains/biases are not decayed (as in GPT-2 / nanoGPT practice:
shrinking a gain or bias towards 0 is not a useful prior).

Gradient clipping by global norm (Pascanu et al. 2013, sec. 3.2), PyTorch's
`clip_grad_norm_` formula: scale = min(1, max_norm / (||g||_2 + 1e-6)), over all tensors.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from io import BytesIO
from pathlib import Path
from typing import Callable

import numpy as np

from ._files import write_bytes_atomic
from .checkpoint import model_folder

__all__ = [
    "AdamWState", "adamw_init", "adamw_step", "decays", "global_norm", "clip_by_global_norm", "lr_at",
    "TrainFamily", "TrainSettings", "windows", "sample_batch", "evaluation_starts", "evaluate",
    "save_checkpoint", "load_checkpoint", "train", "plot_loss_curve",
]


# ----------------------------------------------------------------------------- optimizer


def decays(name: str, array: np.ndarray) -> bool:
    """Whether AdamW decays this tensor: 2-D weights (embeddings, linear matrices) yes; 1-D biases and norms no."""
    return array.ndim == 2


@dataclass(frozen=True)
class AdamWState:
    """t: steps taken; m, v: first and second moment estimates, by Hugging Face tensor name."""

    t: int
    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]


def adamw_init(params: dict[str, np.ndarray]) -> AdamWState:
    """t = 0, m = v = 0 for every tensor (params: a dict name -> array)."""
    return AdamWState(0, {n: np.zeros_like(a) for n, a in params.items()},
                      {n: np.zeros_like(a) for n, a in params.items()})


def adamw_step(params: dict[str, np.ndarray], grads: dict[str, np.ndarray], state: AdamWState, *, lr: float,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01) -> tuple[dict[str, np.ndarray], AdamWState]:
    """One AdamW step (Loshchilov & Hutter 2019, Alg. 2, in torch.optim.AdamW's form; see the module docstring).

    params, grads: dicts name -> array with the same names. Returns new (params, state); the
    inputs are not modified. weight_decay applies to the tensors where `decays(name, w)` is True
    (2-D weights only).
    """
    if not lr >= 0 or not eps > 0 or not weight_decay >= 0 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"AdamW needs lr >= 0, eps > 0, weight_decay >= 0, 0 <= betas < 1; "
                         f"got lr={lr}, eps={eps}, weight_decay={weight_decay}, betas={betas}")
    b1, b2 = betas
    t = state.t + 1
    bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
    new_p, new_m, new_v = {}, {}, {}
    for name, w in params.items():
        g = grads[name]
        dt = w.dtype.type
        if decays(name, w):
            w = w * dt(1.0 - lr * weight_decay)
        m = dt(b1) * state.m[name] + dt(1.0 - b1) * g
        v = dt(b2) * state.v[name] + dt(1.0 - b2) * (g * g)
        denom = np.sqrt(v) / dt(math.sqrt(bc2)) + dt(eps)
        new_p[name] = w - dt(lr / bc1) * (m / denom)
        new_m[name], new_v[name] = m, v
    return new_p, AdamWState(t, new_m, new_v)


def global_norm(grads: dict[str, np.ndarray]) -> float:
    """||g||_2 over all tensors together: sqrt(sum_W sum_i g_i^2), accumulated in float64."""
    return math.sqrt(sum(float(np.dot(g.ravel().astype(np.float64), g.ravel().astype(np.float64)))
                         for g in grads.values()))


def clip_by_global_norm(grads: dict[str, np.ndarray], max_norm: float) -> tuple[dict[str, np.ndarray], float]:
    """g <- g * min(1, max_norm / (||g||_2 + 1e-6))  (Pascanu et al. 2013 sec. 3.2; torch's clip_grad_norm_).

    Returns (clipped grads, the norm before clipping); grads a dict name -> array, returned as it
    came where no clipping is needed.
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0; got {max_norm!r}")
    norm = global_norm(grads)
    scale = min(1.0, max_norm / (norm + 1e-6))
    if scale == 1.0:
        return grads, norm
    return {n: g * g.dtype.type(scale) for n, g in grads.items()}, norm


def lr_at(step: int, *, max_lr: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """Linear warmup then cosine decay  (Goyal et al. 2017 warmup; Loshchilov & Hutter 2017, SGDR eq. 5):

        step < warmup:  max_lr * (step + 1) / warmup
        afterwards:     min_lr + (max_lr - min_lr) * (1 + cos(pi * s)) / 2,  s = (step - warmup) / (total - warmup)

    step counts from 0; past `total` the rate stays at min_lr.
    """
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total or total <= warmup:
        return min_lr
    s = (step - warmup) / (total - warmup)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * s))

# ----------------------------------------------------------------------------- the model a loop trains


@dataclass(frozen=True)
class TrainFamily:
    """What the training loop needs to know of a model family, as functions of (params, config).

    init_params(config, seed) -> params;  loss_and_grads(params, config, ids, targets) -> (L, grads)
    with grads of params' kind;  loss(params, config, ids, targets) -> L;  named(params, config)
    -> dict name -> array (the checkpoint's names) and rebuild(named, config) -> params, its
    inverse;  write_files(folder, config, params) writes config.json + weights into a new folder;
    read_files(folder) -> (config, params);  context(config) -> the longest window it takes.
    """

    name: str
    init_params: Callable
    loss_and_grads: Callable
    loss: Callable
    named: Callable
    rebuild: Callable
    write_files: Callable
    read_files: Callable
    context: Callable


# ----------------------------------------------------------------------------- the training loop

@dataclass(frozen=True)
class TrainSettings:
    """Everything that decides a training run (recorded in checkpoints and the model card)."""

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    max_lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    ckpt_every: int = 500
    seed: int = 1337


def windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int,
            bos: int | None = None) -> tuple[np.ndarray, np.ndarray]:  # [N], [B] -> ids [B, T], targets [B, T]
    """ids = tokens[s : s+T], targets = tokens[s+1 : s+T+1] for each start s (next-token prediction).

    bos: a token id put in place of each window's first token (ids[:, 0] = bos; targets unchanged),
    so every window begins with the same dedicated beginning-of-text token, as in Xiao et al.
    2023 (StreamingLLM), sec. 3.3's pre-training with a sink token. The targets, hence the
    predictions scored, are the same with and without it.
    """
    idx = starts[:, None] + np.arange(seq_len)[None, :]  # [B, T]
    ids = tokens[idx]
    if bos is not None:
        ids[:, 0] = bos
    return ids, tokens[idx + 1]


def sample_batch(tokens: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator, *,
                 bos: int | None = None) -> tuple[np.ndarray, np.ndarray]:  # [N] -> ids [B, T], targets [B, T]
    """B random windows: ids = tokens[s : s+T], targets = tokens[s+1 : s+T+1] (next-token prediction);
    bos: every window's first id replaced by it (see `windows`)."""
    if len(tokens) < seq_len + 1:
        raise ValueError(f"need at least seq_len + 1 = {seq_len + 1} tokens; got {len(tokens)}")
    starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)
    return windows(tokens, starts, seq_len, bos)


def evaluation_starts(n_tokens: int, seq_len: int, n_windows: int) -> np.ndarray:  # -> [n_windows] int64
    """Where evaluate's windows start: n_windows evenly spread, each seq_len tokens with its next token."""
    return np.linspace(0, n_tokens - seq_len - 1, n_windows).astype(np.int64)


def evaluate(params, config, tokens: np.ndarray, *, seq_len: int, batch_size: int, n_batches: int,
             family: TrainFamily, bos: int | None = None) -> float:
    """Mean loss over a fixed set of windows spread evenly over `tokens` (the same every call);
    bos as in `windows`."""
    if len(tokens) < seq_len + 1:
        raise ValueError(f"evaluate needs at least seq_len + 1 = {seq_len + 1} tokens; got {len(tokens)}")
    starts = evaluation_starts(len(tokens), seq_len, batch_size * n_batches)
    losses = []
    for i in range(n_batches):
        ids, targets = windows(tokens, starts[i * batch_size:(i + 1) * batch_size], seq_len, bos)
        losses.append(family.loss(params, config, ids, targets))
    return float(np.mean(losses))


def save_checkpoint(directory, config, params, state: AdamWState,
                    rng: np.random.Generator, history: dict, settings: TrainSettings, *,
                    family: TrainFamily) -> Path:
    """Write the weights (family.write_files: config.json + model.safetensors) and optimizer.npz
    (m/<name>, v/<name>, t, the batch sampler's RNG state, history and settings as JSON).

    The checkpoint folder is written beside `directory` and swapped in whole (refimpl.checkpoint.model_folder),
    so a run killed while saving leaves the previous checkpoint or this one, never weights of
    one step with the optimizer state of another. An existing `directory` may hold only a
    checkpoint's files (a model's files and optimizer.npz); anything else is refused."""
    d = Path(directory)
    arrays = {f"m/{n}": a for n, a in state.m.items()}
    arrays.update({f"v/{n}": a for n, a in state.v.items()})
    arrays["t"] = np.array(state.t)
    arrays["meta"] = np.array(json.dumps({"rng": rng.bit_generator.state, "history": history,
                                          "settings": asdict(settings)}))
    with model_folder(d, also=("optimizer.npz",)) as new:
        family.write_files(new, config, params)
        with open(new / "optimizer.npz", "xb") as f:  # a new file in a new folder
            np.savez(f, **arrays)
    return d


def load_checkpoint(directory, *, family: TrainFamily):
    """Read what save_checkpoint wrote: (config, params, state, rng, history, settings dict); the weights by
    family.read_files."""
    d = Path(directory)
    config, params = family.read_files(d)
    with np.load(d / "optimizer.npz") as z:
        m = {k[2:]: z[k] for k in z.files if k.startswith("m/")}
        v = {k[2:]: z[k] for k in z.files if k.startswith("v/")}
        t = int(z["t"])
        meta = json.loads(str(z["meta"]))
    rng = np.random.default_rng()
    rng.bit_generator.state = meta["rng"]
    return config, params, AdamWState(t, m, v), rng, meta["history"], meta["settings"]


def _progress(step: int, total: int, loss_value: float, lr: float, tok_s: float, extra: str = "") -> str:
    width = 30
    done = int(width * step / max(total, 1))
    return (f"\r[{'#' * done}{'.' * (width - done)}] {step}/{total} loss {loss_value:.4f} "
            f"lr {lr:.2e} {tok_s:,.0f} tok/s{extra}")


def train(config, train_tokens: np.ndarray, val_tokens: np.ndarray, settings: TrainSettings, *,
          family: TrainFamily, params=None, checkpoint_dir=None, resume: bool = False,
          log: Callable[[str], None] | None = None, bos: int | None = None):
    """Train with AdamW + global-norm clipping + warmup/cosine lr; returns (params, history).

    history: {"step": [...], "train_loss": [...], "lr": [...], "grad_norm": [...],
    "eval_step": [...], "val_loss": [...], "train_eval_loss": [...], "seconds": float}.
    family: the model trained (refimpl.gpt2.train.GPT2_FAMILY, refimpl.llama.train.LLAMA_FAMILY).
    Batches come from np.random.default_rng(settings.seed); params (if not given) from
    family.init_params(config, settings.seed). With checkpoint_dir, a checkpoint is written
    every ckpt_every steps and at the end; resume=True continues from the one there.
    A plain-text progress bar goes to stderr. bos: every window's first id (see `windows`).
    """
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    train_tokens = np.asarray(train_tokens, dtype=np.int64)
    val_tokens = np.asarray(val_tokens, dtype=np.int64)
    T = settings.seq_len
    if T > family.context(config):
        raise ValueError(f"settings.seq_len={T} exceeds the model's context ({family.context(config)} positions)")
    for name, toks in (("train_tokens", train_tokens), ("val_tokens", val_tokens)):  # before any step
        if toks.ndim != 1 or len(toks) < T + 1:
            raise ValueError(f"{name} must be [N] with N >= seq_len + 1 = {T + 1}; got shape {toks.shape}")
    history = {"step": [], "train_loss": [], "lr": [], "grad_norm": [], "eval_step": [], "val_loss": [],
               "train_eval_loss": [], "seconds": 0.0}
    rng = np.random.default_rng(settings.seed)
    state = None
    if resume and checkpoint_dir is not None and (Path(checkpoint_dir) / "optimizer.npz").is_file():
        config, params, state, rng, history, _ = load_checkpoint(checkpoint_dir, family=family)
        log(f"resumed from {checkpoint_dir} at step {state.t}")
    if params is None:
        params = family.init_params(config, settings.seed)
    if state is None:
        state = adamw_init(family.named(params, config))

    def run_eval(step):
        kw = dict(seq_len=T, batch_size=settings.batch_size, n_batches=settings.eval_batches, family=family, bos=bos)
        val = evaluate(params, config, val_tokens, **kw)
        tr = evaluate(params, config, train_tokens, **kw)
        history["eval_step"].append(step)
        history["val_loss"].append(val)
        history["train_eval_loss"].append(tr)
        log(f"\nstep {step}: train {tr:.4f}  val {val:.4f} nats/token")

    t0 = time.perf_counter() - history["seconds"]
    last = time.perf_counter()
    for step in range(state.t, settings.steps):
        ids, targets = sample_batch(train_tokens, settings.batch_size, T, rng, bos=bos)
        lr = lr_at(step, max_lr=settings.max_lr, warmup=settings.warmup, total=settings.steps,
                   min_lr=settings.min_lr)
        L, grads = family.loss_and_grads(params, config, ids, targets)
        grads, norm = clip_by_global_norm(family.named(grads, config), settings.grad_clip)
        named, state = adamw_step(family.named(params, config), grads, state, lr=lr, betas=settings.betas,
                                  eps=settings.eps, weight_decay=settings.weight_decay)
        params = family.rebuild(named, config)
        now = time.perf_counter()
        tok_s = settings.batch_size * T / max(now - last, 1e-9)
        last = now
        history["step"].append(step)
        history["train_loss"].append(L)
        history["lr"].append(lr)
        history["grad_norm"].append(norm)
        history["seconds"] = now - t0
        sys.stderr.write(_progress(step + 1, settings.steps, L, lr, tok_s))
        sys.stderr.flush()
        done = step + 1
        if settings.eval_every and (done % settings.eval_every == 0 or done == settings.steps):
            run_eval(done)
        if checkpoint_dir is not None and (done % settings.ckpt_every == 0 or done == settings.steps):
            save_checkpoint(checkpoint_dir, config, params, state, rng, history, settings, family=family)
    sys.stderr.write("\n")
    return params, history


def plot_loss_curve(history: dict, path, *, title: str = "training loss",
                    baselines: dict[str, float] | None = None) -> Path | None:
    """Write a PNG of training loss per step and validation loss per evaluation (plus dashed
    horizontal lines for `baselines`, label -> loss); None if matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.asarray(history["step"]) + 1
    ax.plot(steps, history["train_loss"], lw=0.6, alpha=0.5, label="train (batch)")
    if history["eval_step"]:
        ax.plot(history["eval_step"], history["train_eval_loss"], "o-", ms=3, label="train (eval windows)")
        ax.plot(history["eval_step"], history["val_loss"], "o-", ms=3, label="validation")
    for k, (label, value) in enumerate((baselines or {}).items()):
        ax.axhline(value, ls="--", lw=1, color=f"C{3 + k}", label=f"{label} ({value:.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())  # temp file + rename: never through a planted link
    return path
