"""Matplotlib on the Agg backend (files only, no display), imported when a picture is drawn."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot with the Agg backend selected (a TypeError-free ImportError if matplotlib is missing)."""
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency of the [plots] extra
        raise ImportError("pictures need matplotlib (pip install matplotlib)") from e
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def save(fig, path) -> Path:
    """Write `fig` to `path` (parent folders created; the format from its suffix, PNG by
    default) and close it.

    The picture is drawn in memory and written by temp file + rename (refimpl._files), so a
    symlink planted at `path` is replaced, never written through, and a reader never sees
    half a picture."""
    from io import BytesIO

    from .._files import write_bytes_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = BytesIO()
    try:
        fig.savefig(buf, format=path.suffix[1:].lower() or "png", dpi=110, bbox_inches="tight")
    finally:
        pyplot().close(fig)
    write_bytes_atomic(path, buf.getvalue())
    return path


def token_labels(model, ids) -> list[str]:
    """Readable labels for token ids: each token's bytes as refimpl._tokens.show_token_bytes shows them
    (byte fragments as <0xNN>, newlines as \\n; an id of the model's vocabulary that its tokenizer names
    no token with as <id N>), or the id itself when the model has no tokenizer."""
    from .._tokens import token_pieces

    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return [str(int(i)) for i in ids]
    return token_pieces(tok, ids, vocab_size=model.config.vocab_size)


def text_colour(cmap, norm, value) -> str:
    """The text colour, black or white, that reads better on the colour `cmap(norm(value))` paints.

    Relative luminance Y = 0.2126 R + 0.7152 G + 0.0722 B of the linearised sRGB colour (WCAG 2);
    white text where Y < 0.18, about where white and black have equal contrast on the cell."""
    import numpy as np

    rgb = np.asarray(cmap(norm(value)))[:3]
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return "white" if float(lin @ np.array([0.2126, 0.7152, 0.0722])) < 0.18 else "black"


def number(x, spec: str = ".4g") -> str:
    """format(x, spec), with a value that rounds to zero written without a sign ("0", never "-0")."""
    s = format(float(x), spec)
    return s.lstrip("-") if s.startswith("-") and float(s) == 0 else s
