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
    """Readable labels for token ids: the decoded piece (repr-escaped whitespace) or the id itself."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return [str(int(i)) for i in ids]
    out = []
    for i in ids:
        s = tok.decode([int(i)])
        out.append(s if s.isprintable() and s.strip() else (repr(s)[1:-1] or "''"))
    return out
