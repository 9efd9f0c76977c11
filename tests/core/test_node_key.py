"""NodeKey: id derivation, the PEM file on disk, and what load refuses."""

import hashlib
import os
import stat
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from mconn.core.node_key import NodeKey, node_id_from_public_key

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")

# RFC 8032 section 7.1, TEST 1: a fixed key, so the id below is a true vector.
RFC8032_SECRET = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def write_private(path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def pem_of(private_key) -> bytes:
    return private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def test_node_id_is_first_20_bytes_of_sha256_of_raw_public_key():
    """On the RFC 8032 key, the node id is the hex of the first 20 bytes of sha256(raw public key)."""
    key = NodeKey(ed25519.Ed25519PrivateKey.from_private_bytes(RFC8032_SECRET))
    expected = hashlib.sha256(RFC8032_PUBLIC).hexdigest()[:40]
    assert key.public_key_bytes == RFC8032_PUBLIC
    assert key.node_id == expected
    assert node_id_from_public_key(RFC8032_PUBLIC) == expected


def test_generated_key_id_matches_its_public_key():
    """A generated key's id is derived from its own 32-byte public key, as 40 lowercase hex digits."""
    key = NodeKey.generate()
    raw = key.private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert key.public_key_bytes == raw
    assert len(raw) == 32
    assert key.node_id == hashlib.sha256(raw).digest()[:20].hex()
    assert len(key.node_id) == 40 and key.node_id == key.node_id.lower()


@pytest.mark.parametrize("raw", [b"", b"\x00" * 31, b"\x00" * 33, "a" * 32])
def test_node_id_from_public_key_refuses_wrong_size(raw):
    """node_id_from_public_key refuses anything but 32 bytes with a ValueError."""
    with pytest.raises(ValueError, match="32 bytes"):
        node_id_from_public_key(raw)


def test_constructor_refuses_other_key_types():
    """NodeKey wraps only an Ed25519PrivateKey; another key type is a TypeError."""
    with pytest.raises(TypeError, match="Ed25519PrivateKey"):
        NodeKey(ec.generate_private_key(ec.SECP256R1()))


def test_sign_verifies_with_public_key():
    """sign() gives a 64-byte signature that verifies with the public key bytes."""
    key = NodeKey.generate()
    signature = key.sign(b"challenge")
    assert len(signature) == 64
    ed25519.Ed25519PublicKey.from_public_bytes(key.public_key_bytes).verify(signature, b"challenge")


def test_save_load_round_trip(tmp_path):
    """save then load gives the same key, as a PKCS8 PEM file, with no temporary file left."""
    path = tmp_path / "node_key.pem"
    key = NodeKey.generate()
    key.save(path)
    loaded = NodeKey.load(path)
    assert loaded.node_id == key.node_id
    assert loaded.public_key_bytes == key.public_key_bytes
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert [p.name for p in tmp_path.iterdir()] == ["node_key.pem"]  # no temp file left


def test_load_accepts_str_path(tmp_path):
    """save and load accept a str path as well as a Path."""
    key = NodeKey.generate()
    key.save(str(tmp_path / "k.pem"))
    assert NodeKey.load(str(tmp_path / "k.pem")).node_id == key.node_id


@posix_only
def test_saved_file_mode_is_0600_even_with_permissive_umask(tmp_path):
    """The saved key file is mode 0600 even under umask 0."""
    old = os.umask(0)
    try:
        NodeKey.generate().save(tmp_path / "k.pem")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "k.pem") == 0o600


@posix_only
def test_save_replaces_existing_file_and_tightens_mode(tmp_path):
    """save over an existing 0644 file replaces it and leaves mode 0600."""
    path = tmp_path / "k.pem"
    path.write_bytes(b"old")
    path.chmod(0o644)
    key = NodeKey.generate()
    key.save(path)
    assert mode_of(path) == 0o600
    assert NodeKey.load(path).node_id == key.node_id


def test_save_into_missing_directory_raises_oserror(tmp_path):
    """save into a directory that does not exist raises OSError."""
    with pytest.raises(OSError):
        NodeKey.generate().save(tmp_path / "missing" / "k.pem")


@posix_only
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_load_refuses_file_readable_by_others(tmp_path, mode):
    """load refuses a key file readable by group or others, naming the path, the mode and chmod 600."""
    path = tmp_path / "k.pem"
    NodeKey.generate().save(path)
    path.chmod(mode)
    with pytest.raises(ValueError) as info:
        NodeKey.load(path)
    message = str(info.value)
    assert str(path) in message
    assert f"{mode:04o}" in message
    assert "chmod 600" in message


def test_load_missing_file_names_path_and_os_error(tmp_path):
    """Loading a missing file is a ValueError naming the path and the OS error."""
    path = tmp_path / "absent.pem"
    with pytest.raises(ValueError) as info:
        NodeKey.load(path)
    assert str(path) in str(info.value)
    assert "No such file" in str(info.value)


def test_load_directory_is_value_error(tmp_path):
    """Loading a directory is a ValueError, not an OSError."""
    with pytest.raises(ValueError, match="cannot read node key"):
        NodeKey.load(tmp_path)


@pytest.mark.parametrize("data", [b"", b"garbage\n", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"])
def test_load_refuses_garbage(tmp_path, data):
    """An empty, non-PEM or corrupt PEM file is a ValueError naming the path."""
    path = tmp_path / "k.pem"
    write_private(path, data)
    with pytest.raises(ValueError) as info:
        NodeKey.load(path)
    assert str(path) in str(info.value)
    assert "not a PEM private key" in str(info.value)


@pytest.mark.parametrize(
    "private_key, found",
    [
        (rsa.generate_private_key(public_exponent=65537, key_size=1024), "RSA-1024"),
        (ec.generate_private_key(ec.SECP256R1()), "EC private key on curve secp256r1"),
    ],
    ids=["rsa", "ec"],
)
def test_load_refuses_other_key_types(tmp_path, private_key, found):
    """An RSA or EC key file is refused, naming the path and the kind of key found."""
    path = tmp_path / "k.pem"
    write_private(path, pem_of(private_key))
    with pytest.raises(ValueError) as info:
        NodeKey.load(path)
    message = str(info.value)
    assert str(path) in message
    assert found in message
    assert "not an Ed25519 private key" in message


def test_load_refuses_encrypted_key(tmp_path):
    """A password-protected key file is refused as encrypted."""
    path = tmp_path / "k.pem"
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    write_private(path, pem)
    with pytest.raises(ValueError, match="encrypted"):
        NodeKey.load(path)


def test_load_or_create_creates_then_reuses(tmp_path):
    """load_or_create writes a 0600 key the first time and loads the same key after."""
    path = tmp_path / "k.pem"
    first = NodeKey.load_or_create(path)
    assert path.exists()
    if os.name == "posix":
        assert mode_of(path) == 0o600
    second = NodeKey.load_or_create(path)
    assert second.node_id == first.node_id


def test_load_or_create_does_not_overwrite_a_bad_file(tmp_path):
    """load_or_create raises on an unreadable key file and leaves it untouched."""
    path = tmp_path / "k.pem"
    write_private(path, b"garbage")
    with pytest.raises(ValueError):
        NodeKey.load_or_create(path)
    assert path.read_bytes() == b"garbage"


def test_repr_shows_node_id_and_hides_key_material():
    """repr shows the node id and no key material."""
    key = NodeKey(ed25519.Ed25519PrivateKey.from_private_bytes(RFC8032_SECRET))
    text = repr(key)
    assert text == f"NodeKey(node_id={key.node_id!r})"
    for secret in (RFC8032_SECRET, RFC8032_PUBLIC):
        assert secret.hex() not in text.lower()
    assert "PRIVATE" not in text


def test_modules_do_not_import_twisted():
    """Importing mconn.core.node_key and mconn.core.address loads no Twisted."""
    code = "import sys, mconn.core.node_key, mconn.core.address; print('twisted' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
