"""inspect attention's weight beyond the sliding window: exactly 0 in a local layer, measured against the same
window in a global one (refimpl.interp.attention_maps.mass_beyond_window)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refimpl.interp.attention_maps import attention_weights, mass_beyond_window
from test_interp_more import run_cli, tiny_gemma3


def test_mass_beyond_the_window_sums_the_far_keys_of_the_queries_that_have_them():
    w = np.tril(np.ones((5, 5)))
    w /= w.sum(axis=1, keepdims=True)  # uniform causal rows: query i gives 1/(i+1) to each key
    # window 2: query i >= 2 has i - 1 keys at least 2 back, so (i - 1) / (i + 1): 1/3, 2/4, 3/5
    assert mass_beyond_window(w, 2) == pytest.approx(np.mean([1 / 3, 2 / 4, 3 / 5]), abs=1e-15)
    assert np.isnan(mass_beyond_window(w, 5)) and mass_beyond_window(w, 1) == pytest.approx(np.mean([1 / 2, 2 / 3,
                                                                                                    3 / 4, 4 / 5]))
    assert mass_beyond_window(w[None, None].astype(np.float32), 2).shape == (1, 1)
    with pytest.raises(ValueError, match="window must be a positive integer; got 0"):
        mass_beyond_window(w, 0)


def test_inspect_attention_shows_the_mass_beyond_the_window_per_layer(tmp_path, capsys, monkeypatch):
    import refimpl.interp.cli as cli
    from refimpl.llama.io import save_weights

    g = tiny_gemma3(window=4)
    save_weights(g.config, g.params, tmp_path / "g3")
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    out = tmp_path / "a"
    printed, _ = run_cli(["attention", "--model", str(tmp_path / "g3"), "--ids", " ".join(map(str, ids)),
                          "--out", str(out)], capsys)
    data = json.loads((out / "attention.json").read_text())
    beyond = np.array(data["mass_beyond_window"])  # [L, H]
    assert data["sliding_window"] == 4 and beyond.shape == (6, 4)
    assert np.all(beyond[:5] == 0) and np.all(beyond[5] > 0.05)  # 5 local layers, then the global one
    assert np.allclose(beyond, mass_beyond_window(attention_weights(g, ids), 4), atol=1e-12)
    header = printed.splitlines()[0]
    assert "on keys >= 4 back" in header and "a local layer's is exactly 0" in printed
    row = printed.splitlines()[1 + 5 * 4].split()  # layer 5, head 0 (after the header line)
    assert row[:2] == ["5", "0"] and float(row[-1]) == pytest.approx(beyond[5, 0], abs=1e-3)
    monkeypatch.setattr(cli, "SINK_ROWS_PRINTED", 8)  # the wide table: one line per layer, its most-far head
    printed, _ = run_cli(["attention", "--model", str(tmp_path / "g3"), "--ids", "1 2 3", "--out", str(out)], capsys)
    assert "most on keys >= 4 back" in printed and "none here: T = 3 <= 4" in printed
    assert json.loads((out / "attention.json").read_text())["mass_beyond_window"] is None


def test_only_a_model_with_sliding_layers_is_measured_against_a_window():
    from types import SimpleNamespace

    from refimpl.interp.cli import _sliding_window
    from refimpl.llama.config import LlamaConfig

    base = dict(vocab_size=40, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=32, rms_norm_eps=1e-5)

    def window(**kw):
        return _sliding_window(SimpleNamespace(config=LlamaConfig.from_dict({**base, **kw})))
    assert _sliding_window(tiny_gemma3(window=4)) == 4 and window(model_type="mistral", sliding_window=8) == 8
    assert window(model_type="llama") is None and window(model_type="mistral", sliding_window=None) is None


def test_the_wide_tables_cell_names_the_head_with_the_most_and_the_least():
    from refimpl.interp.cli import _far_cell

    assert _far_cell(np.zeros(4)) == "0 (every head)" and _far_cell(np.full(4, np.nan)) == "-"
    assert _far_cell(np.array([0.1, 0.5, 0.25])) == "h1 0.500 (min 0.100)"
