"""The MES side: ISA-95 job control over MQTT, as the Python original speaks it.

- ``model``: the payload types, the CloudEvent types and return statuses, the states
  as ``ISA95StateDataType`` lists;
- ``codec``: payloads, scopes, topics and envelopes (pure);
- ``catalog``: what an MES configures for a scope, and the job acceptance checks;
- ``control``: ``MesControl``, requests in and replies out;
- ``publishing``: status events and retained order, result and state index;
- ``presence``: the host's own retained status and its Last Will.

This module re-exports the model only: ``control`` and ``publishing`` drive the host
and are imported from their modules (the host's own modules use the model).
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

__all__ = ["BY_ID", "BY_STATE", "INVALID_JOB_ORDER_STATUS", "INVALID_REQUEST", "JOB_CONTROL",
           "METHODS", "NO_ERROR", "STATUS_EVENT", "UNABLE_TO_ACCEPT_JOB_ORDER",
           "UNKNOWN_JOB_ORDER_ID", "WORK_MASTER", "state_list", "state_name"]
