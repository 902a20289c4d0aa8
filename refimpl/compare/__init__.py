"""Verify a port: compare any implementation's activations with the reference's,
point by point, and name where they part.

    from refimpl import compare
    report = compare.compare(compare.reference_activations(model, ids), theirs, n_layers=L)
    print(report.table())           # one row per point in data-flow order; the first divergence named
    report.ok, report.to_json(), report.plot("err.png")

    compare.compare_model(model, ids, theirs)        # the same, running the reference itself
    compare.dump("acts.npz", {"blocks.0.attn.q": q, ...}, ids=ids)     # a file for the command line

`theirs` is a dict of arrays named with refimpl's hook names, Hugging Face's hidden_states.i /
attentions.i / logits, or TransformerLens's hook names (the map: refimpl.compare.names), or
a callable ids -> such a dict. Tolerances come from a stated error model (refimpl.compare.core).
The command line: python -m refimpl compare (refimpl.compare.cli).

    names     the name map between refimpl, Hugging Face and TransformerLens
    core      the error model, Row / Report, first_divergence, compare
    sources   the reference's activations, reading / writing dumps, a live Hugging Face model
    cli       python -m refimpl compare
"""

from __future__ import annotations

from .core import Report, Row, compare, first_divergence, rotated_positions, sum_length, tolerance, unit_roundoff
from .names import reference_name, to_reference
from .sources import IDS_KEY, dump, hf_activations, n_layers, read_activations, reference_activations

__all__ = ["compare", "compare_model", "Report", "Row", "first_divergence", "tolerance", "unit_roundoff", "sum_length",
           "rotated_positions", "reference_name", "to_reference", "reference_activations", "read_activations", "dump",
           "hf_activations", "n_layers", "IDS_KEY"]


def compare_model(model, ids, theirs, *, their_dtype=None, scale: float = 1.0, tolerances=None) -> Report:
    """compare(reference_activations(model, ids), theirs, ...): theirs a dict, or a callable ids -> dict."""
    if callable(theirs):
        theirs = theirs(ids)
    return compare(reference_activations(model, ids), theirs, n_layers=n_layers(model), their_dtype=their_dtype,
                   scale=scale, tolerances=tolerances)
