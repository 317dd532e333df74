"""The fast PUBLISH property decoder gives exactly what paho's own gives, and sends
everything else (and everything paho refuses) to paho."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sfc_host import paho_fast

text = st.text(max_size=40)


def _both(buf: bytes) -> tuple[object, object]:
    def one(fn: object) -> object:
        p = Properties(PacketTypes.PUBLISH)
        try:
            _, n = fn(p, buf)  # type: ignore[operator]
        except Exception as e:
            return ("error", type(e).__name__)
        return (n, p.json())
    return one(paho_fast._original_unpack), one(paho_fast.fast_unpack)


@settings(max_examples=300, deadline=None)
@given(user=st.lists(st.tuples(text, text), max_size=8), ct=st.none() | text,
       rt=st.none() | text, cd=st.none() | st.binary(max_size=40),
       exp=st.none() | st.integers(0, 2**32 - 1), pfi=st.none() | st.integers(0, 1))
def test_same_attributes_as_paho_for_what_we_receive(user: list, ct: str | None,
                                                     rt: str | None, cd: bytes | None,
                                                     exp: int | None, pfi: int | None) -> None:
    p = Properties(PacketTypes.PUBLISH)
    try:
        if user:
            p.UserProperty = user
        if ct is not None:
            p.ContentType = ct
        if rt is not None:
            p.ResponseTopic = rt
        if cd is not None:
            p.CorrelationData = cd
        if exp is not None:
            p.MessageExpiryInterval = exp
        if pfi is not None:
            p.PayloadFormatIndicator = pfi
        buf = bytes(p.pack())
    except Exception:
        return
    slow, fast = _both(buf)
    assert fast == slow


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120))
def test_garbage_gets_the_same_answer_as_paho(buf: bytes) -> None:
    slow, fast = _both(buf)
    assert fast == slow


def test_properties_share_tables_but_not_values() -> None:
    paho_fast.install()
    a = Properties(PacketTypes.PUBLISH)
    b = Properties(PacketTypes.PUBLISH)
    a.ContentType = "x"
    a.UserProperty = [("k", "v")]
    assert not hasattr(b, "ContentType") and not hasattr(b, "UserProperty")
    assert a.names is b.names                       # the shared, never-changed table
    c = Properties(PacketTypes.PUBACK)
    assert c.packetType == PacketTypes.PUBACK and c.pack() == b"\x00"
