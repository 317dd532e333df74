"""The secure channel's crypto (``sfc_host.opcua_client.security``) against asyncua's, a
second and independent implementation: asyncua's server side (its ``SecureConnection``
choosing ``SecurityPolicyBasic256Sha256`` from our OPN, as its UaProcessor does) opens
the chunks we build, and we open the ones it builds, in the modes None, Sign and
SignAndEncrypt; with 2048- and 4096-bit keys (the ExtraPaddingSize byte). Then the
keys, the chunk sizes, tampered chunks, and the session's proofs."""

from __future__ import annotations

import datetime
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
from asyncua import ua
from asyncua.common.connection import MessageChunk, SecureConnection, TransportLimits
from asyncua.common.utils import Buffer
from asyncua.crypto import uacrypto
from asyncua.crypto.security_policies import (
    SecurityPolicyBasic256Sha256,
    SecurityPolicyFactory,
    SecurityPolicyNone,
)
from asyncua.ua.ua_binary import header_from_binary, struct_from_binary, struct_to_binary
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from sfc_host.errors import SfcHostError
from sfc_host.opcua_client.security import (
    BASIC256SHA256,
    MODE_NONE,
    MODE_SIGN,
    MODE_SIGN_AND_ENCRYPT,
    POLICY_NONE,
    RSA_OAEP,
    RSA_SHA256,
    ChannelSecurity,
    SecurityError,
    _p_sha256,
    encrypt_secret,
    thumbprint,
)

SEQ = struct.Struct("<II")
MODES = (MODE_NONE, MODE_SIGN, MODE_SIGN_AND_ENCRYPT)


@dataclass(frozen=True)
class Party:
    """A certificate (DER) and its key, as read back from their files."""
    der: bytes
    key: rsa.RSAPrivateKey

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_der_x509_certificate(self.der)


def make_party(folder: Path, name: str, bits: int) -> Party:
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(f"urn:test:{name}")]), critical=False)
            .sign(key, hashes.SHA256()))
    (folder / f"{name}.der").write_bytes(cert.public_bytes(serialization.Encoding.DER))
    (folder / f"{name}.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    loaded = serialization.load_pem_private_key((folder / f"{name}.pem").read_bytes(), None)
    assert isinstance(loaded, rsa.RSAPrivateKey)
    return Party((folder / f"{name}.der").read_bytes(), loaded)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pki")


@pytest.fixture(scope="module")
def client(pki: Path) -> Party:
    return make_party(pki, "client", 2048)


@pytest.fixture(scope="module")
def server(pki: Path) -> Party:
    return make_party(pki, "server", 2048)


@pytest.fixture(scope="module")
def big(pki: Path) -> Party:
    """A 4096-bit party: a server's (the ExtraPaddingSize byte in what we encrypt for it),
    and in one case ours (in what asyncua encrypts for us)."""
    return make_party(pki, "big", 4096)


class AsyncuaServer:
    """asyncua's server side of one secure channel: its ``SecureConnection``, with a
    policy factory for the mode, as its UaProcessor reads and answers chunks."""

    def __init__(self, mode: int, me: Party, send_buffer: int = 65535) -> None:
        limits = TransportLimits(max_recv_buffer=65535, max_send_buffer=send_buffer)
        self.conn = SecureConnection(SecurityPolicyNone(), limits)
        if mode != MODE_NONE:
            self.conn.set_policy_factories([SecurityPolicyFactory(
                SecurityPolicyBasic256Sha256, ua.MessageSecurityMode(mode), me.cert, me.key)])
        self._channels = 0

    def get_new_channel_id(self) -> int:      # what SecureConnection.open asks its server
        self._channels += 1
        return 40 + self._channels

    def receive(self, data: bytes) -> ua.Message | None:
        buf = Buffer(data)
        message = self.conn.receive_from_header_and_body(header_from_binary(buf), buf)
        assert len(buf) == 0, "one chunk, read whole"
        return message

    def answer_open(self, message: ua.Message) -> bytes:
        request = struct_from_binary(ua.OpenSecureChannelRequest, message.body())
        response = ua.OpenSecureChannelResponse()
        response.Parameters = self.conn.open(request.Parameters, self)
        return self.conn.message_to_binary(struct_to_binary(response),
                                           ua.MessageType.SecureOpen, message.request_id())

    def send(self, body: bytes, kind: ua.MessageType = ua.MessageType.SecureMessage,
             request_id: int = 9) -> list[bytes]:
        return split_chunks(self.conn.message_to_binary(body, kind, request_id))


def body_of(message: ua.Message) -> bytes:
    body = message.body()
    return body.read(len(body))


def split_chunks(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from("<I", data, at + 4)
        out.append(data[at:at + size])
        at += size
    return out


@dataclass
class Opened:
    security: ChannelSecurity
    server: AsyncuaServer
    channel_id: int
    token_id: int
    client_nonce: bytes
    server_nonce: bytes
    seq: int = 1

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def open_channel(mode: int, me: Party, peer: Party, send_buffer: int = 65535) -> Opened:
    """Our OPN to asyncua's server, its response back to us, and the keys derived."""
    security = (ChannelSecurity(mode) if mode == MODE_NONE
                else ChannelSecurity(mode, me.der, me.key, peer.der))
    srv = AsyncuaServer(mode, peer, send_buffer)
    nonce = security.nonce()
    request = ua.OpenSecureChannelRequest()
    request.Parameters.RequestType = ua.SecurityTokenRequestType.Issue
    request.Parameters.SecurityMode = ua.MessageSecurityMode(mode)
    request.Parameters.ClientNonce = nonce
    request.Parameters.RequestedLifetime = 600_000
    chunk = security.encode_open(0, SEQ.pack(1, 7) + struct_to_binary(request))
    assert chunk[:4] == b"OPN" + b"F"
    assert struct.unpack_from("<I", chunk, 4)[0] == len(chunk)
    message = srv.receive(chunk)
    assert isinstance(message, ua.Message)
    assert (message.SequenceHeader().SequenceNumber, message.request_id()) == (1, 7)
    assert message.SecurityHeader().SecurityPolicyURI == security.policy_uri
    if mode != MODE_NONE:
        assert srv.conn.security_policy.peer_certificate == me.der   # it took our cert
    channel_id, payload = security.decode_open(srv.answer_open(message))
    assert SEQ.unpack_from(payload) == (1, 7)
    rest = Buffer(payload[8:])
    params = struct_from_binary(ua.OpenSecureChannelResponse, rest).Parameters
    assert len(rest) == 0, "the padding is stripped to the byte"
    token = params.SecurityToken
    assert (channel_id, token.ChannelId) == (41, 41)
    server_nonce = params.ServerNonce or b""
    assert len(server_nonce) == len(nonce) == (0 if mode == MODE_NONE else 32)
    security.derive(token.TokenId, nonce, server_nonce)
    return Opened(security, srv, channel_id, token.TokenId, nonce, server_nonce)


CASES = [  # (mode, our party, the server's party)
    pytest.param(MODE_NONE, "client", "server", id="none"),
    pytest.param(MODE_SIGN, "client", "server", id="sign"),
    pytest.param(MODE_SIGN_AND_ENCRYPT, "client", "server", id="sign-and-encrypt"),
    pytest.param(MODE_SIGN, "client", "big", id="sign-4096-server"),
    pytest.param(MODE_SIGN_AND_ENCRYPT, "client", "big", id="sign-and-encrypt-4096-server"),
    pytest.param(MODE_SIGN_AND_ENCRYPT, "big", "server", id="sign-and-encrypt-4096-client"),
]


@pytest.mark.parametrize(("mode", "me", "peer"), CASES)
def test_a_channel_with_asyncuas_server(mode: int, me: str, peer: str,
                                        request: pytest.FixtureRequest) -> None:
    me_party, peer_party = request.getfixturevalue(me), request.getfixturevalue(peer)
    ch = open_channel(mode, me_party, peer_party, send_buffer=1024)
    sec, srv = ch.security, ch.server
    assert sec.policy_uri == (POLICY_NONE if mode == MODE_NONE else BASIC256SHA256)

    # one MSG chunk of ours
    body = b"a request " * 20
    chunk = sec.encode_message(b"MSG", b"F", ch.channel_id, ch.token_id,
                               SEQ.pack(ch.next_seq(), 21) + body)
    message = srv.receive(chunk)
    assert isinstance(message, ua.Message)
    assert (message.request_id(), body_of(message)) == (21, body)

    # a message of several chunks, each no larger than the server's buffer
    long = os.urandom(3000)
    room = sec.max_payload(1024) - 8
    parts = [long[i:i + room] for i in range(0, len(long), room)]
    assert len(parts) > 2
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        chunk = sec.encode_message(b"MSG", b"F" if last else b"C", ch.channel_id,
                                   ch.token_id, SEQ.pack(ch.next_seq(), 22) + part)
        assert len(chunk) <= 1024
        message = srv.receive(chunk)
        assert (message is None) != last
    assert isinstance(message, ua.Message)
    assert body_of(message) == long

    # an aborted message: asyncua drops it and waits for the next
    abort = struct_to_binary(ua.ErrorMessage(ua.StatusCode(ua.StatusCodes.BadTimeout), "x"))
    chunk = sec.encode_message(b"MSG", b"A", ch.channel_id, ch.token_id,
                               SEQ.pack(ch.next_seq(), 23) + abort)
    assert srv.receive(chunk) is None

    # asyncua's response in chunks of at most 1024 bytes, opened by us
    answer = os.urandom(2500)
    chunks = srv.send(answer)
    assert len(chunks) > 2 and all(len(c) <= 1024 for c in chunks)
    got = b""
    for i, c in enumerate(chunks):
        kind, final, cid, token, payload = sec.decode_message(c)
        assert (kind, cid, token) == (b"MSG", ch.channel_id, ch.token_id)
        assert final == (b"F" if i == len(chunks) - 1 else b"C")
        assert SEQ.unpack_from(payload)[1] == 9
        got += payload[8:]
    assert got == answer

    # CloseSecureChannel both ways
    (clo,) = srv.send(b"bye", ua.MessageType.SecureClose)
    assert sec.decode_message(clo)[:2] == (b"CLO", b"F")
    assert sec.decode_message(clo)[4][8:] == b"bye"
    chunk = sec.encode_message(b"CLO", b"F", ch.channel_id, ch.token_id,
                               SEQ.pack(ch.next_seq(), 24) + b"close")
    message = srv.receive(chunk)
    assert isinstance(message, ua.Message)
    assert body_of(message) == b"close"


@pytest.mark.parametrize("mode", [MODE_SIGN, MODE_SIGN_AND_ENCRYPT])
def test_the_keys_are_asyncuas(mode: int, client: Party, server: Party) -> None:
    ch = open_channel(mode, client, server)
    ours, theirs = ch.security._tokens[ch.token_id]
    assert ours is not None and theirs is not None
    sym = ch.server.conn.security_policy.symmetric_cryptography
    # the server verifies with our signing key and signs with its own
    assert sym.Verifier.key == ours.signing
    assert sym.Signer.key == theirs.signing
    # the spec's derivation, by asyncua's P_SHA256: client keys from (server, client)
    sizes = (32, 32, 16)
    assert uacrypto.p_sha256(ch.server_nonce, ch.client_nonce, sizes) == (
        ours.signing, ours.encrypting, ours.iv)
    assert uacrypto.p_sha256(ch.client_nonce, ch.server_nonce, sizes) == (
        theirs.signing, theirs.encrypting, theirs.iv)


def test_padding_of_over_255_bytes_with_4096_bit_keys(client: Party, big: Party) -> None:
    """A 4096-bit key's OAEP block holds 470 bytes: padding up to 469, its high byte in
    ExtraPaddingSize. Both chunks here are 2 blocks: 8 + 374 + 256 (a 2048-bit signature)
    + 2 + 300 bytes of padding."""
    body = os.urandom(374)
    mode = ua.MessageSecurityMode.SignAndEncrypt
    # asyncua's OPN for our 4096-bit key
    conn = SecureConnection(SecurityPolicyBasic256Sha256(big.cert, client.cert, client.key,
                                                         mode), TransportLimits())
    opn = conn.message_to_binary(body, ua.MessageType.SecureOpen, 1)
    ours = ChannelSecurity(MODE_SIGN_AND_ENCRYPT, big.der, big.key, client.der)
    assert ours.decode_open(opn)[1] == SEQ.pack(1, 1) + body
    # ours for a 4096-bit server, as asyncua's chunk parsing reads it
    ours = ChannelSecurity(MODE_SIGN_AND_ENCRYPT, client.der, client.key, big.der)
    chunk = ours.encode_open(0, SEQ.pack(1, 1) + body)
    assert len(chunk) == 12 + 4 + len(BASIC256SHA256) + 4 + len(client.der) + 4 + 20 + 1024
    theirs = SecurityPolicyBasic256Sha256(client.cert, big.cert, big.key, mode)
    assert MessageChunk.from_binary(theirs, Buffer(chunk)).Body == body


def test_p_sha256_is_asyncuas() -> None:
    for secret_len, seed_len, length in ((32, 32, 80), (16, 7, 1), (32, 32, 200)):
        secret, seed = os.urandom(secret_len), os.urandom(seed_len)
        assert _p_sha256(secret, seed, length) == uacrypto.p_sha256(secret, seed,
                                                                     (length,))[0]


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def assert_refused(security: ChannelSecurity, chunk: bytes, open_: bool, words: str) -> None:
    with pytest.raises(SecurityError) as e:
        if open_:
            security.decode_open(chunk)
        else:
            security.decode_message(chunk)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, SfcHostError)


@pytest.mark.parametrize("mode", [MODE_SIGN, MODE_SIGN_AND_ENCRYPT])
def test_a_flipped_byte_is_refused(mode: int, client: Party, server: Party) -> None:
    ch = open_channel(mode, client, server)
    sec, srv = ch.security, ch.server
    # asyncua's next OPN (a renewal), tampered with where each check looks
    request = ua.OpenSecureChannelRequest()
    request.Parameters.RequestType = ua.SecurityTokenRequestType.Renew
    request.Parameters.SecurityMode = ua.MessageSecurityMode(mode)
    request.Parameters.ClientNonce = sec.nonce()
    message = srv.receive(sec.encode_open(ch.channel_id, SEQ.pack(ch.next_seq(), 30)
                                          + struct_to_binary(request)))
    assert isinstance(message, ua.Message)
    opn = srv.answer_open(message)
    assert sec.decode_open(opn)[0] == ch.channel_id            # untouched, it opens
    cert_at = 12 + 4 + len(BASIC256SHA256) + 4
    thumb_at = cert_at + len(server.der) + 4
    body_at = thumb_at + 20
    assert_refused(sec, flipped(opn, 5), True, "says it has")                # MessageSize
    assert_refused(sec, flipped(opn, 9), True, "signature")                  # channel id
    assert_refused(sec, flipped(opn, 20), True, "policy")                    # policy URI
    assert_refused(sec, flipped(opn, cert_at + 200), True, "sender certificate")
    assert_refused(sec, flipped(opn, thumb_at + 3), True, "another certificate")
    for at in (body_at, body_at + 300, len(opn) - 1):
        assert_refused(sec, flipped(opn, at), True, "does not decrypt")
    assert_refused(sec, opn[:-1], True, "says it has")                       # cut short

    (msg,) = srv.send(b"a response")
    assert sec.decode_message(msg)[4][8:] == b"a response"
    assert_refused(sec, flipped(msg, 9), False, "signature")                 # channel id
    assert_refused(sec, flipped(msg, 12), False, "unknown token id")
    for at in (16, 20, len(msg) - 1):
        assert_refused(sec, flipped(msg, at), False, "signature")
    assert_refused(sec, flipped(msg, 2), False, "where MSG or CLO")


def test_signed_padding_that_is_bad_is_refused(client: Party, server: Party) -> None:
    """A server that signs wrong padding (the signature holds): refused all the same."""
    ch = open_channel(MODE_SIGN_AND_ENCRYPT, client, server)
    sym = ch.server.conn.security_policy.symmetric_cryptography
    real = sym.padding
    # 8 + 6 + 32 bytes want 18 of padding (asyncua pads to 32): its first byte wrong
    sym.padding = lambda size: bytes([real(size)[0] ^ 1]) + real(size)[1:]
    try:
        (msg,) = ch.server.send(b"padded")
    finally:
        sym.padding = real
    assert_refused(ch.security, msg, False, "padding")


def test_tokens_are_kept_until_forgotten(client: Party, server: Party) -> None:
    ch = open_channel(MODE_SIGN_AND_ENCRYPT, client, server)
    sec = ch.security
    (old,) = ch.server.send(b"on the first token")
    # a renewal: the new token's keys beside the old, until the old is forgotten
    sec.derive(ch.token_id + 1, os.urandom(32), os.urandom(32))
    assert sec.decode_message(old)[3] == ch.token_id
    chunk = sec.encode_message(b"MSG", b"F", ch.channel_id, ch.token_id + 1, b"12345678")
    assert struct.unpack_from("<I", chunk, 12)[0] == ch.token_id + 1
    sec.forget(ch.token_id)
    assert_refused(sec, old, False, f"unknown token id {ch.token_id}")
    with pytest.raises(SecurityError, match="unknown token id"):
        sec.encode_message(b"MSG", b"F", ch.channel_id, ch.token_id, b"12345678")
    with pytest.raises(SecurityError, match="nonce has 5 bytes"):
        sec.derive(99, os.urandom(32), b"short")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("asymmetric", [False, True])
def test_max_payload_fills_a_chunk(mode: int, asymmetric: bool, client: Party,
                                   server: Party, big: Party) -> None:
    for peer in (server, big) if asymmetric and mode != MODE_NONE else (server,):
        sec = (ChannelSecurity(mode) if mode == MODE_NONE
               else ChannelSecurity(mode, client.der, client.key, peer.der))
        sec.derive(5, sec.nonce(), sec.nonce())
        for size in (2048 if asymmetric else 1024, 8192, 65535):   # an OPN holds a cert
            n = sec.max_payload(size, asymmetric)
            assert n > 0

            def encode(k: int, sec: ChannelSecurity = sec) -> bytes:
                payload = os.urandom(k)
                if asymmetric:
                    return sec.encode_open(3, payload)
                return sec.encode_message(b"MSG", b"C", 3, 5, payload)
            assert len(encode(n)) <= size < len(encode(n + 1))
    assert ChannelSecurity(MODE_NONE).max_payload(10) == 0
    assert ChannelSecurity(MODE_SIGN, client.der, client.key, server.der).max_payload(
        1024, asymmetric=True) == 0                         # no room for one RSA block


def test_encrypt_secret(server: Party, big: Party) -> None:
    nonce = os.urandom(32)
    data, uri = encrypt_secret(BASIC256SHA256, server.der, b"plc-secret-2", nonce)
    assert uri == RSA_OAEP == SecurityPolicyBasic256Sha256.AsymmetricEncryptionURI
    assert len(data) == 256
    plain = uacrypto.decrypt_rsa_oaep(server.key, data)
    assert plain == struct.pack("<I", 12 + 32) + b"plc-secret-2" + nonce
    # as asyncua's server reads a password (InternalServer.decrypt_user_token)
    length = struct.unpack_from("<I", plain)[0] - len(nonce)
    assert plain[4:4 + length].decode() == "plc-secret-2"
    # longer than one OAEP block (key bytes - 42): several blocks
    secret = os.urandom(600)
    data, _ = encrypt_secret(BASIC256SHA256, big.der, secret, nonce)
    assert len(data) == 512 * 2
    plain = b"".join(uacrypto.decrypt_rsa_oaep(big.key, data[i:i + 512])
                     for i in range(0, len(data), 512))
    assert plain == struct.pack("<I", 632) + secret + nonce
    assert encrypt_secret(POLICY_NONE, b"", b"pw", nonce) == (b"pw", "")
    with pytest.raises(SecurityError, match="not supported"):
        encrypt_secret("http://opcfoundation.org/UA/SecurityPolicy#Basic128Rsa15",
                       server.der, b"pw", nonce)


def test_client_signature(client: Party, server: Party) -> None:
    sec = ChannelSecurity(MODE_SIGN, client.der, client.key, server.der)
    nonce = os.urandom(32)
    uri, signature = sec.client_signature(server.der, nonce)
    assert uri == RSA_SHA256 == SecurityPolicyBasic256Sha256.AsymmetricSignatureURI
    uacrypto.verify_sha256(client.cert, server.der + nonce, signature)    # raises if wrong
    with pytest.raises(InvalidSignature):
        uacrypto.verify_sha256(client.cert, server.der + os.urandom(32), signature)
    assert ChannelSecurity(MODE_NONE).client_signature(server.der, nonce) == ("", b"")
    assert thumbprint(server.der) == uacrypto.x509_from_der(server.der).fingerprint(
        hashes.SHA1())


def test_bad_certificates_and_keys(pki: Path, client: Party, server: Party,
                                   big: Party) -> None:
    def refused(words: str, *args: object) -> None:
        with pytest.raises(SecurityError, match=words) as e:
            ChannelSecurity(*args)  # type: ignore[arg-type]
        assert "\n" not in str(e.value)
    refused("no DER X.509", MODE_SIGN, client.der, client.key, b"\x30\x03abc")
    refused("no DER X.509", MODE_SIGN, client.der, client.key, b"junk")
    refused("not the key of our certificate", MODE_SIGN, client.der, server.key, server.der)
    refused("needs our certificate", MODE_SIGN_AND_ENCRYPT, client.der, client.key)
    refused("security mode 4", 4)
    small = make_party(pki, "small", 1024)
    refused("1024 bits", MODE_SIGN, client.der, client.key, small.der)

    # an OPN from another server than the one we trust: its certificate, not the right one
    impostor = SecurityPolicyBasic256Sha256(client.cert, big.cert, big.key,
                                            ua.MessageSecurityMode.SignAndEncrypt)
    conn = SecureConnection(impostor, TransportLimits())
    opn = conn.message_to_binary(b"\x00" * 40, ua.MessageType.SecureOpen, 1)
    sec = ChannelSecurity(MODE_SIGN_AND_ENCRYPT, client.der, client.key, server.der)
    assert_refused(sec, opn, True, "sender certificate is not the server's")
    # the one we trust (sent with a chain after it) is taken
    trusted = SecurityPolicyBasic256Sha256(client.cert, server.cert, server.key,
                                           ua.MessageSecurityMode.SignAndEncrypt,
                                           host_cert_chain=[big.cert])
    conn = SecureConnection(trusted, TransportLimits())
    opn = conn.message_to_binary(b"\x00" * 40, ua.MessageType.SecureOpen, 1)
    assert sec.decode_open(opn)[1][8:] == b"\x00" * 40
    # a None OPN where Basic256Sha256 was due
    plain = SecureConnection(SecurityPolicyNone(), TransportLimits())
    opn = plain.message_to_binary(b"\x00" * 8, ua.MessageType.SecureOpen, 1)
    assert_refused(sec, opn, True, "policy")
    assert ChannelSecurity(MODE_NONE).decode_open(opn)[1][8:] == b"\x00" * 8
