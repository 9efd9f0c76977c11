"""write_private_file (mconn/core/private_file.py): the one atomic 0600 write mconn does,
for a node's key and the address book.

A crash between the write and the rename is simulated by making ``os.replace`` raise:
the old file must be there, whole, and no temporary file left behind.
"""

import os
import stat

import pytest

from mconn.core import private_file
from mconn.core.private_file import write_private_file

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes and directory fsync are POSIX")


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writes_the_data_and_leaves_only_the_file(tmp_path):
    path = tmp_path / "book.json"
    write_private_file(path, b"first")
    write_private_file(str(path), b"second")
    assert path.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["book.json"]


def test_replaces_the_old_file_by_a_rename_never_in_place(tmp_path):
    """The old inode is not rewritten: a reader holding it open sees the old data whole."""
    path = tmp_path / "book.json"
    path.write_bytes(b"old data")
    with open(path, "rb") as reader:
        write_private_file(path, b"new")
        assert reader.read() == b"old data"
    assert path.read_bytes() == b"new"


def test_a_crash_between_write_and_replace_leaves_the_old_file(tmp_path, monkeypatch):
    """os.replace raising stands for a crash after the temporary file was written and
    synced: the old file is whole, the error propagates, the temporary file is gone."""
    path = tmp_path / "book.json"
    write_private_file(path, b"old data")
    written = []

    def crash(source, destination):
        written.append(open(source, "rb").read())  # the new data was complete by then
        raise OSError(5, "simulated crash before the rename")

    monkeypatch.setattr(private_file.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write_private_file(path, b"new data")
    assert written == [b"new data"]
    assert path.read_bytes() == b"old data"
    assert os.listdir(tmp_path) == ["book.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "book.json"
    write_private_file(path, b"old data")

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(private_file.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_private_file(path, b"new data")
    assert path.read_bytes() == b"old data"
    assert os.listdir(tmp_path) == ["book.json"]


@posix_only
@pytest.mark.parametrize("umask", [0, 0o022, 0o377])
def test_the_file_is_0600_whatever_the_umask(tmp_path, umask):
    """0 would leave it wide open without the explicit mode; 0o377 would take the owner's
    write bit."""
    old = os.umask(umask)
    try:
        write_private_file(tmp_path / "key.pem", b"secret")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "key.pem") == 0o600


@posix_only
def test_an_existing_wider_file_is_replaced_by_a_0600_one(tmp_path):
    path = tmp_path / "key.pem"
    path.write_bytes(b"old")
    path.chmod(0o644)
    write_private_file(path, b"new")
    assert mode_of(path) == 0o600


@posix_only
def test_the_directory_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    """The rename is on disk only once the directory is synced: the file is synced before
    os.replace, the directory after it."""
    steps = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        steps.append(("fsync", "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        real_fsync(fd)

    def replace(source, destination):
        steps.append(("replace", os.path.basename(destination)))
        real_replace(source, destination)

    monkeypatch.setattr(private_file.os, "fsync", fsync)
    monkeypatch.setattr(private_file.os, "replace", replace)
    write_private_file(tmp_path / "book.json", b"data")
    assert steps == [("fsync", "file"), ("replace", "book.json"), ("fsync", "directory")]


def test_a_missing_directory_raises_and_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_private_file(tmp_path / "missing" / "book.json", b"data")
    assert os.listdir(tmp_path) == []
