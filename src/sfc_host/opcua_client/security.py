"""The crypto of the secure channel (IEC 62541 Part 6 §6.7, Part 4 §5.6, Part 7's
SecurityPolicy Basic256Sha256): the chunks an OPC UA client or server sends and
receives, built and opened for the policies None and Basic256Sha256 in the modes None,
Sign and SignAndEncrypt; and the session's proofs (the signatures over the other side's
certificate and nonce, an encrypted password).

Pure: bytes in, bytes out, no sockets. A chunk is ``MessageHeader`` (type, chunk type,
MessageSize, SecureChannelId) + security header + [sequence header + body + padding +
signature]; the caller's *payload* is the sequence header and the body, so this module
reads neither.

- OPN (asymmetric): the security header names the policy, our certificate and the SHA-1
  thumbprint of the server's. In both secure modes the chunk is signed with our key
  (RSA PKCS#1 v1.5 SHA-256) and encrypted with the server's (RSA-OAEP SHA-1, blocks of
  key size - 42 bytes), as Part 6 §6.7.4 asks even in Sign mode.
- MSG and CLO (symmetric): the security header is the token id; the keys are the
  token's, derived by P_SHA256 from the two nonces (§6.7.5). HMAC-SHA256 in Sign mode,
  plus AES-256-CBC in SignAndEncrypt.

Signatures cover the headers (MessageSize counting the encrypted size) and the
plaintext; padding is a PaddingSize byte and that many bytes of its value, plus the
ExtraPaddingSize byte where the encrypting RSA key is over 2048 bits. A chunk that
fails a check raises ``SecurityError`` with one line.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from sfc_host.opcua_client.errors import OpcUaError

__all__ = ["BASIC256SHA256", "MODE_NONE", "MODE_SIGN", "MODE_SIGN_AND_ENCRYPT",
           "POLICY_NONE", "RSA_OAEP", "RSA_SHA256", "ChannelSecurity", "SecurityError",
           "decrypt_secret", "encrypt_secret", "first_certificate", "open_header",
           "thumbprint", "verify_signature"]

POLICY_NONE = "http://opcfoundation.org/UA/SecurityPolicy#None"
BASIC256SHA256 = "http://opcfoundation.org/UA/SecurityPolicy#Basic256Sha256"
MODE_NONE, MODE_SIGN, MODE_SIGN_AND_ENCRYPT = 1, 2, 3
RSA_OAEP = "http://www.w3.org/2001/04/xmlenc#rsa-oaep"            # Part 7: the policy's
RSA_SHA256 = "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"  # asymmetric algorithms

_NONCE = 32                     # SecureChannelNonceLength
_SIGNING_KEY, _ENCRYPTING_KEY, _IV = 32, 32, 16
_HMAC = 32                      # HMAC-SHA256's length: the symmetric signature
_AES_BLOCK = 16
_OAEP_OVERHEAD = 42             # 2 * SHA-1's length + 2: OAEP's plaintext = key bytes - 42
_MIN_KEY_BITS, _MAX_KEY_BITS = 2048, 4096
_HEADER = struct.Struct("<3scII")   # type, chunk type, MessageSize, SecureChannelId
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_MSG_TYPES = (b"MSG", b"CLO")
_CHUNK_TYPES = (b"F", b"C", b"A")
_SYMMETRIC_HEADERS = _HEADER.size + _U32.size


class SecurityError(OpcUaError):
    """A chunk that fails its check (signature, padding, token, sender), or a
    certificate or key that cannot be used; said in one line."""


@dataclass(frozen=True, slots=True)
class _Keys:
    """One direction's keys of one token."""
    signing: bytes
    encrypting: bytes
    iv: bytes


def thumbprint(der: bytes) -> bytes:
    """The SHA-1 of a DER certificate: how an OPN names the receiver's."""
    return hashlib.sha1(der).digest()


def encrypt_secret(policy_uri: str, server_certificate: bytes, secret: bytes,
                   server_nonce: bytes) -> tuple[bytes, str]:
    """A UserNameIdentityToken's password as Part 4 §7.36.3 lays it out: length (UInt32,
    of secret + nonce), the secret, the server's nonce; RSA-OAEP encrypted with the
    server's key. Returns (data, algorithm URI); for the policy None the secret as it is.
    """
    if policy_uri in (POLICY_NONE, ""):
        return secret, ""
    if policy_uri != BASIC256SHA256:
        raise SecurityError(f"security policy {policy_uri!r} is not supported")
    plain = _U32.pack(len(secret) + len(server_nonce)) + secret + server_nonce
    return _oaep_encrypt(_public_key(server_certificate, "the server's"), plain), RSA_OAEP


def decrypt_secret(private_key: Any, data: bytes, server_nonce: bytes) -> bytes:
    """The server's side of ``encrypt_secret``: the secret, once the data decrypts with
    the server's key, its length field fits and it ends with the server's nonce."""
    if not isinstance(private_key, rsa.RSAPrivateKey):
        raise SecurityError("the server's private key is no RSA key")
    size = private_key.key_size // 8
    if not data or len(data) % size:
        raise SecurityError("the encrypted secret is no whole number of RSA blocks")
    try:
        plain = b"".join(private_key.decrypt(data[i:i + size], _OAEP)
                         for i in range(0, len(data), size))
    except ValueError:
        raise SecurityError("the secret does not decrypt with the server's key") from None
    if len(plain) < 4:
        raise SecurityError("the decrypted secret is cut short")
    (n,) = _U32.unpack_from(plain)
    if n != len(plain) - 4 or n < len(server_nonce) or not plain.endswith(server_nonce):
        raise SecurityError("the decrypted secret does not end with the server's nonce")
    return plain[4:len(plain) - len(server_nonce)]


def open_header(chunk: bytes) -> tuple[str, bytes | None, bytes | None]:
    """An OPN chunk's asymmetric security header: (policy URI, sender certificate,
    receiver's thumbprint); what a server reads before it knows the channel's security."""
    _header(chunk)
    at = _HEADER.size
    uri, at = _read_bytestring(chunk, at)
    sender, at = _read_bytestring(chunk, at)
    receiver, at = _read_bytestring(chunk, at)
    try:
        return (uri or b"").decode(), sender, receiver
    except UnicodeDecodeError:
        raise SecurityError("the OPN's policy URI is no UTF-8") from None


class ChannelSecurity:
    """The security of one secure channel, either side of it (``server``). ``certificate``
    and ``private_key`` are ours, ``peer_certificate`` the other side's (all needed but in
    mode None). The symmetric keys are kept per token id: ``derive`` after each
    OpenSecureChannel exchange, ``forget`` once the old token is out of use. A server
    that takes a Basic256Sha256 OPN makes it with the mode SignAndEncrypt and sets
    ``mode`` to the request's once the OPN is open: the asymmetric chunks are the same
    in both modes."""

    def __init__(self, mode: int, certificate: bytes | None = None,
                 private_key: Any = None, peer_certificate: bytes | None = None,
                 *, server: bool = False) -> None:
        self.server = server
        if mode not in (MODE_NONE, MODE_SIGN, MODE_SIGN_AND_ENCRYPT):
            raise SecurityError(f"security mode {mode} is none of 1 (None), 2 (Sign), "
                                "3 (SignAndEncrypt)")
        self.mode = mode
        self.policy_uri = POLICY_NONE if mode == MODE_NONE else BASIC256SHA256
        self._peer = "the client's" if server else "the server's"
        # token id -> (our keys, the peer's keys); None for both in mode None
        self._tokens: dict[int, tuple[_Keys | None, _Keys | None]] = {}
        if mode == MODE_NONE:
            self._security_header = (_bytestring(POLICY_NONE.encode()) + _bytestring(None)
                                     + _bytestring(None))
            return
        if certificate is None or private_key is None or peer_certificate is None:
            raise SecurityError("a secure channel needs our certificate, our private key "
                                f"and {self._peer} certificate")
        if not isinstance(private_key, rsa.RSAPrivateKey):
            raise SecurityError("our private key is no RSA key")
        ours = _public_key(certificate, "our")
        if ours.public_numbers() != private_key.public_key().public_numbers():
            raise SecurityError("our private key is not the key of our certificate")
        self._certificate = certificate
        self._key = private_key
        self._peer_certificate = peer_certificate
        self._peer_key = _public_key(peer_certificate, self._peer)
        self._key_bytes = private_key.key_size // 8
        self._peer_key_bytes = self._peer_key.key_size // 8
        self._security_header = (_bytestring(BASIC256SHA256.encode())
                                 + _bytestring(certificate)
                                 + _bytestring(thumbprint(peer_certificate)))
        self._our_thumbprint = thumbprint(certificate)

    def nonce(self) -> bytes:
        """A fresh nonce for OpenSecureChannel (b"" in mode None)."""
        return b"" if self.mode == MODE_NONE else os.urandom(_NONCE)

    # ---- OpenSecureChannel: asymmetric

    def encode_open(self, channel_id: int, payload: bytes) -> bytes:
        """Our OPN chunk (always a single, final one) around ``payload``."""
        sec = self._security_header
        if self.mode == MODE_NONE:
            size = _HEADER.size + len(sec) + len(payload)
            return _HEADER.pack(b"OPN", b"F", size, channel_id) + sec + payload
        block = self._peer_key_bytes - _OAEP_OVERHEAD
        plain = payload + _padding(len(payload) + self._key_bytes, block,
                                   self._peer_key_bytes > _MIN_KEY_BITS // 8)
        blocks = (len(plain) + self._key_bytes) // block
        size = _HEADER.size + len(sec) + blocks * self._peer_key_bytes
        head = _HEADER.pack(b"OPN", b"F", size, channel_id) + sec
        signature = self._key.sign(head + plain, padding.PKCS1v15(), hashes.SHA256())
        return head + _oaep_encrypt(self._peer_key, plain + signature, block)

    def decode_open(self, chunk: bytes) -> tuple[int, bytes]:
        """The peer's OPN chunk -> (channel id, payload), once its sender is the peer's
        certificate, it decrypts with our key and its signature and padding hold."""
        kind, final, channel_id = _header(chunk)
        if kind != b"OPN" or final != b"F":
            raise SecurityError(f"a {kind!r} chunk of type {final!r} where an OPN was due")
        at = _HEADER.size
        uri, at = _read_bytestring(chunk, at)
        sender, at = _read_bytestring(chunk, at)
        receiver, at = _read_bytestring(chunk, at)
        if (uri or b"") != self.policy_uri.encode():
            raise SecurityError(f"{self._peer} OPN is of policy {uri!r}, not "
                                f"{self.policy_uri}")
        if self.mode == MODE_NONE:
            return channel_id, chunk[at:]
        if not sender or first_certificate(sender) != self._peer_certificate:
            raise SecurityError(f"the OPN's sender certificate is not {self._peer}")
        if receiver != self._our_thumbprint:
            raise SecurityError("the OPN is encrypted for another certificate than ours")
        cipher = chunk[at:]
        if not cipher or len(cipher) % self._key_bytes:
            raise SecurityError(f"the OPN's {len(cipher)} encrypted bytes are no whole "
                                f"number of {self._key_bytes}-byte blocks")
        try:
            plain = b"".join(self._key.decrypt(cipher[i:i + self._key_bytes], _OAEP)
                             for i in range(0, len(cipher), self._key_bytes))
        except ValueError:
            raise SecurityError("the OPN does not decrypt with our key") from None
        sig_len = self._peer_key_bytes
        if len(plain) < sig_len + 1:
            raise SecurityError("the OPN is too short for its signature")
        signed, signature = plain[:-sig_len], plain[-sig_len:]
        try:
            self._peer_key.verify(signature, chunk[:at] + signed, padding.PKCS1v15(),
                                  hashes.SHA256())
        except InvalidSignature:
            raise SecurityError("the OPN's signature is wrong") from None
        # we decrypted, so our key's size says whether the sender added ExtraPaddingSize
        return channel_id, _unpad(signed, self._key_bytes > _MIN_KEY_BITS // 8, "OPN")

    # ---- the symmetric keys

    def derive(self, token_id: int, client_nonce: bytes, server_nonce: bytes) -> None:
        """The keys of a token (Part 6 §6.7.5): ours from P_SHA256(server nonce, client
        nonce), the server's from P_SHA256(client nonce, server nonce). In mode None it
        only records the token id."""
        if self.mode == MODE_NONE:
            self._tokens[token_id] = (None, None)
            return
        for who, nonce in (("the client's", client_nonce), ("the server's", server_nonce)):
            if len(nonce) != _NONCE:
                raise SecurityError(f"{who} nonce has {len(nonce)} bytes, "
                                    f"Basic256Sha256 wants {_NONCE}")
        clients, servers = _derive(server_nonce, client_nonce), _derive(client_nonce,
                                                                         server_nonce)
        self._tokens[token_id] = (servers, clients) if self.server else (clients, servers)

    def forget(self, token_id: int) -> None:
        """Drop an old token's keys, once the new token is in use both ways."""
        self._tokens.pop(token_id, None)

    # ---- MSG and CLO: symmetric

    def encode_message(self, msg_type: bytes, chunk_type: bytes, channel_id: int,
                       token_id: int, payload: bytes) -> bytes:
        """Our MSG or CLO chunk around ``payload``, with the keys of ``token_id``."""
        if msg_type not in _MSG_TYPES or chunk_type not in _CHUNK_TYPES:
            raise ValueError(f"no symmetric chunk {msg_type!r}/{chunk_type!r}")
        keys = self._token(token_id)[0]
        token = _U32.pack(token_id)
        if keys is None:
            size = _SYMMETRIC_HEADERS + len(payload)
            return _HEADER.pack(msg_type, chunk_type, size, channel_id) + token + payload
        plain = payload
        if self.mode == MODE_SIGN_AND_ENCRYPT:
            plain += _padding(len(payload) + _HMAC, _AES_BLOCK, False)
        size = _SYMMETRIC_HEADERS + len(plain) + _HMAC
        head = _HEADER.pack(msg_type, chunk_type, size, channel_id) + token
        plain += hmac.digest(keys.signing, head + plain, "sha256")
        if self.mode == MODE_SIGN:
            return head + plain
        enc = _aes(keys).encryptor()
        return head + enc.update(plain) + enc.finalize()

    def decode_message(self, chunk: bytes) -> tuple[bytes, bytes, int, int, bytes]:
        """The peer's MSG or CLO chunk -> (message type, chunk type, channel id, token
        id, payload), checked and decrypted with the keys of its token id."""
        kind, final, channel_id = _header(chunk)
        if kind not in _MSG_TYPES or final not in _CHUNK_TYPES:
            raise SecurityError(f"a {kind!r} chunk of type {final!r} where MSG or CLO "
                                "was due")
        if len(chunk) < _SYMMETRIC_HEADERS:
            raise SecurityError(f"a {kind.decode()} chunk of {len(chunk)} bytes")
        (token_id,) = _U32.unpack_from(chunk, _HEADER.size)
        keys = self._token(token_id)[1]
        body = chunk[_SYMMETRIC_HEADERS:]
        if keys is None:
            return kind, final, channel_id, token_id, body
        if self.mode == MODE_SIGN_AND_ENCRYPT:
            if len(body) % _AES_BLOCK:
                raise SecurityError(f"the {kind.decode()} chunk's {len(body)} encrypted "
                                    "bytes are no whole number of AES blocks")
            dec = _aes(keys).decryptor()
            body = dec.update(body) + dec.finalize()
        if len(body) < _HMAC:
            raise SecurityError(f"the {kind.decode()} chunk is too short for its signature")
        plain, signature = body[:-_HMAC], body[-_HMAC:]
        expected = hmac.digest(keys.signing, chunk[:_SYMMETRIC_HEADERS] + plain, "sha256")
        if not hmac.compare_digest(signature, expected):
            raise SecurityError(f"the {kind.decode()} chunk's signature is wrong")
        if self.mode == MODE_SIGN_AND_ENCRYPT:
            plain = _unpad(plain, False, kind.decode())
        return kind, final, channel_id, token_id, plain

    def max_payload(self, buffer_size: int, asymmetric: bool = False) -> int:
        """The most payload bytes one chunk of ``buffer_size`` bytes carries, after the
        headers, the padding and the signature (0 where none fit)."""
        if asymmetric:
            room = buffer_size - _HEADER.size - len(self._security_header)
            if self.mode != MODE_NONE:
                extra = self._peer_key_bytes > _MIN_KEY_BITS // 8
                blocks = room // self._peer_key_bytes
                room = (blocks * (self._peer_key_bytes - _OAEP_OVERHEAD) - self._key_bytes
                        - (2 if extra else 1))
        else:
            room = buffer_size - _SYMMETRIC_HEADERS
            if self.mode == MODE_SIGN:
                room -= _HMAC
            elif self.mode == MODE_SIGN_AND_ENCRYPT:
                room = room // _AES_BLOCK * _AES_BLOCK - _HMAC - 1
        return max(room, 0)

    # ---- the session's proofs

    def client_signature(self, server_certificate: bytes,
                         server_nonce: bytes) -> tuple[str, bytes]:
        """ActivateSession's clientSignature (Part 4 §5.6.3): (algorithm URI, our
        signature over the server's certificate + its nonce); ("", b"") in mode None. A
        server's CreateSession signature is the same over the client's certificate and
        nonce."""
        if self.mode == MODE_NONE:
            return "", b""
        data = server_certificate + server_nonce
        return RSA_SHA256, self._key.sign(data, padding.PKCS1v15(), hashes.SHA256())

    def _token(self, token_id: int) -> tuple[_Keys | None, _Keys | None]:
        try:
            return self._tokens[token_id]
        except KeyError:
            raise SecurityError(f"unknown token id {token_id}") from None


_OAEP = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(),
                     label=None)


def _public_key(der: bytes, whose: str) -> rsa.RSAPublicKey:
    try:
        key = x509.load_der_x509_certificate(first_certificate(der)).public_key()
    except (ValueError, SecurityError):
        raise SecurityError(f"{whose} certificate is no DER X.509 certificate") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise SecurityError(f"{whose} certificate holds no RSA key")
    if not _MIN_KEY_BITS <= key.key_size <= _MAX_KEY_BITS:
        raise SecurityError(f"{whose} certificate's key has {key.key_size} bits, "
                            f"Basic256Sha256 wants {_MIN_KEY_BITS} to {_MAX_KEY_BITS}")
    return key


def first_certificate(der: bytes) -> bytes:
    """The first certificate of a DER chain (a sender may send its chain after it), as
    the DER bytes it was sent as."""
    if len(der) < 2 or der[0] != 0x30:
        raise SecurityError("a certificate that is no DER SEQUENCE")
    n = der[1]
    if n < 0x80:
        end = 2 + n
    else:
        width = n & 0x7F
        end = 2 + width + int.from_bytes(der[2:2 + width], "big")
    if end > len(der):
        raise SecurityError("a certificate cut short")
    return der[:end]


def verify_signature(certificate: bytes, signature: bytes, data: bytes, what: str) -> None:
    """An RSA PKCS#1 v1.5 SHA-256 signature by the key of ``certificate`` (a server's
    session signature); ``SecurityError`` naming ``what`` when it is wrong."""
    try:
        _public_key(certificate, what).verify(signature, data, padding.PKCS1v15(),
                                              hashes.SHA256())
    except InvalidSignature:
        raise SecurityError(f"{what} is wrong") from None


def _oaep_encrypt(key: rsa.RSAPublicKey, plain: bytes, block: int = 0) -> bytes:
    block = block or key.key_size // 8 - _OAEP_OVERHEAD
    return b"".join(key.encrypt(plain[i:i + block], _OAEP)
                    for i in range(0, len(plain), block))


def _padding(used: int, block: int, extra: bool) -> bytes:
    """The padding that makes ``used`` bytes (payload + signature) whole blocks: the
    PaddingSize byte and that many bytes of its value, then ExtraPaddingSize (the high
    byte) where the RSA key is over 2048 bits."""
    fields = 2 if extra else 1
    n = -(used + fields) % block
    return bytes([n & 0xFF]) * (n + 1) + (bytes([n >> 8]) if extra else b"")


def _unpad(plain: bytes, extra: bool, what: str) -> bytes:
    if extra:
        if len(plain) < 2:
            raise SecurityError(f"the {what} chunk's padding is cut short")
        n = plain[-2] | plain[-1] << 8
        region, end = plain[-n - 2:-1], len(plain) - n - 2
    else:
        n = plain[-1] if plain else 0
        region, end = plain[-n - 1:], len(plain) - n - 1
    if end < 0 or not plain or region.count(n & 0xFF) != n + 1:
        raise SecurityError(f"the {what} chunk's padding is bad")
    return plain[:end]


def _header(chunk: bytes) -> tuple[bytes, bytes, int]:
    if len(chunk) < _HEADER.size:
        raise SecurityError(f"a chunk of {len(chunk)} bytes is shorter than its header")
    kind, final, size, channel_id = _HEADER.unpack_from(chunk)
    if size != len(chunk):
        raise SecurityError(f"a chunk of {len(chunk)} bytes says it has {size}")
    return kind, final, channel_id


def _bytestring(value: bytes | None) -> bytes:
    return _I32.pack(-1) if value is None else _I32.pack(len(value)) + value


def _read_bytestring(data: bytes, at: int) -> tuple[bytes | None, int]:
    if at + 4 > len(data):
        raise SecurityError("the OPN's security header is cut short")
    (n,) = _I32.unpack_from(data, at)
    at += 4
    if n < 0:
        return None, at
    if at + n > len(data):
        raise SecurityError("the OPN's security header is cut short")
    return data[at:at + n], at + n


def _p_sha256(secret: bytes, seed: bytes, length: int) -> bytes:
    """P_SHA256 of RFC 5246 §5: A(i) = HMAC(secret, A(i-1)), out += HMAC(secret, A(i) +
    seed), A(0) = seed."""
    out, a = b"", seed
    while len(out) < length:
        a = hmac.digest(secret, a, "sha256")
        out += hmac.digest(secret, a + seed, "sha256")
    return out[:length]


def _derive(secret: bytes, seed: bytes) -> _Keys:
    k = _p_sha256(secret, seed, _SIGNING_KEY + _ENCRYPTING_KEY + _IV)
    return _Keys(k[:_SIGNING_KEY], k[_SIGNING_KEY:_SIGNING_KEY + _ENCRYPTING_KEY],
                 k[_SIGNING_KEY + _ENCRYPTING_KEY:])


def _aes(keys: _Keys) -> Cipher:
    # every chunk starts from the token's IV (Part 6 §6.7.5), so a fresh context each
    return Cipher(algorithms.AES(keys.encrypting), modes.CBC(keys.iv))
