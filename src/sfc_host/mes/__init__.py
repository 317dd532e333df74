"""The MES face: ISA-95 job control over MQTT, as the Python original speaks it.

- ``control``: ``MesControl``, requests in and replies out;
- ``publishing``: status events and retained order, result and state index, each
  stamped in Redis with the change (``sfc_host.store.outbox``) and sent after it;
- ``codec``: payloads, a job order's limits, scopes, topics and envelopes (pure);
- ``catalog``: what an MES configures for a scope, and the job acceptance checks;
- ``presence``: the host's own retained status and its Last Will;
- ``client``: ``MesClient``, the MES side as the CLI (``sfc-host job``) speaks it.

The ISA-95 model itself (payload types, states, return statuses) is ``sfc_host.isa95``,
shared with the rest of the host; its names are re-exported here too.
"""


from sfc_host.isa95 import (
    BY_ID,
    BY_STATE,
    INVALID_JOB_ORDER_STATUS,
    INVALID_REQUEST,
    JOB_CONTROL,
    METHODS,
    NO_ERROR,
    STATUS_EVENT,
    UNABLE_TO_ACCEPT_JOB_ORDER,
    UNKNOWN_JOB_ORDER_ID,
    WORK_MASTER,
    state_list,
    state_name,
)
from sfc_host.mes.client import MesClient, MesError, Reply
from sfc_host.mes.control import MesControl
from sfc_host.mes.presence import Presence
from sfc_host.mes.publishing import Publisher

__all__ = [
    "BY_ID",
    "BY_STATE",
    "INVALID_JOB_ORDER_STATUS",
    "INVALID_REQUEST",
    "JOB_CONTROL",
    "METHODS",
    "NO_ERROR",
    "STATUS_EVENT",
    "UNABLE_TO_ACCEPT_JOB_ORDER",
    "UNKNOWN_JOB_ORDER_ID",
    "WORK_MASTER",
    "MesClient",
    "MesControl",
    "MesError",
    "Presence",
    "Publisher",
    "Reply",
    "state_list",
    "state_name",
]
