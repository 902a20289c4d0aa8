"""refimpl._files: inputs must be regular files; outputs are written atomically, never through a link."""

import os
import threading

import pytest

from refimpl._files import (NotARegularFileError, check_regular_file, open_regular, read_regular_text,
                            write_bytes_atomic, write_text_atomic)


def test_fifo_is_refused_at_once_not_opened(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(NotARegularFileError, match="FIFO"):
        check_regular_file(fifo, "model")
    result = {}

    def attempt():  # if open_regular blocked on the FIFO, this thread would never finish
        try:
            open_regular(fifo, "model")
        except NotARegularFileError as e:
            result["err"] = str(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "open_regular blocked on a FIFO"
    assert "FIFO" in result["err"] and "model" in result["err"]


def test_directory_and_device_and_missing(tmp_path):
    with pytest.raises(NotARegularFileError, match="directory"):
        open_regular(tmp_path)
    with pytest.raises(NotARegularFileError, match="device"):
        check_regular_file("/dev/null")
    with pytest.raises(NotARegularFileError, match="device"):
        open_regular("/dev/zero")
    with pytest.raises(FileNotFoundError, match="no such file"):
        open_regular(tmp_path / "absent")


def test_symlink_to_regular_file_is_followed_for_reading(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert read_regular_text(tmp_path / "link.json") == "{}"


def test_size_limit(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="100 bytes; at most 10"):
        read_regular_text(tmp_path / "big", max_bytes=10)


def test_atomic_write_replaces_a_planted_symlink_without_following_it(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").symlink_to(outside)
    write_text_atomic(out / "config.json", "new")
    assert outside.read_text() == "precious"
    assert not (out / "config.json").is_symlink()
    assert (out / "config.json").read_text() == "new"
    assert sorted(os.listdir(out)) == ["config.json"]  # no temporary left behind


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    with pytest.raises(TypeError):
        write_bytes_atomic(target, object())  # the write itself fails
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["f.bin"]
