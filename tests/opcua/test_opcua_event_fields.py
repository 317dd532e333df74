"""The face's status events give each subscriber's select clauses the fields asyncua's
own ``Event.to_event_fields`` would, while the event object is triggered again and
again with some fields changed (``face.share_fields``)."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from asyncua import Server, ua
from asyncua.common.events import Event, get_filter_from_event_type
from helpers.aio import run

from sfc_host.opcua.face import share_fields


def _values(fields: list[ua.Variant]) -> list[tuple[Any, ua.VariantType]]:
    return [(f.Value, f.VariantType) for f in fields]


def test_shared_fields_are_asyncuas_fields_of_each_trigger() -> None:
    async def main() -> None:
        server = Server()
        await server.init()
        gen = await server.get_event_generator()
        event = gen.event
        share_fields(event)
        whole = (await get_filter_from_event_type(
            [server.get_node(ua.ObjectIds.BaseEventType)])).SelectClauses
        part = whole[::2]                   # another subscriber's select clauses
        made: list[list[ua.Variant]] = []
        for i in range(3):
            # what a trigger changes: a new id, times and message; the rest stays
            event.EventId = uuid.uuid4().bytes
            event.Time = event.ReceiveTime = datetime.datetime.now(datetime.UTC)
            event.Message = ua.LocalizedText(f"J{i} Running")
            if i == 2:
                event.Severity = 700
            event.shared_fields.clear()
            for clauses in (whole, part, whole):
                got = event.to_event_fields(clauses)
                assert _values(got) == _values(Event.to_event_fields(event, clauses))
            made.append(event.to_event_fields(whole))
        names = [c.BrowsePath[0].Name for c in whole]
        severity, message = names.index("Severity"), names.index("Message")
        # an unchanged field's Variant is made once; a changed one's anew
        assert made[0][severity] is made[1][severity] is not made[2][severity]
        assert made[2][severity].Value == 700
        assert made[0][message] is not made[1][message]
        assert [m[message].Value.Text for m in made] == ["J0 Running", "J1 Running",
                                                          "J2 Running"]
    run(main())
