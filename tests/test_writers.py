"""Every file refimpl writes: inside its target folder, never through a planted symlink; and a
model folder replaced as a whole, so a failed, full-disk or killed export leaves the old model
or the new one, loadable, never a mix (refimpl._files.replace_folder, refimpl.checkpoint.model_folder)."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import refimpl._files as files
import refimpl.gpt2 as gpt2
import refimpl.gpt2.io as gio
from refimpl.gpt2 import GPT2Config
from refimpl.gpt2.io import WeightFileError, export, save_weights
from refimpl.gpt2.tokenizer import Tokenizer, TokenizerFileError, load_tokenizer, save_vocab_merges
from refimpl.gpt2.train import init_params

REPO = Path(__file__).resolve().parent.parent


def byte_tokenizer(merges: tuple[bytes, ...] = ()) -> Tokenizer:
    """256 byte tokens, then one token per merge (each the concatenation of two byte tokens), then <|endoftext|>."""
    encoder = {bytes([b]): b for b in range(256)}
    ranks = {}
    for k, m in enumerate(merges):
        encoder[m] = 256 + k
        ranks[m] = k
    return Tokenizer(encoder, ranks, {"<|endoftext|>": 256 + len(merges)})


def make_model(folder: Path, vocab: int, seed: int, *, tokenizer: Tokenizer | None = None, n_embd: int = 8,
               n_layer: int = 1) -> GPT2Config:
    cfg = GPT2Config(vocab_size=vocab, n_positions=16, n_embd=n_embd, n_layer=n_layer, n_head=2)
    tok_dir = None
    if tokenizer is not None:
        tok_dir = folder.parent / (folder.name + ".tok")
        save_vocab_merges(tokenizer, tok_dir)
    save_weights(cfg, init_params(cfg, seed=seed), folder, tokenizer_dir=tok_dir)
    if tok_dir is not None:
        shutil.rmtree(tok_dir)
    return cfg


@pytest.fixture
def two_models(tmp_path):
    """OLD (vocab 300, 258-id tokenizer) at tmp/out and NEW (vocab 257, 257-id tokenizer) at tmp/src."""
    old, new = tmp_path / "out", tmp_path / "src"
    make_model(old, 300, seed=1, tokenizer=byte_tokenizer((b"hi",)))
    make_model(new, 257, seed=2, tokenizer=byte_tokenizer())
    return old, new


def fingerprint(folder: Path):
    """What identifies a loaded model folder: config, one weight entry, the tokenizer's size and names."""
    m = gpt2.load(folder)
    tok = None if m.tokenizer is None else m.tokenizer.vocab_size
    return m.config.vocab_size, float(m.params.wte[3, 1]), tok, sorted(p.name for p in folder.iterdir())


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


# ---- planted symlinks --------------------------------------------------------------------------


def plant(folder: Path, names, outside: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        if os.path.lexists(folder / name):
            os.unlink(folder / name)
        os.symlink(outside, folder / name)


def assert_replaced(folder: Path, names, outside: Path) -> None:
    assert outside.read_text() == "precious"
    for name in names:
        p = folder / name
        assert p.is_file() and not p.is_symlink(), name


@pytest.fixture
def outside(tmp_path):
    p = tmp_path / "outside.txt"
    p.write_text("precious")
    return p


def test_export_cli_never_writes_through_planted_links(two_models, outside, capsys):
    from refimpl.__main__ import main
    old, new = two_models
    names = ["config.json", "model.safetensors", "vocab.json", "merges.txt"]
    plant(old, names, outside)
    assert main(["export", "--model", str(new), "--out", str(old)]) == 0, capsys.readouterr().err
    assert_replaced(old, names, outside)
    assert fingerprint(old) == fingerprint(new)


def test_save_weights_npz_and_tokenizer_writers_never_write_through_planted_links(tmp_path, outside):
    cfg = GPT2Config(vocab_size=257, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    out = tmp_path / "m"
    plant(out, ["config.json", "model.npz"], outside)
    save_weights(cfg, init_params(cfg, seed=0), out, format="npz")
    assert_replaced(out, ["config.json", "model.npz"], outside)

    from refimpl.gpt2.bpe_train import save_bpe, train_bpe
    for writer in ("save_vocab_merges", "save_bpe"):
        d = tmp_path / writer
        plant(d, ["vocab.json", "merges.txt"], outside)
        if writer == "save_bpe":
            save_bpe(d, train_bpe(["hello hello world"], 260))
        else:
            save_vocab_merges(byte_tokenizer((b"hi",)), d)
        assert_replaced(d, ["vocab.json", "merges.txt"], outside)
        assert load_tokenizer(d).vocab_size > 256
        assert sorted(p.name for p in d.iterdir()) == ["merges.txt", "vocab.json"]  # no temp file left


def test_inspect_out_never_writes_through_planted_links(tmp_path, outside):
    pytest.importorskip("matplotlib")
    from refimpl.interp.cli import main
    model = tmp_path / "m"
    make_model(model, 64, seed=0, n_embd=8)
    out = tmp_path / "inspect"
    plant(out, ["lens.json", "lens.png"], outside)
    assert main(["lens", "--model", str(model), "--ids", "1 2 3 4", "--out", str(out)]) == 0
    assert_replaced(out, ["lens.json", "lens.png"], outside)
    assert json.loads((out / "lens.json").read_text())
    assert (out / "lens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_outputs_never_write_through_planted_links(tmp_path, outside):
    from refimpl.gpt2.train import TrainSettings, load_checkpoint, plot_loss_curve, train
    cfg = GPT2Config(vocab_size=64, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    toks = np.random.default_rng(0).integers(0, 64, 200)
    ckpt = tmp_path / "ckpt"
    plant(ckpt, ["config.json", "model.safetensors", "optimizer.npz"], outside)
    settings = TrainSettings(steps=2, batch_size=2, seq_len=8, eval_every=0, ckpt_every=1, warmup=1)
    params, history = train(cfg, toks, toks, settings, checkpoint_dir=ckpt, log=lambda s: None)
    assert_replaced(ckpt, ["config.json", "model.safetensors", "optimizer.npz"], outside)
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors", "optimizer.npz"]
    assert load_checkpoint(ckpt)[2].t == 2
    assert siblings(ckpt) == ["outside.txt"]  # no temporary folder beside it
    if plot_loss_curve(history, tmp_path / "probe.png") is not None:  # matplotlib installed
        plant(tmp_path / "plots", ["loss.png"], outside)
        plot_loss_curve(history, tmp_path / "plots" / "loss.png")
        assert_replaced(tmp_path / "plots", ["loss.png"], outside)


# ---- what replacing a folder whole means ---------------------------------------------------------


def test_stale_files_of_another_model_are_gone_after_an_export(two_models, tmp_path):
    old, new = two_models
    # A tokenizer.json of yet another model (it would be read before vocab.json + merges.txt),
    # a sharded model's files and generation settings: all the old model's, none survive.
    (old / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {}, "merges": []}}))
    (old / "model-00001-of-00002.safetensors").write_bytes(b"old shard")
    (old / "generation_config.json").write_text("{}")
    export(str(new), old)
    assert sorted(p.name for p in old.iterdir()) == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    assert fingerprint(old) == fingerprint(new)
    # Exporting a model without a tokenizer over a folder holding another model's tokenizer.
    bare = tmp_path / "bare"
    make_model(bare, 300, seed=3)
    export(str(bare), old)
    assert sorted(p.name for p in old.iterdir()) == ["config.json", "model.safetensors"]
    assert gpt2.load(old).tokenizer is None
    assert siblings(old) == ["bare", "src"]


def test_a_folder_with_unrelated_files_is_refused_untouched(two_models):
    old, new = two_models
    before = fingerprint(old)
    for extra in ("notes.txt", "pytorch_model.bin", "runs/"):
        p = old / extra.rstrip("/")
        p.mkdir() if extra.endswith("/") else p.write_text("mine")
        with pytest.raises(ValueError, match=rf"holds {extra} \(not a model's files\); nothing was written"):
            export(str(new), old)
        with pytest.raises(ValueError, match=rf"holds {extra} "):
            save_weights(*gpt2.io.load_weights(new), old)
        p.rmdir() if extra.endswith("/") else p.unlink()
        assert fingerprint(old) == before and siblings(old) == ["src"]


def test_a_symlink_as_the_output_folder_is_refused(two_models, tmp_path):
    old, new = two_models
    link = tmp_path / "link"
    link.symlink_to(old, target_is_directory=True)
    before = fingerprint(old)
    with pytest.raises(ValueError, match=r"link is a symlink \(to .*out\); .* pass the folder itself"):
        export(str(new), link)
    assert fingerprint(old) == before and link.is_symlink()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_exchange_paths_swaps_two_folders_in_one_step(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x").write_text("from a")
    assert files.exchange_paths(a, b) is True  # so the "renameat2" case below runs the exchange
    assert (b / "x").read_text() == "from a" and not (a / "x").exists()
    with pytest.raises(OSError, match="cannot exchange"):
        files.exchange_paths(a, tmp_path / "missing")


# ---- injected faults at every step of an export over an existing model ---------------------------


class Faults:
    """Wraps the calls an export makes to write, copy, fsync, rename and delete; `fail_at=k`
    raises from the k-th call (counting from 0), `calls` lists them in order."""

    def __init__(self, monkeypatch, fail_at: int = -1, exc: BaseException | None = None):
        self.fail_at, self.exc, self.calls = fail_at, exc, []
        targets = [(os, "replace"), (os, "rename"), (os, "unlink"), (os, "mkdir"), (os, "fsync"),
                   (os, "chmod"), (gio, "save_file"), (gio, "write_text_atomic"), (gio, "write_bytes_atomic"),
                   (gio, "read_regular_bytes"), (files, "exchange_paths"), (files, "fsync_dir"),
                   (files, "_empty_folder"), (shutil, "copyfile")]
        for module, name in targets:
            if not hasattr(module, name):  # (a writer that does without it)
                continue
            monkeypatch.setattr(module, name, self._wrap(f"{module.__name__}.{name}", getattr(module, name)))

    def _wrap(self, label, f):
        def wrapped(*a, **kw):
            k = len(self.calls)
            self.calls.append(label)
            if k == self.fail_at:
                raise self.exc or OSError(errno.EIO, f"injected fault in {label}")
            return f(*a, **kw)
        return wrapped


def check_old_or_new(out: Path, old_fp, new_fp) -> str:
    """The folder loads as exactly the old model or exactly the new one (its file names included,
    so no temp file is inside); beside it, nothing but the source (and, where the fault struck
    after the swap, the old folder under its hidden temporary name)."""
    fp = fingerprint(out)
    assert fp in (old_fp, new_fp), fp
    left = [n for n in siblings(out) if n.startswith(".")]
    assert all(n.startswith(".out.") and n.endswith(".tmp") for n in left), left
    return "old" if fp == old_fp else "new"


@pytest.mark.filterwarnings("ignore:could not delete the replaced folder")
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_a_fault_at_every_step_of_an_export_leaves_the_old_or_the_new_model(two_models, monkeypatch, exchange):
    old, new = two_models
    if not exchange:
        monkeypatch.setattr(files, "exchange_paths", lambda a, b: False)
    pristine = old.parent / "pristine"
    shutil.copytree(old, pristine, symlinks=True)
    old_fp, new_fp = fingerprint(old), fingerprint(new)
    with monkeypatch.context() as m:
        count = Faults(m)
        export(str(new), old)
    steps = count.calls
    assert fingerprint(old) == new_fp and len(steps) > 15, steps
    outcomes = []
    for k in range(len(steps)):
        shutil.rmtree(old)
        for p in old.parent.glob(".out.*"):
            shutil.rmtree(p)
        shutil.copytree(pristine, old, symlinks=True)
        with monkeypatch.context() as m:
            Faults(m, fail_at=k)
            try:
                export(str(new), old)
            except (OSError, WeightFileError) as e:  # a fault reading the source is the loader's WeightFileError
                assert "injected fault" in str(e)
        outcomes.append(check_old_or_new(old.resolve(), old_fp, new_fp) if old.exists() else "missing")
    assert "missing" not in outcomes
    print(f"{len(steps)} steps ({'exchange' if exchange else 'two renames'}): "
          f"{outcomes.count('old')} faults left the old model, {outcomes.count('new')} the new one")
    assert outcomes.count("old") >= 10 and outcomes[-1] == "new"


def test_a_full_disk_while_writing_leaves_the_old_model(two_models, monkeypatch):
    """ENOSPC from a write at several offsets (inside the weights, inside the copied vocab.json)."""
    old, new = two_models
    old_fp, new_fp = fingerprint(old), fingerprint(new)
    real_open = io.open  # (os.fdopen calls io.open too)
    st, cj, vj = ((new / n).stat().st_size for n in ("model.safetensors", "config.json", "vocab.json"))
    # In the weights, in config.json, in the copied vocab.json (the partial-vocab case), in merges.txt.
    for limit in (0, 100, st // 2, st + cj // 2, st + cj + vj // 2, st + cj + vj + 5):
        written = [0]

        class Filling:
            def __init__(self, f):
                self._f = f

            def write(self, data):
                n = len(data.encode()) if isinstance(data, str) else memoryview(data).nbytes
                if written[0] + n > limit:
                    raise OSError(errno.ENOSPC, "No space left on device")
                written[0] += n
                return self._f.write(data)

            def __getattr__(self, name):
                return getattr(self._f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self._f.__exit__(*exc)

        def filling_open(file, mode="r", *a, **kw):
            f = real_open(file, mode, *a, **kw)
            return Filling(f) if any(c in mode for c in "wxa+") else f

        with monkeypatch.context() as m:
            m.setattr(builtins, "open", filling_open)
            m.setattr(io, "open", filling_open)
            m.setattr(shutil, "copyfile", lambda a, b: filling_open(b, "wb").write(Path(a).read_bytes()))
            with pytest.raises(OSError, match="No space left"):
                export(str(new), old)

        assert written[0] <= limit
        assert check_old_or_new(old, old_fp, new_fp) == "old", limit
        assert siblings(old) == ["src"]


def test_save_vocab_merges_interrupted_never_shows_one_new_file_and_one_old(tmp_path, monkeypatch):
    d = tmp_path / "tok"
    a, b = byte_tokenizer((b"hi",)), byte_tokenizer((b"ab", b"cd"))
    save_vocab_merges(a, d)
    pristine = {p.name: p.read_bytes() for p in d.iterdir()}
    n = 0
    while True:
        for name, data in pristine.items():
            (d / name).write_bytes(data)
        with monkeypatch.context() as m:
            calls = []

            def failing(f, label):
                def g(*x, **kw):
                    calls.append(label)
                    if len(calls) - 1 == n:
                        raise KeyboardInterrupt
                    return f(*x, **kw)
                return g
            for name in ("replace", "unlink", "fsync", "chmod"):
                m.setattr(os, name, failing(getattr(os, name), name))
            try:
                save_vocab_merges(b, d)
                done = True
            except KeyboardInterrupt:
                done = False
        try:
            got = load_tokenizer(d).vocab_size
            assert got in (a.vocab_size, b.vocab_size)
        except TokenizerFileError as e:  # the one in-between state a reader can see: vocab.json alone
            assert "vocab.json: found without merges.txt" in str(e)
            got = None
        assert sorted(p.name for p in d.iterdir()) in (["merges.txt", "vocab.json"], ["vocab.json"])
        if done:
            assert got == b.vocab_size
            break
        n += 1
    assert n >= 4


# ---- a real kill ---------------------------------------------------------------------------------

_CHILD = """
import io, os, sys, time
from refimpl.gpt2.io import export

# Each write, fsync, rename and delete takes 3 ms longer, so kills spread over the export land in
# every phase of it (writing the weights, the config, the tokenizer, the swap, the clean-up).
real_open = io.open

class Slow:
    def __init__(self, f):
        self._f = f
    def write(self, data):
        time.sleep(0.003)
        return self._f.write(data)
    def __getattr__(self, name):
        return getattr(self._f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

def slow_open(file, mode="r", *a, **kw):
    f = real_open(file, mode, *a, **kw)
    return Slow(f) if any(c in mode for c in "wxa+") else f

def slowed(f):
    def g(*a, **kw):
        time.sleep(0.003)
        return f(*a, **kw)
    return g

io.open = slow_open
for name in ("replace", "rename", "fsync", "unlink", "rmdir"):
    setattr(os, name, slowed(getattr(os, name)))
print("go", flush=True)
export(sys.argv[1], sys.argv[2])
"""


def test_an_export_killed_at_any_moment_leaves_the_old_or_the_new_model(tmp_path):
    old, new = tmp_path / "out", tmp_path / "src"
    make_model(old, 3000, seed=1, n_embd=96, n_layer=3, tokenizer=byte_tokenizer((b"hi",)))   # ~2 MB
    make_model(new, 2000, seed=2, n_embd=128, n_layer=4, tokenizer=byte_tokenizer())          # ~4 MB
    old_fp, new_fp = fingerprint(old), fingerprint(new)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}

    def run(delay: float | None) -> float:
        p = subprocess.Popen([sys.executable, "-c", _CHILD, str(new), str(old)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "go\n"
        t0 = time.perf_counter()
        if delay is None:
            p.wait(30)
            return time.perf_counter() - t0
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        return delay

    pristine = tmp_path / "pristine"
    shutil.copytree(old, pristine)
    t_export = run(None)
    assert fingerprint(old) == new_fp
    outcomes = []
    for k in range(12):
        shutil.rmtree(old)
        shutil.copytree(pristine, old)
        run(k / 11 * t_export)
        outcomes.append(check_old_or_new(old, old_fp, new_fp)
                        + ("+tmp" if any(n.startswith(".out.") for n in siblings(old)) else ""))
    print(f"export of {sum(p.stat().st_size for p in new.iterdir()) / 1e6:.1f} MB took {t_export * 1e3:.0f} ms; "
          f"SIGKILL at 0..100% of it left: {outcomes}")
    # The next export removes what a killed one left beside the folder.
    export(str(new), old)
    assert siblings(old) == ["pristine", "src"]


# ---- loading: a tokenizer found is read or refused, never dropped -----------------------------------


def test_a_broken_or_mismatched_tokenizer_is_an_error_naming_the_file(two_models, tmp_path):
    old, new = two_models
    vocab = (old / "vocab.json").read_bytes()
    (old / "vocab.json").write_bytes(vocab[: len(vocab) // 2])  # a partial copy
    with pytest.raises(TokenizerFileError, match=r"vocab\.json: not (valid JSON|UTF-8 text)"):
        gpt2.load(old)
    (old / "vocab.json").write_bytes(vocab)
    (old / "merges.txt").unlink()
    with pytest.raises(TokenizerFileError, match=r"vocab\.json: found without merges\.txt"):
        gpt2.load(old)
    (old / "vocab.json").unlink()
    (old / "tokenizer.json").write_text("{\"model\": ")
    with pytest.raises(TokenizerFileError, match=r"tokenizer\.json: not valid JSON"):
        gpt2.load(old)
    # tokenizer.json beside a vocab.json + merges.txt holding another tokenizer: refused, naming both.
    save_vocab_merges(byte_tokenizer((b"ab", b"cd")), tmp_path / "t2")
    shutil.copy(tmp_path / "t2" / "vocab.json", old / "vocab.json")
    shutil.copy(tmp_path / "t2" / "merges.txt", old / "merges.txt")
    (old / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": json.loads((new / "vocab.json").read_text()), "merges": []},
        "added_tokens": [{"id": 256, "content": "<|endoftext|>"}]}))
    with pytest.raises(TokenizerFileError, match=r"tokenizer\.json \(257 ids\) and vocab\.json \+ merges\.txt "
                                                 r"\(259 ids\) hold different tokenizers"):
        gpt2.load(old)
    # The same tokenizer in both forms is read.
    shutil.copy(new / "vocab.json", old / "vocab.json")
    shutil.copy(new / "merges.txt", old / "merges.txt")
    assert gpt2.load(old).tokenizer.vocab_size == 257
    # A tokenizer of 400 ids attached to a 300-token model: refused with both sizes.
    big = tmp_path / "big"
    make_model(big, 300, seed=0)
    save_vocab_merges(Tokenizer({bytes([b]): b for b in range(256)}, {}, {"<|endoftext|>": 399}), big)
    with pytest.raises(TokenizerFileError, match=r"ids up to 399 \(400 ids\) but the model's vocab_size is 300"):
        gpt2.load(big)


def test_bert_teaching_plots_never_write_through_planted_links(tmp_path, outside):
    pytest.importorskip("matplotlib")
    from refimpl.bert.teach import SinkRow, plot_attention, plot_sinks
    plant(tmp_path / "pics", ["a.png", "s.png"], outside)
    plot_attention(["[CLS]", "hi", "[SEP]"], np.full((1, 2, 3, 3), 1 / 3), tmp_path / "pics" / "a.png")
    plot_sinks([SinkRow(1, h, 0.5, 0.3, 1 / 3) for h in range(2)], tmp_path / "pics" / "s.png")
    assert_replaced(tmp_path / "pics", ["a.png", "s.png"], outside)
    assert (tmp_path / "pics" / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_model_folder_rules_are_every_familys():
    """The model folder's rules live in refimpl.checkpoint; refimpl.gpt2.io gives the same objects under its names."""
    import refimpl.checkpoint as ck

    for name in ("model_folder", "check_model_folder", "MODEL_FOLDER_FILES", "TOKENIZER_FILES"):
        assert getattr(gio, name) is getattr(ck, name), name
