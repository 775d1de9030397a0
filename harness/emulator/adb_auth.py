"""adb's device-side authentication: which host keys a device trusts, and whether a token was signed by one.

An adb host proves itself by signing the device's 20-byte random token with its RSA key (adb's AUTH
SIGNATURE); adbd checks the signature against the public keys in its adb_keys file. The public key format
is Android's own (AOSP libcrypto_utils android_pubkey.cpp): base64 of a little-endian struct
{u32 words; u32 n0inv; u32 modulus[words]; u32 rr[words]; u32 exponent} followed by " user@host".
The host signs with RSA_sign(NID_sha1, token), i.e. PKCS#1 v1.5 with a SHA-1 DigestInfo around the raw
token. Verification is one modular exponentiation compared byte for byte with the expected encoding
(RFC 8017 8.2.2, encode-and-compare, so no padding parser to get wrong); the venv has no crypto library
and this is all a device needs.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import struct
from dataclasses import dataclass
from pathlib import Path

TOKEN_SIZE = 20
# DER of DigestInfo{sha1, NULL} before the 20 digest bytes (RFC 8017 9.2, note 1).
SHA1_DIGEST_INFO = bytes.fromhex("3021300906052b0e03021a05000414")


class AdbKeyError(ValueError):
    """An adb public key file that cannot be read as one."""


@dataclass(frozen=True)
class PublicKey:
    modulus: int
    exponent: int
    comment: str

    @property
    def size(self) -> int:
        return (self.modulus.bit_length() + 7) // 8

    def verifies(self, token: bytes, signature: bytes) -> bool:
        """Whether `signature` is this key's PKCS#1 v1.5 SHA-1 signature of `token` (as adb signs it)."""
        if len(token) != TOKEN_SIZE or len(signature) != self.size:
            return False
        value = int.from_bytes(signature, "big")
        if value >= self.modulus:
            return False
        payload = SHA1_DIGEST_INFO + token
        expected = b"\x00\x01" + b"\xff" * (self.size - 3 - len(payload)) + b"\x00" + payload
        return hmac.compare_digest(pow(value, self.exponent, self.modulus).to_bytes(self.size, "big"), expected)


def parse_public_key(line: str) -> PublicKey:
    """One line of an adb_keys / adbkey.pub file."""
    encoded, _, comment = line.strip().partition(" ")
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise AdbKeyError(f"not base64 ({error})") from error
    if len(blob) < 8:
        raise AdbKeyError("too short for an adb public key")
    words = struct.unpack_from("<I", blob)[0]
    if not 16 <= words <= 256 or len(blob) != 8 + 8 * words + 4:
        raise AdbKeyError(f"{len(blob)} bytes do not make an adb public key of {words} words")
    modulus = int.from_bytes(blob[8 : 8 + 4 * words], "little")
    exponent = struct.unpack_from("<I", blob, 8 + 8 * words)[0]
    if exponent < 3 or modulus.bit_length() < 512:
        raise AdbKeyError("implausible RSA key (exponent or modulus too small)")
    return PublicKey(modulus, exponent, comment)


def load_keys(path: Path) -> list[PublicKey]:
    """Every key of an adb_keys-style file (one per line); AdbKeyError names the file and the line."""
    keys = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                keys.append(parse_public_key(line))
            except AdbKeyError as error:
                raise AdbKeyError(f"{path}:{number}: {error}: give the adbkey.pub of the adb server") from error
    if not keys:
        raise AdbKeyError(f"{path}: no adb public key in it: give the adbkey.pub of the adb server")
    return keys


def user_key_files(env: dict[str, str]) -> list[Path]:
    """The private keys an adb server started by this user signs with: ~/.android/adbkey (adb's folder is
    $ANDROID_USER_HOME, else $HOME/.android) and ADB_VENDOR_KEYS (files, or folders of *.adb_key files)."""
    android = (
        Path(env["ANDROID_USER_HOME"])
        if env.get("ANDROID_USER_HOME")
        else Path(env.get("HOME", "~")).expanduser() / ".android"
    )
    files = [android / "adbkey"]
    for entry in filter(None, env.get("ADB_VENDOR_KEYS", "").split(":")):
        path = Path(entry).expanduser()
        files += sorted(path.glob("*.adb_key")) if path.is_dir() else [path]
    return files


def user_server_keys(adb: str, env: dict[str, str]) -> list[str]:
    """The public keys (adb_keys lines) of the user's adb server: each private key's .pub, else what
    `adb pubkey` derives from it (that is adb's own code, so no RSA key parsing is written here)."""
    import subprocess

    keys = []
    for private in user_key_files(env):
        public = private.with_name(private.name + ".pub")
        if public.is_file():
            line = public.read_text().strip()
        elif private.is_file():
            derived = subprocess.run([adb, "pubkey", str(private)], capture_output=True, text=True, timeout=30)
            line = derived.stdout.strip() if derived.returncode == 0 else ""
        else:
            continue
        try:
            parse_public_key(line)
        except AdbKeyError as error:
            raise AdbKeyError(
                f"{public if public.is_file() else private}: {error}: give the adb server's own key "
                f"(adb keygen) or fix ADB_VENDOR_KEYS"
            ) from error
        keys.append(line)
    if not keys:
        raise AdbKeyError(
            f"the adb server has no key to trust: none of {', '.join(map(str, user_key_files(env)))} "
            f"exists; run `adb start-server` once (it makes ~/.android/adbkey) or set ADB_VENDOR_KEYS"
        )
    return keys
