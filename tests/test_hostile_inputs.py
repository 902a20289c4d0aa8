"""Inputs a fuzzing review and a first-time user tripped on: each gets one line of our error, in bounded
time and memory, or works.

Properties:
- an .npz given to `compare --theirs` costs memory in proportion to what the comparison needs, not to
  what its entries declare: a 256 KB deflate bomb (256 MB of zeros) and 3 KB entries declaring 4 GB
  (stored and deflated) are refused with a peak RSS under 200 MB (a subprocess under an address-space
  limit; it prints its own peak); refimpl.checkpoint.npz_read refuses declared sizes the archive's
  bytes cannot hold, without a caller's limit too;
- no file is read before the regular-file check: config.json a FIFO or nested 100,000 deep makes
  generate / inspect / compare exit 2 with one line (a subprocess timeout turns a hang into a failure);
  inspect's --file /dev/zero or a FIFO likewise; a safetensors header or __metadata__ nested 900 deep is
  a SafetensorsError, not a RecursionError;
- every path compare writes (--json, --plot, --write-reference) is checked before any work: a missing
  folder, a folder, /proc, an unknown suffix is one line, status 2;
- flags are checked before work: --length-penalty 1e308 with beams; a prompt id 2**63 names the id and
  the range; export refuses "", "." (any path to the current folder) and the source's folder as --out.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The peak is VmHWM of this process's own memory map: ru_maxrss would count the parent's resident set at fork.
_WRAP = ("import atexit, re, resource, runpy, sys\n"
         "limit = int(sys.argv[1])\n"
         "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
         "atexit.register(lambda: sys.__stderr__.write('PEAK_KB %s\\n' % "
         "re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]))\n"
         "sys.argv = ['refimpl', *sys.argv[2:]]\n"
         "runpy.run_module('refimpl', run_name='__main__', alter_sys=True)\n")


def _cli(argv, *, timeout: float = 300, limit_mb: int = 3000, cwd=ROOT) -> tuple[int, str, int]:
    """python -m refimpl argv in a subprocess under an address-space limit: (status, stderr without the peak
    line, peak RSS in MB). A hang past `timeout` fails the test."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", _WRAP, str(limit_mb << 20), *map(str, argv)], capture_output=True,
                       text=True, timeout=timeout, cwd=cwd, env=env)
    lines = r.stderr.splitlines()
    peak = [int(ln.split()[1]) for ln in lines if ln.startswith("PEAK_KB ")]
    err = "\n".join(ln for ln in lines if not ln.startswith("PEAK_KB ")) + "\n"
    return r.returncode, err, (peak[0] >> 10) if peak else -1


def _one_line_error(rc: int, err: str, *words: str) -> None:
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, (rc, err)
    for w in words:
        assert w in err, (w, err)


# ----------------------------------------------------------------------------- .npz sizes

def _npy_header(shape, descr="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _bomb(path: Path, mb: int = 256) -> Path:
    """An np.savez_compressed-style archive: one float32 entry of `mb` MB of zeros (~mb KB deflated)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open("x.npy", "w", force_zip64=True) as f:
        f.write(_npy_header((mb << 18,)))
        zeros = bytes(1 << 20)
        for _ in range(mb):
            f.write(zeros)
    return path


def _liar(path: Path, method: int) -> Path:
    """A 3 KB entry whose zip records (local and central) declare ~4 GB uncompressed, its .npy header agreeing."""
    header = _npy_header((1 << 30,))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        z.writestr("x.npy", header + bytes(3000))
    data = bytearray(buf.getvalue())
    declared = len(header) + (1 << 32) - 1 - len(header) - ((1 << 32) - 1 - len(header)) % 4  # fits 32 bits
    struct.pack_into("<I", data, 22, declared)  # local header: uncompressed size
    struct.pack_into("<I", data, data.rfind(b"PK\x01\x02") + 24, declared)  # central directory
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="module")
def hostile_npz(tmp_path_factory):
    d = tmp_path_factory.mktemp("npz")
    return {"bomb": _bomb(d / "bomb.npz"), "stored": _liar(d / "stored.npz", zipfile.ZIP_STORED),
            "deflated": _liar(d / "deflated.npz", zipfile.ZIP_DEFLATED)}


@pytest.mark.parametrize("case", ["bomb", "stored", "deflated"])
def test_compare_refuses_an_npz_larger_than_the_comparison_needs_in_bounded_memory(hostile_npz, case):
    path = hostile_npz[case]
    rc, err, peak = _cli(["compare", "--model", "shakespeare-gpt2", "--ids", "1 2 3", "--theirs", path])
    print(f"{case}: {path.stat().st_size:,} bytes on disk, peak RSS {peak} MB")
    _one_line_error(rc, err, str(path))
    assert 0 < peak < 200, peak


@pytest.mark.parametrize("case", ["stored", "deflated"])
def test_npz_read_refuses_sizes_the_archive_cannot_hold(hostile_npz, case):
    from refimpl.checkpoint import WeightFileError, npz_read

    with zipfile.ZipFile(hostile_npz[case]) as z, pytest.raises(WeightFileError, match="more than its"):
        npz_read(z, "x.npy")


def test_npz_read_in_chunks_gives_np_load_s_arrays(tmp_path):
    """Chunked reading changes nothing: C and Fortran order, big-endian, 0-d, empty, strings, compressed."""
    from refimpl.checkpoint import npz_read

    rng = np.random.default_rng(0)
    arrays = {"c": rng.standard_normal((3, 700_000)).astype(np.float32), "f": np.asfortranarray(rng.random((5, 7))),
              "be": np.arange(10, dtype=">i4"), "zero_d": np.array(3.5), "empty": np.zeros((0, 4)),
              "s": np.array("config text")}
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "a.npz", **arrays)
        with zipfile.ZipFile(tmp_path / "a.npz") as z:
            for k, a in arrays.items():
                got = npz_read(z, k + ".npy")
                assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a), k
        with zipfile.ZipFile(tmp_path / "a.npz") as z:
            from refimpl.checkpoint import WeightFileError

            with pytest.raises(WeightFileError, match="at most 1,000 are read"):
                npz_read(z, "c.npy", max_bytes=1000)


# ----------------------------------------------------------------------------- files read before their check

@pytest.fixture(scope="module")
def odd_configs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    (d / "fifo").mkdir()
    os.mkfifo(d / "fifo" / "config.json")
    (d / "deep").mkdir()
    (d / "deep" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(d / "text.fifo")
    return d


@pytest.mark.parametrize("kind", ["fifo", "deep"])
@pytest.mark.parametrize("argv", [["generate", "--ids", "1"], ["inspect", "lens", "--ids", "1"],
                                  ["compare", "--ids", "1", "--theirs", "x.npz"]], ids=lambda a: a[0])
def test_a_fifo_or_deeply_nested_config_is_one_line(odd_configs, kind, argv, tmp_path):
    rc, err, _ = _cli([*argv, "--model", odd_configs / kind, *(["--out", tmp_path] if argv[0] == "inspect" else [])],
                      timeout=120)
    _one_line_error(rc, err, "config.json", "FIFO" if kind == "fifo" else "nested too deeply")


@pytest.mark.parametrize("file", ["/dev/zero", "text.fifo"])
def test_inspect_file_reads_only_a_regular_file(odd_configs, file, tmp_path):
    path = file if file.startswith("/") else odd_configs / file
    rc, err, peak = _cli(["inspect", "lens", "--file", path, "--out", tmp_path], timeout=120)
    _one_line_error(rc, err, f"--file {path} is a")
    assert peak < 300


@pytest.mark.parametrize("where", ["tensor", "metadata"])
def test_a_safetensors_header_nested_900_deep_is_our_error(where):
    from refimpl.safetensors import SafetensorsError, parse_header

    deep = "[" * 900 + "]" * 900
    text = ('{"__metadata__": {"k": %s}}' if where == "metadata" else '{"t": %s}') % deep
    prefix = struct.pack("<Q", len(text)) + text.encode()
    with pytest.raises(SafetensorsError, match="__metadata__ must be" if where == "metadata" else "must be an object"):
        parse_header(prefix, len(prefix))


# ----------------------------------------------------------------------------- outputs, flags

def test_every_path_compare_writes_is_checked_before_work(tmp_path, capsys):
    from refimpl.compare.cli import main

    (tmp_path / "a_folder.json").mkdir()
    base = ["--model", "shakespeare-gpt2", "--ids", "1", "2"]
    cases = [(["--json", tmp_path / "missing" / "r.json"], "does not exist"),
             (["--json", tmp_path / "a_folder.json"], "is a directory"),
             (["--json", "/proc/r.json"], "/proc"),
             (["--json", tmp_path / "r.txt"], "ending in .json"),
             (["--json", ""], "expected a file name"),
             (["--plot", tmp_path / "missing" / "r.png"], "does not exist"),
             (["--plot", tmp_path], "expected a file name ending in"),
             (["--plot", "/proc/r.png"], "/proc"),
             (["--plot", tmp_path / "r.gif"], "ending in .png or .svg or .pdf"),
             (["--write-reference", tmp_path / "missing" / "r.npz"], "does not exist"),
             (["--write-reference", tmp_path / "r.pt"], "ending in .safetensors or .npz")]
    for extra, words in cases:
        side = [] if "--write-reference" in extra else ["--theirs", tmp_path / "never_read.npz"]
        rc = main([*map(str, base + side + extra)])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and words in err, (extra, err)


def test_flags_and_ids_are_checked_before_work(capsys):
    import refimpl
    from refimpl.__main__ import main

    assert main(["generate", "--beams", "4", "--length-penalty", "1e308", "--ids", "1", "2",
                 "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --length-penalty must lie in [-646.1, 646.1] with --max-new-tokens=3"), err
    model = refimpl.load("shakespeare-gpt2")
    with pytest.raises(ValueError, match=r"prompt has token id 9223372036854775808 at index \(1,\), outside the "
                                         r"vocabulary \[0, 3072\)"):
        refimpl.generate(model, [1, 2**63], max_new_tokens=1)


def test_export_refuses_the_current_folder_and_the_source(tmp_path, monkeypatch, capsys):
    from refimpl.__main__ import main
    from refimpl.models import export

    src = tmp_path / "src"
    export("shakespeare-gpt2", src)
    before = sorted(p.name for p in src.iterdir())
    monkeypatch.chdir(src)
    for out, words in (("", "--out is empty"), (".", "--out . is the current folder"),
                       (f"../{src.name}/", "is the current folder"), (str(src), "is the current folder")):
        assert main(["export", "--model", str(src), "--out", out]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err, (out, err)
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--model", "src", "--out", "src"]) == 2
    assert "is the folder of the model being exported" in capsys.readouterr().err
    assert sorted(p.name for p in src.iterdir()) == before
