"""The MES face: ISA-95 job control over MQTT, as the Python original speaks it.

- ``control``: ``MesControl``, requests in and replies out;
- ``publishing``: status events and retained order, result and state index, each
  stamped in Redis with the change (``sfc_host.store.outbox``) and sent after it;
- ``codec``: payloads, a job order's limits, scopes, topics and envelopes (pure);
- ``catalog``: what an MES configures for a scope, and the job acceptance checks;
- ``presence``: the host's own retained status and its Last Will;
- ``client``: ``MesClient``, the MES side as the CLI (``sfc-host job``) speaks it.

The ISA-95 model itself (payload types, states, return statuses) is ``sfc_host.isa95``,
shared with the rest of the host.
"""
