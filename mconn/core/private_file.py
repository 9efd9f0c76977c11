"""Files only their owner may read, written atomically: a node's key, the address book.

``write_private_file`` is the one way mconn writes such a file. A crash at any moment
leaves the old file or the new one, never a part of one, and never a copy anyone but the
owner could read:

1. the data goes to a temporary file in the same directory (so the rename below stays
   on one file system), created with mode 0600 and ``O_EXCL`` (no other file is taken
   over), and is fsynced;
2. ``os.replace`` renames it over ``path`` (atomic on POSIX);
3. the directory is fsynced, so the rename itself survives a power loss.

An error at step 1 or 2 removes the temporary file and leaves ``path`` as it was.
"""

from __future__ import annotations

import os
import secrets

__all__ = ["FILE_MODE", "write_private_file"]

#: The mode of every file written here: read and write by its owner only.
FILE_MODE = 0o600


def write_private_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, mode 0600 (the module docstring says how).

    :raises OSError: if the directory is missing or not writable, or a write or the rename
        fails; ``path`` is then left as it was.
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, f".{name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):  # POSIX: the umask may have taken bits off the owner's
                os.fchmod(f.fileno(), FILE_MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """fsync ``directory``, so that a rename in it is on disk; a no-op where a directory
    cannot be opened or synced (some file systems, Windows): the file itself is synced."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
