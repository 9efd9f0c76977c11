"""NodeKey: the Ed25519 key pair that names a node, and the node id derived from it.

The node id is CometBFT's (``PubKeyToID`` in its ``p2p/key.go``): the first 20 bytes of
SHA-256 over the raw 32-byte public key, as 40 lowercase hex characters.

On disk a key is one PEM file (PKCS8, unencrypted) that only its owner may read. ``save``
writes it with ``mconn.core.private_file`` (mode 0600, a temporary name in the same
directory renamed into place, the directory fsynced), so a reader never sees a
half-written or world-readable key. ``load`` refuses a file that group or other could
read, the way ssh refuses a loose private key.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from mconn.core.private_file import write_private_file

#: Length in bytes of a raw Ed25519 public key.
PUBLIC_KEY_SIZE = 32
#: Length in bytes of a node id (its hex form is twice as long).
NODE_ID_SIZE = 20


def node_id_from_public_key(raw: bytes) -> str:
    """The node id of a raw Ed25519 public key.

    :param raw: the 32-byte public key, as sent in the handshake.
    :returns: 40 lowercase hex characters.
    :raises ValueError: if ``raw`` is not 32 bytes.
    """
    if not isinstance(raw, bytes) or len(raw) != PUBLIC_KEY_SIZE:
        got = f"{len(raw)} bytes" if isinstance(raw, (bytes, bytearray)) else type(raw).__name__
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_SIZE} bytes, got {got}")
    return hashlib.sha256(raw).digest()[:NODE_ID_SIZE].hex()


class NodeKey:
    """An Ed25519 private key and the node id it gives.

    :param private_key: the key; use :meth:`generate`, :meth:`load` or
        :meth:`load_or_create` rather than building one by hand.
    """

    def __init__(self, private_key: ed25519.Ed25519PrivateKey) -> None:
        if not isinstance(private_key, ed25519.Ed25519PrivateKey):
            raise TypeError(f"NodeKey needs an Ed25519PrivateKey, got {type(private_key).__name__}")
        self._private_key = private_key
        self._public_key_bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self._node_id = node_id_from_public_key(self._public_key_bytes)

    @classmethod
    def generate(cls) -> NodeKey:
        """A new random key."""
        return cls(ed25519.Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NodeKey:
        """Read a key written by :meth:`save`.

        :raises ValueError: if the file is missing or unreadable, readable by group or
            other, or not an unencrypted PEM Ed25519 private key; the message names the path.
        """
        path = os.fspath(path)
        return cls(_parse_pem(path, _read_private_file(path)))

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> NodeKey:
        """Load the key at ``path``, or generate one and save it there if there is none.

        Two processes creating the same missing file at once may each keep a different key;
        create a node's key before starting several processes on it.
        """
        if os.path.lexists(path):
            return cls.load(path)
        key = cls.generate()
        key.save(path)
        return key

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key to ``path`` as PEM (PKCS8, unencrypted), mode 0600, atomically.

        An existing file at ``path`` is replaced.

        :raises OSError: if the directory is missing or not writable.
        """
        pem = self._private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        write_private_file(path, pem)

    @property
    def private_key(self) -> ed25519.Ed25519PrivateKey:
        """The ``cryptography`` private key object."""
        return self._private_key

    @property
    def public_key_bytes(self) -> bytes:
        """The raw 32-byte public key."""
        return self._public_key_bytes

    @property
    def node_id(self) -> str:
        """40 lowercase hex characters; see :func:`node_id_from_public_key`."""
        return self._node_id

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return self._private_key.sign(data)

    def __repr__(self) -> str:
        return f"NodeKey(node_id={self._node_id!r})"


def _read_private_file(path: str) -> bytes:
    """The bytes of ``path``, once its mode is known to keep group and other out."""
    try:
        with open(path, "rb") as f:
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            if os.name == "posix" and mode & 0o077:
                raise ValueError(
                    f"node key {path!r} has mode {mode:04o}, which lets group or other "
                    f"read it; run: chmod 600 {shlex.quote(path)}"
                )
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read node key {path!r}: {e.strerror or e}") from e


def _parse_pem(path: str, data: bytes) -> ed25519.Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as e:  # cryptography's way of saying "encrypted, and no password"
        raise ValueError(f"node key {path!r} is encrypted; mconn keys are stored unencrypted") from e
    except Exception as e:  # ValueError, UnsupportedAlgorithm: not a key we can read
        raise ValueError(f"node key {path!r} is not a PEM private key ({e})") from e
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"node key {path!r} holds {_describe(key)}, not an Ed25519 private key")
    return key


def _describe(key: object) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return f"an RSA-{key.key_size} private key"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return f"an EC private key on curve {key.curve.name}"
    if isinstance(key, ed448.Ed448PrivateKey):
        return "an Ed448 private key"
    return f"a {type(key).__name__}"
