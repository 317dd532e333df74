"""Traces: the W3C Trace Context a job carries from the MES request to every equipment
command (``context``)."""

from sfc_host.tracing.context import (
    InvalidTraceParent,
    TraceContext,
    new_trace,
    parse_traceparent,
    valid_tracestate,
)

__all__ = ["InvalidTraceParent", "TraceContext", "new_trace", "parse_traceparent",
           "valid_tracestate"]
