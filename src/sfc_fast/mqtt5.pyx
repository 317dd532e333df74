# cython: language_level=3
"""MQTT 5 and 3.1.1 client packets, sans I/O: a ``Reader`` frames what the broker sends
from a byte stream, and the ``*_into`` / ``encode_*`` functions build what a client sends.

The host's MQTT connection (``sfc_host.mqtt``) runs on this. It is compiled because it
runs for every message: one ``Reader.feed`` frames every packet of a socket read, a
PUBLISH becomes the handler's ``Message`` (with its ``Properties``) and nothing else,
and the acknowledgements of one read go out as one write.

A packet that breaks the protocol's rules (a bad length, invalid UTF-8 or U+0000 in a
string, a property twice that may appear once, a reserved flag set, a packet a server
never sends) raises ``MalformedPacket``; the spec then wants the connection closed,
with its reason code (``reason``) in a DISCONNECT on MQTT 5.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memchr, memcpy

from sfc_fast._text cimport utf8_view

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15
OVERSIZED = 16          # not a packet type: a PUBLISH passed over (Reader)

MAX_REMAINING = 268_435_455          # the largest remaining length a varint can say
MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
PACKET_TOO_LARGE = 0x95
TOPIC_NAME_INVALID = 0x90


class MalformedPacket(ValueError):
    """A packet that breaks MQTT's rules; ``reason`` is the MQTT 5 reason code the
    connection is closed with (0x81 malformed, 0x82 protocol error, 0x95 too large)."""

    def __init__(self, message, reason=MALFORMED):
        super().__init__(message)
        self.reason = reason


# property kinds
cdef enum:
    K_BYTE = 1
    K_U16 = 2
    K_U32 = 3
    K_VARINT = 4
    K_STR = 5
    K_BIN = 6
    K_PAIR = 7

# MQTT 5 property identifier -> (name, kind); names as the spec (and paho) spell them
_PROPS = {
    0x01: ("PayloadFormatIndicator", K_BYTE), 0x02: ("MessageExpiryInterval", K_U32),
    0x03: ("ContentType", K_STR), 0x08: ("ResponseTopic", K_STR),
    0x09: ("CorrelationData", K_BIN), 0x0B: ("SubscriptionIdentifier", K_VARINT),
    0x11: ("SessionExpiryInterval", K_U32), 0x12: ("AssignedClientIdentifier", K_STR),
    0x13: ("ServerKeepAlive", K_U16), 0x15: ("AuthenticationMethod", K_STR),
    0x16: ("AuthenticationData", K_BIN), 0x17: ("RequestProblemInformation", K_BYTE),
    0x18: ("WillDelayInterval", K_U32), 0x19: ("RequestResponseInformation", K_BYTE),
    0x1A: ("ResponseInformation", K_STR), 0x1C: ("ServerReference", K_STR),
    0x1F: ("ReasonString", K_STR), 0x21: ("ReceiveMaximum", K_U16),
    0x22: ("TopicAliasMaximum", K_U16), 0x23: ("TopicAlias", K_U16),
    0x24: ("MaximumQoS", K_BYTE), 0x25: ("RetainAvailable", K_BYTE),
    0x26: ("UserProperty", K_PAIR), 0x27: ("MaximumPacketSize", K_U32),
    0x28: ("WildcardSubscriptionAvailable", K_BYTE),
    0x29: ("SubscriptionIdentifierAvailable", K_BYTE),
    0x2A: ("SharedSubscriptionAvailable", K_BYTE),
}
# which properties each packet a server sends may carry (MQTT 5, 2.2.2.2)
_ALLOWED = {
    CONNACK: frozenset((0x11, 0x21, 0x24, 0x25, 0x27, 0x12, 0x22, 0x1F, 0x26, 0x28, 0x29,
                        0x2A, 0x13, 0x1A, 0x1C, 0x15, 0x16)),
    PUBACK: frozenset((0x1F, 0x26)), SUBACK: frozenset((0x1F, 0x26)),
    UNSUBACK: frozenset((0x1F, 0x26)),
    DISCONNECT: frozenset((0x11, 0x1F, 0x26, 0x1C)),
}


cdef class Properties:
    """MQTT 5 PUBLISH properties, named as the spec names them; None when absent.
    ``SubscriptionIdentifier`` (received only) is a list; ``UserProperty`` a list of
    (name, value) pairs. ``freeze()`` packs them once for properties sent unchanged
    with many messages (then they must not change)."""

    cdef public object PayloadFormatIndicator
    cdef public object MessageExpiryInterval
    cdef public object ContentType
    cdef public object ResponseTopic
    cdef public object CorrelationData
    cdef public object SubscriptionIdentifier
    cdef public object UserProperty
    cdef bytes _packed

    def __init__(self, *, PayloadFormatIndicator=None, MessageExpiryInterval=None,
                 ContentType=None, ResponseTopic=None, CorrelationData=None,
                 UserProperty=None):
        self.PayloadFormatIndicator = PayloadFormatIndicator
        self.MessageExpiryInterval = MessageExpiryInterval
        self.ContentType = ContentType
        self.ResponseTopic = ResponseTopic
        self.CorrelationData = CorrelationData
        self.UserProperty = UserProperty

    def pack(self):
        """The properties as they go on the wire: their length, then each property."""
        if self._packed is not None:
            return self._packed
        cdef Py_ssize_t body = _props_front(self)
        cdef object cd = _correlation(self)
        cdef object ups = _user_props(self)
        body = _props_checked(body + _props_back(cd, ups))
        cdef bytes out = PyBytes_FromStringAndSize(NULL, _varint_len(body) + body)
        _put_props(_put_varint(PyBytes_AS_STRING(out), body), self, cd, ups)
        return out

    def freeze(self):
        self._packed = self.pack()
        return self

    def __repr__(self):
        shown = [f"{n}={getattr(self, n)!r}" for n in (
            "PayloadFormatIndicator", "MessageExpiryInterval", "ContentType",
            "ResponseTopic", "CorrelationData", "SubscriptionIdentifier", "UserProperty")
            if getattr(self, n) is not None]
        return f"Properties({', '.join(shown)})"

    def __eq__(self, other):
        if not isinstance(other, Properties):
            return NotImplemented
        cdef Properties o = other
        return (self.PayloadFormatIndicator == o.PayloadFormatIndicator
                and self.MessageExpiryInterval == o.MessageExpiryInterval
                and self.ContentType == o.ContentType and self.ResponseTopic == o.ResponseTopic
                and self.CorrelationData == o.CorrelationData
                and self.SubscriptionIdentifier == o.SubscriptionIdentifier
                and self.UserProperty == o.UserProperty)

    __hash__ = None


cdef class Message:
    """A message the broker delivered: what a handler gets. ``properties`` is None on
    MQTT 3.1.1 and when a message carries none."""

    cdef public str topic
    cdef public bytes payload
    cdef public int qos
    cdef public bint retain
    cdef public bint dup
    cdef public int mid
    cdef public object properties

    def __init__(self, str topic, bytes payload=b"", int qos=0, bint retain=False,
                 object properties=None, bint dup=False, int mid=0):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.dup = dup
        self.mid = mid

    def __repr__(self):
        return (f"Message(topic={self.topic!r}, payload={self.payload[:60]!r}, "
                f"qos={self.qos}, retain={self.retain})")


# ---------------------------------------------------------------------------------
# Reading


cdef inline unsigned int _u16(const unsigned char* p) noexcept:
    return (<unsigned int>p[0] << 8) | p[1]


cdef inline unsigned long _u32(const unsigned char* p) noexcept:
    return ((<unsigned long>p[0] << 24) | (<unsigned long>p[1] << 16)
            | (<unsigned long>p[2] << 8) | p[3])


cdef Py_ssize_t _varint(const unsigned char* p, Py_ssize_t n, unsigned long* value) except -2:
    """Bytes used by the variable byte integer at ``p`` (``n`` available), -1 when
    more bytes are needed; more than four bytes is malformed."""
    cdef unsigned long v = 0
    cdef Py_ssize_t i = 0
    cdef int shift = 0
    while True:
        if i >= n:
            return -1
        if i == 4:
            raise MalformedPacket("variable byte integer longer than four bytes")
        v |= (<unsigned long>(p[i] & 0x7F)) << shift
        shift += 7
        i += 1
        if not (p[i - 1] & 0x80):
            break
    value[0] = v
    return i


cdef str _utf8(const unsigned char* p, Py_ssize_t n, str what):
    # MQTT strings: valid UTF-8 (no surrogates: Python's strict decoder refuses them)
    # and no U+0000 (MQTT-1.5.4-1, -2)
    if n and memchr(p, 0, n) != NULL:
        raise MalformedPacket(f"{what} has a U+0000 character")
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        raise MalformedPacket(f"{what} is not valid UTF-8") from None


cdef class _Cursor:
    # a bounded view of one packet's bytes
    cdef const unsigned char* p
    cdef Py_ssize_t i, end

    cdef inline void need(self, Py_ssize_t k, str what) except *:
        if self.i + k > self.end:
            raise MalformedPacket(f"{what}: packet too short")

    cdef unsigned int byte(self, str what) except? 0xFFFF:
        self.need(1, what)
        self.i += 1
        return self.p[self.i - 1]

    cdef unsigned int u16(self, str what) except? 0xFFFFF:
        self.need(2, what)
        self.i += 2
        return _u16(self.p + self.i - 2)

    cdef unsigned long u32(self, str what) except? 0xFFFFFFFFF:
        self.need(4, what)
        self.i += 4
        return _u32(self.p + self.i - 4)

    cdef unsigned long varint(self, str what) except? 0xFFFFFFFFF:
        cdef unsigned long v
        cdef Py_ssize_t used = _varint(self.p + self.i, self.end - self.i, &v)
        if used < 0:
            raise MalformedPacket(f"{what}: packet too short")
        self.i += used
        return v

    cdef str string(self, str what):
        cdef unsigned int n = self.u16(what)
        self.need(n, what)
        self.i += n
        return _utf8(self.p + self.i - n, n, what)

    cdef bytes binary(self, str what):
        cdef unsigned int n = self.u16(what)
        self.need(n, what)
        self.i += n
        return PyBytes_FromStringAndSize(<const char*>self.p + self.i - n, n)


cdef object _read_props(_Cursor c, int ptype):
    """The properties of a packet other than PUBLISH: a dict by name (UserProperty a
    list of pairs), each checked against what that packet may carry."""
    cdef unsigned long n = c.varint("property length")
    c.need(n, "properties")
    cdef Py_ssize_t end = c.i + n, saved = c.end
    cdef unsigned long ident
    cdef int kind
    allowed = _ALLOWED.get(ptype, frozenset())
    out = {}
    c.end = end
    try:
        while c.i < end:
            ident = c.varint("property identifier")
            if ident not in allowed:
                raise MalformedPacket(f"property 0x{ident:02X} is not allowed in this packet",
                                      PROTOCOL_ERROR)
            name, kind = _PROPS[ident]
            value = _read_value(c, kind, name)
            if kind == K_PAIR:
                out.setdefault(name, []).append(value)
            elif name in out:
                raise MalformedPacket(f"property {name} given twice", PROTOCOL_ERROR)
            else:
                out[name] = value
    finally:
        c.end = saved
    return out


cdef object _read_value(_Cursor c, int kind, str name):
    if kind == K_BYTE:
        return c.byte(name)
    if kind == K_U16:
        return c.u16(name)
    if kind == K_U32:
        return c.u32(name)
    if kind == K_VARINT:
        return c.varint(name)
    if kind == K_STR:
        return c.string(name)
    if kind == K_BIN:
        return c.binary(name)
    return (c.string(name), c.string(name))


cdef Properties _publish_props(_Cursor c):
    # the PUBLISH properties straight into the handler's object (the hot path)
    cdef unsigned long n = c.varint("property length")
    c.need(n, "properties")
    if n == 0:
        return None
    cdef Py_ssize_t end = c.i + n, saved = c.end
    cdef unsigned long ident, sid
    cdef Properties p = Properties.__new__(Properties)
    cdef list user = None
    c.end = end
    try:
        while c.i < end:
            ident = c.varint("property identifier")
            if ident == 0x26:
                if user is None:
                    user = []
                user.append((c.string("user property"), c.string("user property")))
            elif ident == 0x03:
                if p.ContentType is not None:
                    raise MalformedPacket("ContentType given twice", PROTOCOL_ERROR)
                p.ContentType = c.string("ContentType")
            elif ident == 0x08:
                if p.ResponseTopic is not None:
                    raise MalformedPacket("ResponseTopic given twice", PROTOCOL_ERROR)
                p.ResponseTopic = c.string("ResponseTopic")
                if "+" in p.ResponseTopic or "#" in p.ResponseTopic or not p.ResponseTopic:
                    raise MalformedPacket("ResponseTopic is no topic name", PROTOCOL_ERROR)
            elif ident == 0x09:
                if p.CorrelationData is not None:
                    raise MalformedPacket("CorrelationData given twice", PROTOCOL_ERROR)
                p.CorrelationData = c.binary("CorrelationData")
            elif ident == 0x02:
                if p.MessageExpiryInterval is not None:
                    raise MalformedPacket("MessageExpiryInterval given twice", PROTOCOL_ERROR)
                p.MessageExpiryInterval = c.u32("MessageExpiryInterval")
            elif ident == 0x01:
                if p.PayloadFormatIndicator is not None:
                    raise MalformedPacket("PayloadFormatIndicator given twice", PROTOCOL_ERROR)
                p.PayloadFormatIndicator = c.byte("PayloadFormatIndicator")
                if p.PayloadFormatIndicator > 1:
                    raise MalformedPacket("PayloadFormatIndicator is neither 0 nor 1",
                                          PROTOCOL_ERROR)
            elif ident == 0x0B:
                sid = c.varint("SubscriptionIdentifier")
                if sid == 0:
                    raise MalformedPacket("SubscriptionIdentifier 0", PROTOCOL_ERROR)
                if p.SubscriptionIdentifier is None:
                    p.SubscriptionIdentifier = []
                p.SubscriptionIdentifier.append(sid)
            elif ident == 0x23:
                # we announce no Topic Alias Maximum, so the server may send no alias
                raise MalformedPacket("a topic alias, none was allowed", PROTOCOL_ERROR)
            else:
                raise MalformedPacket(f"property 0x{ident:02X} is not allowed in PUBLISH",
                                      PROTOCOL_ERROR)
    finally:
        c.end = saved
    p.UserProperty = user
    return p


cdef class Reader:
    """Frames the packets a broker sends. ``feed(data)`` returns what the bytes so far
    complete, in order: a ``Message`` per PUBLISH, a tuple per other packet —
    ``(CONNACK, session_present, reason, props)``, ``(PUBACK|PUBREC|PUBCOMP, mid,
    reason)``, ``(PUBREL, mid, reason)``, ``(SUBACK|UNSUBACK, mid, [reasons])``,
    ``(PINGRESP,)``, ``(DISCONNECT, reason, props)``. A partial packet waits for the
    next ``feed``. A PUBLISH larger than ``max_packet`` is passed over, not kept:
    ``(OVERSIZED, topic, qos, mid, size)``; any other packet that large raises
    ``MalformedPacket`` (0x95). After a ``MalformedPacket`` the reader is spent (the
    connection is closed)."""

    cdef public bint v5
    cdef public Py_ssize_t max_packet
    cdef bytes _rest          # the start of a packet whose length is not known yet
    cdef list _parts          # the start of a packet of length _need, _have bytes so far
    cdef Py_ssize_t _need, _have
    cdef Py_ssize_t _skip     # bytes of an oversized packet still to pass over

    def __init__(self, bint v5=True, Py_ssize_t max_packet=MAX_REMAINING + 5):
        self.v5 = v5
        self.max_packet = max_packet
        self._rest = b""
        self._parts = []

    @property
    def buffered(self):
        """Bytes of an incomplete packet held for the next ``feed``."""
        return len(self._rest) + self._have

    def feed(self, data):
        cdef bytes buf
        cdef Py_ssize_t size = len(data)
        if self._need:
            # the rest of a packet whose length is known: gathered, joined once
            self._parts.append(bytes(data))
            self._have += size
            if self._have < self._need:
                return []
            buf = b"".join(self._parts)
            self._parts = []
            self._need = self._have = 0
        elif self._rest:
            buf = self._rest + bytes(data)
        else:
            buf = data if type(data) is bytes else bytes(data)
        self._rest = b""
        cdef const unsigned char* p = buf
        cdef Py_ssize_t n = len(buf), i = 0, used, total, skip
        cdef unsigned long remaining
        cdef list out = []
        cdef _Cursor c = _Cursor.__new__(_Cursor)
        c.p = p
        if self._skip:
            skip = min(self._skip, n)
            self._skip -= skip
            i = skip
        while n - i >= 2:
            used = _varint(p + i + 1, n - i - 1, &remaining)
            if used < 0:
                break
            total = 1 + used + <Py_ssize_t>remaining
            if total > self.max_packet:
                c.i = i + 1 + used
                c.end = n if n - i < total else i + total
                item = self._oversized(c, p[i], total)
                if item is None:
                    break             # its topic and packet id are not all here yet
                out.append(item)
                if n - i < total:
                    self._skip = total - (n - i)
                    i = n
                else:
                    i += total
                continue
            if n - i < total:
                self._need = total
                break
            c.i = i + 1 + used
            c.end = i + total
            out.append(self._packet(c, p[i]))
            i = c.end
        if i < n:
            self._rest = buf[i:]
            if self._need:
                self._parts = [self._rest]
                self._have = n - i
                self._rest = b""
        return out

    cdef object _oversized(self, _Cursor c, unsigned int first, Py_ssize_t total):
        """A PUBLISH larger than ``max_packet``: its topic, QoS and packet id (so it is
        acknowledged and counted, not parsed), or None until those bytes are here;
        any other packet that large is refused."""
        cdef unsigned int qos = (first >> 1) & 3, mid = 0
        cdef Py_ssize_t tlen
        if first >> 4 != PUBLISH or qos == 3:
            raise MalformedPacket(f"a packet of {total} bytes, more than the "
                                  f"{self.max_packet} allowed", PACKET_TOO_LARGE)
        if c.end - c.i < 2:
            return None
        tlen = _u16(c.p + c.i)
        if c.end - c.i < 2 + tlen + (2 if qos else 0):
            return None
        topic = _utf8(c.p + c.i + 2, tlen, "topic")
        if qos:
            mid = _u16(c.p + c.i + 2 + tlen)
        return (OVERSIZED, topic, qos, mid, total)

    cdef object _packet(self, _Cursor c, unsigned int first):
        cdef unsigned int ptype = first >> 4, flags = first & 0x0F, qos, mid = 0
        cdef Py_ssize_t tlen
        cdef str topic
        cdef Message m
        if ptype == PUBLISH:
            qos = (flags >> 1) & 3
            if qos == 3:
                raise MalformedPacket("PUBLISH with QoS 3")
            if qos == 0 and flags & 8:
                raise MalformedPacket("PUBLISH with QoS 0 and DUP set")
            tlen = c.u16("topic")
            c.need(tlen, "topic")
            topic = _utf8(c.p + c.i, tlen, "topic")
            c.i += tlen
            if not topic or "+" in topic or "#" in topic:
                raise MalformedPacket(f"PUBLISH to {topic[:80]!r}, no topic name",
                                      TOPIC_NAME_INVALID)
            if qos:
                mid = c.u16("packet identifier")
                if mid == 0:
                    raise MalformedPacket("PUBLISH with packet identifier 0")
            m = Message.__new__(Message)
            m.topic = topic
            m.qos = qos
            m.retain = flags & 1
            m.dup = (flags >> 3) & 1
            m.mid = mid
            if self.v5:
                m.properties = _publish_props(c)
            m.payload = PyBytes_FromStringAndSize(<const char*>c.p + c.i, c.end - c.i)
            return m
        if ptype == PUBACK or ptype == PUBREC or ptype == PUBCOMP or ptype == PUBREL:
            if flags != (2 if ptype == PUBREL else 0):
                raise MalformedPacket(f"packet type {ptype} with reserved flags {flags}")
            mid = c.u16("packet identifier")
            reason = 0
            if self.v5 and c.end > c.i:
                reason = c.byte("reason code")
                if c.end > c.i:
                    _read_props(c, PUBACK)
            elif c.end != c.i:
                raise MalformedPacket("acknowledgement longer than its packet identifier")
            return (ptype, mid, reason)
        if flags:
            raise MalformedPacket(f"packet type {ptype} with reserved flags {flags}")
        if ptype == CONNACK:
            ack = c.byte("CONNACK flags")
            if ack & 0xFE:
                raise MalformedPacket("CONNACK with reserved flags")
            reason = c.byte("CONNACK reason code")
            props = _read_props(c, CONNACK) if self.v5 and c.end > c.i else {}
            self._done(c)
            return (CONNACK, bool(ack & 1), reason, props)
        if ptype == SUBACK or ptype == UNSUBACK:
            mid = c.u16("packet identifier")
            if self.v5:
                _read_props(c, ptype)
            codes = [c.p[k] for k in range(c.i, c.end)]
            c.i = c.end
            if ptype == SUBACK and not codes:
                raise MalformedPacket("SUBACK without reason codes", PROTOCOL_ERROR)
            return (ptype, mid, codes)
        if ptype == PINGRESP:
            self._done(c)
            return (PINGRESP,)
        if ptype == DISCONNECT and self.v5:
            reason = c.byte("reason code") if c.end > c.i else 0
            props = _read_props(c, DISCONNECT) if c.end > c.i else {}
            self._done(c)
            return (DISCONNECT, reason, props)
        if ptype == AUTH and self.v5:
            raise MalformedPacket("AUTH: no enhanced authentication was asked for",
                                  PROTOCOL_ERROR)
        raise MalformedPacket(f"packet type {ptype} is not sent by a server", PROTOCOL_ERROR)

    cdef void _done(self, _Cursor c) except *:
        if c.i != c.end:
            raise MalformedPacket("bytes after the end of a packet")


# ---------------------------------------------------------------------------------
# Writing


cdef inline void _add_u16(bytearray out, unsigned int v):
    out.append((v >> 8) & 0xFF)
    out.append(v & 0xFF)


cdef void _add_varint(bytearray out, unsigned long n) except *:
    if n > MAX_REMAINING:
        raise ValueError(f"{n} is more than a variable byte integer holds")
    cdef char buf[4]
    out += buf[:_put_varint(buf, n) - buf]


cdef bytes _text_bytes(object s, str what):
    cdef Py_ssize_t n
    cdef const char* t = _text_view(s, &n, what)
    return PyBytes_FromStringAndSize(t, n)


cdef inline void _add_str(bytearray out, object s, str what) except *:
    cdef bytes b = _text_bytes(s, what)
    _add_u16(out, len(b))
    out += b


cdef void _add_bin(bytearray out, object b, str what) except *:
    cdef bytes v = bytes(b)
    if len(v) > 0xFFFF:
        raise ValueError(f"{what} is longer than 65,535 bytes")
    _add_u16(out, len(v))
    out += v


# A PUBLISH is measured first (every check made there), then written straight into
# the caller's buffer: no bytes object per string and no growing of a buffer per field,
# since every command, answer and status event goes through here.

cdef inline Py_ssize_t _varint_len(Py_ssize_t n) noexcept:
    if n < 0x80:
        return 1
    if n < 0x4000:
        return 2
    if n < 0x200000:
        return 3
    return 4


cdef inline char* _put_varint(char* w, Py_ssize_t n) noexcept:
    while n > 0x7F:
        w[0] = <char>((n & 0x7F) | 0x80)
        w += 1
        n >>= 7
    w[0] = <char>n
    return w + 1


cdef inline char* _put_u16(char* w, Py_ssize_t v) noexcept:
    w[0] = <char>((v >> 8) & 0xFF)
    w[1] = <char>(v & 0xFF)
    return w + 2


cdef const char* _text_view(object s, Py_ssize_t* n, str what) except NULL:
    """The UTF-8 of a string field (borrowed), checked as the wire needs it."""
    if type(s) is not str:
        raise TypeError(f"{what} must be a str, not {type(s).__name__}")
    cdef const char* t = utf8_view(<str>s, n)     # refuses lone surrogates
    if n[0] > 0xFFFF:
        raise ValueError(f"{what} is longer than 65,535 bytes")
    if n[0] and memchr(t, 0, n[0]) != NULL:
        raise ValueError(f"{what} has a U+0000 character")
    return t


cdef inline char* _put_text(char* w, object s) except NULL:
    cdef Py_ssize_t n
    cdef const char* t = utf8_view(<str>s, &n)    # checked by _text_view: cached now
    w = _put_u16(w, n)
    memcpy(w, t, n)
    return w + n


cdef object _correlation(Properties p):
    cdef object cd = p.CorrelationData
    if cd is None or type(cd) is bytes:
        return cd
    return bytes(cd)


cdef object _user_props(Properties p):
    cdef object ups = p.UserProperty
    if not ups:
        return None
    if type(ups) is list or type(ups) is tuple:
        return ups
    return list(ups)          # read twice: measured, then written


cdef Py_ssize_t _props_front(Properties p) except -1:
    """Bytes of the properties before CorrelationData, checked (a client sends no
    SubscriptionIdentifier). With _props_back: the fields in wire order, so the first
    field the wire cannot carry is the one reported."""
    cdef Py_ssize_t size = 0, n
    cdef unsigned long expiry
    if p.PayloadFormatIndicator is not None:
        size += 2
    if p.MessageExpiryInterval is not None:
        if not 0 <= p.MessageExpiryInterval <= 0xFFFFFFFF:
            raise ValueError(f"MessageExpiryInterval {p.MessageExpiryInterval} is out of range")
        expiry = p.MessageExpiryInterval
        size += 5
    if p.ContentType is not None:
        _text_view(p.ContentType, &n, "ContentType")
        size += 3 + n
    if p.ResponseTopic is not None:
        _text_view(p.ResponseTopic, &n, "ResponseTopic")
        size += 3 + n
    return size


cdef Py_ssize_t _props_back(object cd, object ups) except -1:
    """Bytes of CorrelationData (as _correlation made it) and the user properties."""
    cdef Py_ssize_t size = 0, n
    if cd is not None:
        n = PyBytes_GET_SIZE(cd)
        if n > 0xFFFF:
            raise ValueError("CorrelationData is longer than 65,535 bytes")
        size += 3 + n
    if ups is not None:
        for name, value in ups:
            _text_view(name, &n, "user property name")
            size += 5 + n
            _text_view(value, &n, "user property value")
            size += n
    return size


cdef inline Py_ssize_t _props_checked(Py_ssize_t size) except -1:
    if size > MAX_REMAINING:
        raise ValueError(f"{size} is more than a variable byte integer holds")
    return size


cdef char* _put_props(char* w, Properties p, object cd, object ups) except NULL:
    """Write the body _props_front and _props_back measured (and checked)."""
    cdef unsigned long expiry
    cdef Py_ssize_t n
    if p.PayloadFormatIndicator is not None:
        w[0] = 0x01
        w[1] = 1 if p.PayloadFormatIndicator else 0
        w += 2
    if p.MessageExpiryInterval is not None:
        expiry = p.MessageExpiryInterval
        w[0] = 0x02
        w = _put_u16(_put_u16(w + 1, expiry >> 16), expiry & 0xFFFF)
    if p.ContentType is not None:
        w[0] = 0x03
        w = _put_text(w + 1, p.ContentType)
    if p.ResponseTopic is not None:
        w[0] = 0x08
        w = _put_text(w + 1, p.ResponseTopic)
    if cd is not None:
        n = PyBytes_GET_SIZE(cd)
        w[0] = 0x09
        w = _put_u16(w + 1, n)
        memcpy(w, PyBytes_AS_STRING(cd), n)
        w += n
    if ups is not None:
        for name, value in ups:
            w[0] = 0x26
            w = _put_text(_put_text(w + 1, name), value)
    return w


def publish_into(bytearray out, topic, payload, int qos=0, bint retain=False, int mid=0,
                 properties=None, bint v5=True, bint dup=False):
    """Append a PUBLISH packet to ``out``. ``properties``: a ``Properties`` (MQTT 5
    only; ignored on 3.1.1). Raises ValueError (or TypeError) for what cannot be sent,
    leaving ``out`` as it was."""
    cdef Py_ssize_t tn, pn, body = 0, section = 0, total, start, size
    cdef const char* t = _text_view(topic, &tn, "topic")
    if tn == 0 or memchr(t, 0x2B, tn) != NULL or memchr(t, 0x23, tn) != NULL:
        raise ValueError(f"{topic[:200]!r} is no topic to publish to")
    cdef const unsigned char[:] view
    cdef const char* data
    if type(payload) is bytes:
        data = PyBytes_AS_STRING(payload)
        pn = PyBytes_GET_SIZE(payload)
    else:
        view = payload
        pn = view.shape[0]
        data = <const char*>&view[0] if pn else NULL
    if qos < 0 or qos > 2:
        raise ValueError(f"QoS {qos}")
    if qos and not 0 < mid <= 0xFFFF:
        raise ValueError(f"packet identifier {mid}")
    cdef Properties pr = None
    cdef bytes packed = None
    cdef object cd = None, ups = None
    if v5:
        if properties is None:
            section = 1
        else:
            pr = <Properties?>properties
            packed = pr._packed
            if packed is not None:
                section = PyBytes_GET_SIZE(packed)
            else:
                body = _props_front(pr)
                cd = _correlation(pr)
                ups = _user_props(pr)
                body = _props_checked(body + _props_back(cd, ups))
                section = _varint_len(body) + body
    total = 2 + tn + (2 if qos else 0) + section + pn
    if total > MAX_REMAINING:
        raise ValueError(f"a message of {pn} bytes is too large for MQTT")
    start = PyByteArray_GET_SIZE(out)
    size = 1 + _varint_len(total) + total
    PyByteArray_Resize(out, start + size)
    cdef char* w = PyByteArray_AS_STRING(out) + start
    w[0] = <char>(0x30 | (8 if dup else 0) | (qos << 1) | (1 if retain else 0))
    w = _put_varint(w + 1, total)
    w = _put_u16(w, tn)
    memcpy(w, t, tn)
    w += tn
    if qos:
        w = _put_u16(w, mid)
    if v5:
        if pr is None:
            w[0] = 0
            w += 1
        elif packed is not None:
            memcpy(w, PyBytes_AS_STRING(packed), section)
            w += section
        else:
            w = _put_props(_put_varint(w, body), pr, cd, ups)
    if pn:
        memcpy(w, data, pn)


def ack_into(bytearray out, int ptype, int mid, int reason=0):
    """Append a PUBACK, PUBREC, PUBREL or PUBCOMP (a reason other than 0: MQTT 5)."""
    out.append((ptype << 4) | (2 if ptype == PUBREL else 0))
    if reason:
        out.append(3)
        _add_u16(out, mid)
        out.append(reason)
    else:
        out.append(2)
        _add_u16(out, mid)


def encode_connect(str client_id, int keepalive, bint v5=True, username=None, password=None,
                   Py_ssize_t max_packet=0, int receive_max=0):
    """A CONNECT with a clean start (the link keeps its own queue across reconnects).
    ``max_packet``/``receive_max`` (MQTT 5, 0 = unsaid): what the broker may send us."""
    cdef bytearray body = bytearray(b"\x00\x04MQTT")
    cdef bytearray props = bytearray()
    cdef int flags = 0x02
    body.append(5 if v5 else 4)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body.append(flags)
    if not 0 <= keepalive <= 0xFFFF:
        raise ValueError(f"keepalive {keepalive}")
    _add_u16(body, keepalive)
    if v5:
        if receive_max:
            props.append(0x21)
            _add_u16(props, receive_max)
        if max_packet:
            props.append(0x27)
            _add_u16(props, (max_packet >> 16) & 0xFFFF)
            _add_u16(props, max_packet & 0xFFFF)
        _add_varint(body, len(props))
        body += props
    _add_str(body, client_id, "client id")
    if username is not None:
        _add_str(body, username, "user name")
    if password is not None:
        _add_bin(body, password.encode() if isinstance(password, str) else password,
                 "password")
    return _frame(CONNECT << 4, body)


cdef bytes _frame(int first, bytearray body):
    cdef bytearray out = bytearray()
    out.append(first)
    _add_varint(out, len(body))
    out += body
    return bytes(out)


def encode_subscribe(int mid, filters, int qos=1, int sub_id=0, bint v5=True):
    """A SUBSCRIBE of ``filters`` (str) at ``qos``, with a subscription identifier
    when ``sub_id`` (MQTT 5)."""
    cdef bytearray body = bytearray()
    cdef bytearray props = bytearray()
    _add_u16(body, mid)
    if v5:
        if sub_id:
            props.append(0x0B)
            _add_varint(props, sub_id)
        _add_varint(body, len(props))
        body += props
    for f in filters:
        if not f:
            raise ValueError("an empty topic filter")
        _add_str(body, f, "topic filter")
        body.append(qos)
    return _frame((SUBSCRIBE << 4) | 2, body)


def encode_unsubscribe(int mid, filters, bint v5=True):
    cdef bytearray body = bytearray()
    _add_u16(body, mid)
    if v5:
        body.append(0)
    for f in filters:
        _add_str(body, f, "topic filter")
    return _frame((UNSUBSCRIBE << 4) | 2, body)


PINGREQ_PACKET = b"\xc0\x00"


def encode_disconnect(int reason=0, bint v5=True):
    if v5 and reason:
        return bytes((DISCONNECT << 4, 1, reason))
    return b"\xe0\x00"


# ---------------------------------------------------------------------------------
# CloudEvent attributes (binary mode travels as user properties)


cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)


def plain_texts(values, bint nonempty=True, Py_ssize_t max_chars=1024):
    """True when every value is None or a str of printable ASCII (U+0020..U+007E), at
    most ``max_chars`` long and, with ``nonempty``, not empty: an attribute that needs
    no closer look. False says nothing is wrong, only that a closer look is due."""
    cdef Py_ssize_t i, n
    cdef const unsigned char* p
    for v in values:
        if v is None:
            continue
        if type(v) is not str or not PyUnicode_IS_COMPACT_ASCII(v):
            return False
        n = PyUnicode_GET_LENGTH(v)
        if n > max_chars or (nonempty and n == 0):
            return False
        p = <const unsigned char*>PyUnicode_DATA(v)
        for i in range(n):
            if p[i] < 0x20 or p[i] == 0x7F:
                return False
    return True
