# cython: language_level=3
"""MQTT 5 and 3.1.1 client packets, sans I/O: a ``Reader`` frames what the broker sends
from a byte stream, and the ``*_into`` / ``encode_*`` functions build what a client sends.

The host's MQTT connection (``sfc_host.mqtt``) runs on this. It is compiled because it
runs for every message: one ``Reader.feed`` frames every packet of a socket read, a
PUBLISH becomes the handler's ``Message`` (with its ``Properties``) and nothing else,
and the acknowledgements of one read go out as one write.

What the broker sends is read under two rules. A stream that can no longer be framed
(a bad remaining length, a packet larger than ``max_packet`` that is no PUBLISH) or a
packet other than PUBLISH that breaks the protocol (a reserved flag set, a packet a
server never sends, a CONNACK or DISCONNECT with bad properties) raises
``MalformedPacket``; the spec then wants the connection closed, with its reason code
(``reason``) in a DISCONNECT on MQTT 5. A PUBLISH whose length is known but whose
contents break the rules (its flags, topic, packet id or properties) is dropped and
reported (``DROPPED``), and an acknowledgement with bad properties is used without them
(``IGNORED``): a retained message with a bad property would otherwise close the
connection at every reconnect, as the broker sends it again on each subscribe.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memchr, memcpy

from sfc_fast._text cimport utf8_view

from sfc_fast.errors import SfcError

# packet types, compared in C by the reader
cdef enum:
    T_CONNECT = 1
    T_CONNACK = 2
    T_PUBLISH = 3
    T_PUBACK = 4
    T_PUBREC = 5
    T_PUBREL = 6
    T_PUBCOMP = 7
    T_SUBSCRIBE = 8
    T_SUBACK = 9
    T_UNSUBSCRIBE = 10
    T_UNSUBACK = 11
    T_PINGREQ = 12
    T_PINGRESP = 13
    T_DISCONNECT = 14
    T_AUTH = 15
    T_OVERSIZED = 16
    T_DROPPED = 17
    T_IGNORED = 18

CONNECT = T_CONNECT
CONNACK = T_CONNACK
PUBLISH = T_PUBLISH
PUBACK = T_PUBACK
PUBREC = T_PUBREC
PUBREL = T_PUBREL
PUBCOMP = T_PUBCOMP
SUBSCRIBE = T_SUBSCRIBE
SUBACK = T_SUBACK
UNSUBSCRIBE = T_UNSUBSCRIBE
UNSUBACK = T_UNSUBACK
PINGREQ = T_PINGREQ
PINGRESP = T_PINGRESP
DISCONNECT = T_DISCONNECT
AUTH = T_AUTH
# not packet types: what a Reader reports besides packets
OVERSIZED = T_OVERSIZED     # a PUBLISH larger than max_packet, passed over
DROPPED = T_DROPPED         # a PUBLISH that breaks the rules, passed over
IGNORED = T_IGNORED         # the bad properties of an acknowledgement, left out

MAX_REMAINING = 268_435_455          # the largest remaining length a varint can say
MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
PACKET_TOO_LARGE = 0x95
TOPIC_NAME_INVALID = 0x90


class MalformedPacket(SfcError, ValueError):
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
_ALLOWED[PUBREC] = _ALLOWED[PUBREL] = _ALLOWED[PUBCOMP] = _ALLOWED[PUBACK]
_NAMES = {CONNACK: "CONNACK", PUBACK: "PUBACK", PUBREC: "PUBREC", PUBREL: "PUBREL",
          PUBCOMP: "PUBCOMP", SUBACK: "SUBACK", UNSUBACK: "UNSUBACK",
          DISCONNECT: "DISCONNECT"}


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
        if i == 4:      # known as soon as the fourth byte says more follow
            raise MalformedPacket("variable byte integer longer than four bytes")
        if i >= n:
            return -1
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
        if k > self.end - self.i:
            raise MalformedPacket(f"{what} is cut short")

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
            raise MalformedPacket(f"{what} is cut short")
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


cdef Py_ssize_t _props_end(_Cursor c) except -1:
    """Where the property section at ``c.i`` ends; ``c.i`` is left after its length."""
    cdef unsigned long n = c.varint("the property length")
    if n > <unsigned long>(c.end - c.i):
        raise MalformedPacket("the properties run past the end of the packet")
    return c.i + n


cdef dict _props_in(_Cursor c, int ptype, Py_ssize_t end):
    """The properties of a packet other than PUBLISH, from ``c.i`` to ``end``: a dict by
    name (UserProperty a list of pairs), each checked against what that packet may
    carry. ``c.i`` ends at ``end`` when they are fine."""
    cdef unsigned long ident
    cdef int kind
    cdef Py_ssize_t saved = c.end
    allowed = _ALLOWED[ptype]
    out = {}
    c.end = end
    try:
        while c.i < end:
            ident = c.varint("a property identifier")
            if ident not in allowed:
                raise MalformedPacket(f"property 0x{ident:02X} is not allowed there",
                                      PROTOCOL_ERROR)
            name, kind = _PROPS[ident]
            value = _read_value(c, kind, name)
            if kind == K_PAIR:
                out.setdefault(name, []).append(value)
            elif name in out:
                raise MalformedPacket(f"property {name} is given twice", PROTOCOL_ERROR)
            else:
                out[name] = value
    except MalformedPacket as e:
        raise MalformedPacket(f"{_NAMES[ptype]}: {e}", e.reason) from None
    finally:
        c.end = saved
    return out


cdef dict _read_props(_Cursor c, int ptype):
    return _props_in(c, ptype, _props_end(c))


cdef str _ack_props(_Cursor c, int ptype):
    """Checks the properties of an acknowledgement, which nothing here uses (a reason
    string is for people, the packet id and reason code carry the meaning), and leaves
    ``c.i`` after them: why they are bad, or None. SUBACK's and UNSUBACK's reason codes
    follow them, so a section that cannot be delimited there still raises."""
    cdef Py_ssize_t end
    cdef bint codes = ptype == T_SUBACK or ptype == T_UNSUBACK
    if codes:
        end = _props_end(c)
    else:
        try:
            end = _props_end(c)
        except MalformedPacket as e:
            c.i = c.end
            return f"{_NAMES[ptype]}: {e}"
    try:
        _props_in(c, ptype, end)
    except MalformedPacket as e:
        c.i = end if codes else c.end
        return str(e)
    if not codes and c.i != c.end:
        c.i = c.end
        return f"{_NAMES[ptype]}: bytes after the properties"
    return None


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
    cdef Py_ssize_t end = _props_end(c), saved = c.end
    if end == c.i:
        return None
    cdef unsigned long ident, sid
    cdef Properties p = Properties.__new__(Properties)
    cdef list user = None
    c.end = end
    try:
        while c.i < end:
            ident = c.varint("a property identifier")
            if ident == 0x26:
                if user is None:
                    user = []
                user.append((c.string("a user property"), c.string("a user property")))
            elif ident == 0x03:
                if p.ContentType is not None:
                    raise MalformedPacket("ContentType is given twice", PROTOCOL_ERROR)
                p.ContentType = c.string("ContentType")
            elif ident == 0x08:
                if p.ResponseTopic is not None:
                    raise MalformedPacket("ResponseTopic is given twice", PROTOCOL_ERROR)
                p.ResponseTopic = c.string("ResponseTopic")
                if "+" in p.ResponseTopic or "#" in p.ResponseTopic or not p.ResponseTopic:
                    raise MalformedPacket("ResponseTopic is no topic name", PROTOCOL_ERROR)
            elif ident == 0x09:
                if p.CorrelationData is not None:
                    raise MalformedPacket("CorrelationData is given twice", PROTOCOL_ERROR)
                p.CorrelationData = c.binary("CorrelationData")
            elif ident == 0x02:
                if p.MessageExpiryInterval is not None:
                    raise MalformedPacket("MessageExpiryInterval is given twice",
                                          PROTOCOL_ERROR)
                p.MessageExpiryInterval = c.u32("MessageExpiryInterval")
            elif ident == 0x01:
                if p.PayloadFormatIndicator is not None:
                    raise MalformedPacket("PayloadFormatIndicator is given twice",
                                          PROTOCOL_ERROR)
                p.PayloadFormatIndicator = c.byte("PayloadFormatIndicator")
                if p.PayloadFormatIndicator > 1:
                    raise MalformedPacket("PayloadFormatIndicator is neither 0 nor 1",
                                          PROTOCOL_ERROR)
            elif ident == 0x0B:
                sid = c.varint("SubscriptionIdentifier")
                if sid == 0:
                    raise MalformedPacket("SubscriptionIdentifier is 0", PROTOCOL_ERROR)
                if p.SubscriptionIdentifier is None:
                    p.SubscriptionIdentifier = []
                p.SubscriptionIdentifier.append(sid)
            elif ident == 0x23:
                # we announce no Topic Alias Maximum, so the server may send no alias
                raise MalformedPacket("a topic alias, when none was allowed", PROTOCOL_ERROR)
            else:
                raise MalformedPacket(f"property 0x{ident:02X} is not allowed in a PUBLISH",
                                      PROTOCOL_ERROR)
    finally:
        c.end = saved
    p.UserProperty = user
    return p


cdef object _text_or_none(const unsigned char* p, Py_ssize_t n):
    # an MQTT string, or None when it is not one (invalid UTF-8, U+0000)
    if n and memchr(p, 0, n) != NULL:
        return None
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        return None


cdef object _publish_head(_Cursor c, unsigned int flags, Py_ssize_t end, unsigned int* mid):
    """The topic of the PUBLISH at ``c.i``, which ends at ``end`` (``c.end``, the bytes
    here, falls short of it while an oversized one arrives), with ``mid`` set and ``c.i``
    after its packet id. A DROPPED item instead when its flags, topic or packet id break
    the rules; None while they are not all here."""
    cdef unsigned int qos = (flags >> 1) & 3
    cdef Py_ssize_t tlen, size
    cdef const unsigned char* t
    if end - c.i < 2:
        return (T_DROPPED, "", 0, 0, "protocol_error", "the PUBLISH ends before its topic")
    if c.end - c.i < 2:
        return None
    tlen = _u16(c.p + c.i)
    size = 2 + tlen + (2 if qos == 1 or qos == 2 else 0)
    if end - c.i < size:
        return (T_DROPPED, "", 0, 0, "protocol_error",
                "the topic runs past the end of the PUBLISH" if end - c.i < 2 + tlen
                else "the PUBLISH ends before its packet identifier")
    if c.end - c.i < size:
        return None
    t = c.p + c.i + 2
    topic = _text_or_none(t, tlen)
    c.i += size
    if qos == 3 or (qos == 0 and flags & 8):
        return (T_DROPPED, topic if topic is not None else "", 0, 0, "protocol_error",
                "a PUBLISH with QoS 3" if qos == 3 else "a PUBLISH with QoS 0 and DUP set")
    if qos:
        mid[0] = _u16(c.p + c.i - 2)
        if mid[0] == 0:
            return (T_DROPPED, topic if topic is not None else "", 0, 0, "protocol_error",
                    f"a PUBLISH with QoS {qos} and packet identifier 0")
    if topic is None:
        return (T_DROPPED, "", qos, mid[0], "bad_topic",
                "the topic has a U+0000 character" if memchr(t, 0, tlen) != NULL
                else "the topic is not valid UTF-8")
    if tlen == 0 or memchr(t, 0x2B, tlen) != NULL or memchr(t, 0x23, tlen) != NULL:
        return (T_DROPPED, topic, qos, mid[0], "bad_topic",
                "the topic is empty" if tlen == 0 else "the topic has a wildcard (+ or #)")
    return topic


cdef class Reader:
    """Frames the packets a broker sends. ``feed(data)`` returns what the bytes so far
    complete, in order: a ``Message`` per PUBLISH, a tuple per other packet —
    ``(CONNACK, session_present, reason, props)``, ``(PUBACK|PUBREC|PUBCOMP, mid,
    reason)``, ``(PUBREL, mid, reason)``, ``(SUBACK|UNSUBACK, mid, [reasons])``,
    ``(PINGRESP,)``, ``(DISCONNECT, reason, props)`` — and what it passed over or left out:

    - ``(OVERSIZED, topic, qos, mid, size)``: a PUBLISH larger than ``max_packet``, not
      kept (only its topic and packet id are read);
    - ``(DROPPED, topic, qos, mid, reason, why)``: a PUBLISH that breaks the rules, of
      any size. ``reason`` is ``"protocol_error"`` (QoS 3, QoS 0 with DUP, packet id 0,
      a topic or packet id running past the packet), ``"bad_topic"`` (not valid UTF-8,
      U+0000, empty, a wildcard) or ``"bad_properties"`` (MQTT 5; unknown, not allowed
      in PUBLISH, twice where once is allowed, a bad value, invalid UTF-8 or U+0000,
      running past the packet), the first of those in that order; ``why`` says it in
      words. ``topic`` is "" when it could not be read; ``qos`` and ``mid`` are what to
      acknowledge it with, both 0 when nothing can be;
    - ``(IGNORED, ptype, why)``: the properties of a PUBACK, PUBREC, PUBREL, PUBCOMP,
      SUBACK or UNSUBACK were bad; its own item follows, used as if it had none.

    A partial packet waits for the next ``feed``. Raised as ``MalformedPacket``: a
    stream that cannot be framed (a bad remaining length; a packet other than PUBLISH
    larger than ``max_packet``, 0x95) and a packet other than PUBLISH that breaks the
    rules, among them a CONNACK or DISCONNECT with bad properties and a SUBACK or
    UNSUBACK whose reason codes cannot be found. After a ``MalformedPacket`` the reader
    is spent (the connection is closed)."""

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
                item = self._oversized(c, p[i], i + total, total)
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
            self._packet(c, p[i], out)
            i = c.end
        if i < n:
            self._rest = buf[i:]
            if self._need:
                self._parts = [self._rest]
                self._have = n - i
                self._rest = b""
        return out

    cdef object _oversized(self, _Cursor c, unsigned int first, Py_ssize_t end,
                           Py_ssize_t total):
        """A PUBLISH larger than ``max_packet``: its topic, QoS and packet id (so it is
        acknowledged and counted, not parsed), a DROPPED item when those break the
        rules, or None until they are here; any other packet that large is refused."""
        cdef unsigned int mid = 0
        if first >> 4 != T_PUBLISH:
            raise MalformedPacket(f"a packet of {total} bytes, more than the "
                                  f"{self.max_packet} allowed", PACKET_TOO_LARGE)
        head = _publish_head(c, first & 0x0F, end, &mid)
        if head is None or type(head) is tuple:
            return head
        return (T_OVERSIZED, head, (first >> 1) & 3, mid, total)

    cdef int _packet(self, _Cursor c, unsigned int first, list out) except -1:
        cdef unsigned int ptype = first >> 4, flags = first & 0x0F, mid = 0
        cdef Message m
        cdef Properties given = None
        if ptype == T_PUBLISH:
            topic = _publish_head(c, flags, c.end, &mid)
            if type(topic) is not str:
                out.append(topic)         # DROPPED: never None, the packet is all here
                return 0
            if self.v5:
                if c.i < c.end and c.p[c.i] == 0:
                    c.i += 1                  # no properties: most messages
                else:
                    try:
                        given = _publish_props(c)
                    except MalformedPacket as e:
                        out.append((T_DROPPED, topic, (flags >> 1) & 3, mid, "bad_properties",
                                    str(e)))
                        return 0
            m = Message.__new__(Message)
            m.topic = topic
            m.qos = (flags >> 1) & 3
            m.retain = flags & 1
            m.dup = (flags >> 3) & 1
            m.mid = mid
            m.properties = given
            m.payload = PyBytes_FromStringAndSize(<const char*>c.p + c.i, c.end - c.i)
            out.append(m)
            return 0
        if ptype == T_PUBACK or ptype == T_PUBREC or ptype == T_PUBCOMP or ptype == T_PUBREL:
            if flags != (2 if ptype == T_PUBREL else 0):
                raise MalformedPacket(f"packet type {ptype} with reserved flags {flags}")
            mid = c.u16("the packet identifier")
            reason = 0
            if self.v5 and c.end > c.i:
                reason = c.byte("the reason code")
                if c.end > c.i:
                    why = _ack_props(c, ptype)
                    if why is not None:
                        out.append((T_IGNORED, ptype, why))
            elif c.end != c.i:
                raise MalformedPacket("acknowledgement longer than its packet identifier")
            out.append((ptype, mid, reason))
            return 0
        if flags:
            raise MalformedPacket(f"packet type {ptype} with reserved flags {flags}")
        if ptype == T_CONNACK:
            ack = c.byte("the CONNACK flags")
            if ack & 0xFE:
                raise MalformedPacket("CONNACK with reserved flags")
            reason = c.byte("the CONNACK reason code")
            props = _read_props(c, T_CONNACK) if self.v5 and c.end > c.i else {}
            self._done(c)
            out.append((T_CONNACK, bool(ack & 1), reason, props))
            return 0
        if ptype == T_SUBACK or ptype == T_UNSUBACK:
            mid = c.u16("the packet identifier")
            if self.v5:
                why = _ack_props(c, ptype)
                if why is not None:
                    out.append((T_IGNORED, ptype, why))
            codes = [c.p[k] for k in range(c.i, c.end)]
            c.i = c.end
            if ptype == T_SUBACK and not codes:
                raise MalformedPacket("SUBACK without reason codes", PROTOCOL_ERROR)
            out.append((ptype, mid, codes))
            return 0
        if ptype == T_PINGRESP:
            self._done(c)
            out.append((T_PINGRESP,))
            return 0
        if ptype == T_DISCONNECT and self.v5:
            reason = c.byte("the reason code") if c.end > c.i else 0
            props = _read_props(c, T_DISCONNECT) if c.end > c.i else {}
            self._done(c)
            out.append((T_DISCONNECT, reason, props))
            return 0
        if ptype == T_AUTH and self.v5:
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
    # through a memoryview: bytes(5) would be five zero bytes, not a TypeError
    cdef bytes v = b if type(b) is bytes else bytes(memoryview(b))
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


cdef const char* _topic_view(object topic, Py_ssize_t* n, str what) except NULL:
    """The UTF-8 of a topic to publish to (borrowed): a string field, not empty and
    without a wildcard."""
    cdef const char* t = _text_view(topic, n, what)
    if n[0] == 0 or memchr(t, 0x2B, n[0]) != NULL or memchr(t, 0x23, n[0]) != NULL:
        raise ValueError(f"{topic[:200]!r} is no topic to publish to")
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
    only; ignored on 3.1.1). ``dup`` marks a message sent again; it is left off at QoS 0,
    where the spec forbids it (a message the broker's Maximum QoS took down to 0). Raises
    ValueError (or TypeError) for what cannot be sent, leaving ``out`` as it was."""
    cdef Py_ssize_t tn, pn, body = 0, section = 0, total, start, size
    cdef const char* t = _topic_view(topic, &tn, "topic")
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
    w[0] = <char>(0x30 | (8 if dup and qos else 0) | (qos << 1) | (1 if retain else 0))
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
                   Py_ssize_t max_packet=0, int receive_max=0, *, will_topic=None,
                   will_payload=b"", int will_qos=0, bint will_retain=False,
                   will_properties=None):
    """A CONNECT with a clean start (the link keeps its own queue across reconnects).
    ``max_packet``/``receive_max`` (MQTT 5, 0 = unsaid): what the broker may send us.
    With ``will_topic``, a Last Will the broker publishes when the connection ends
    without a DISCONNECT: ``will_payload`` at ``will_qos``, retained with
    ``will_retain``, with ``will_properties`` (a ``Properties``; MQTT 5 only, ignored on
    3.1.1). Raises ValueError for what the spec forbids: a will topic that is no topic
    name, will settings without a will topic, and on MQTT 3.1.1 a password without a
    user name."""
    cdef bytearray body = bytearray(b"\x00\x04MQTT")
    cdef bytearray props = bytearray()
    cdef int flags = 0x02
    cdef Py_ssize_t tn
    cdef Properties wp = None
    body.append(5 if v5 else 4)
    if username is not None:
        flags |= 0x80
    if password is not None:
        if not v5 and username is None:
            # MQTT-3.1.2-22; brokers close such a connection
            raise ValueError("MQTT 3.1.1 sends a password only with a user name")
        flags |= 0x40
    if will_topic is not None:
        _topic_view(will_topic, &tn, "will topic")
        if not 0 <= will_qos <= 2:
            raise ValueError(f"will QoS {will_qos}")
        if v5 and will_properties is not None:
            wp = <Properties?>will_properties
        flags |= 0x04 | (will_qos << 3) | (0x20 if will_retain else 0)
    elif will_qos or will_retain or will_payload or will_properties is not None:
        raise ValueError("will settings without a will topic")
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
    if will_topic is not None:
        if v5:
            body += wp.pack() if wp is not None else b"\x00"
        _add_str(body, will_topic, "will topic")
        _add_bin(body, will_payload, "will payload")
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
