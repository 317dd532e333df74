"""Traces: the W3C Trace Context a job carries from the MES request to every equipment
command (``context``). With ``otel = true``, and only then, the host imports the rest,
which needs the ``[otel]`` extra: ``spans`` (the spans of requests, jobs, attempts and
holds), ``batch`` (the span processor) and ``otlp`` (the OTLP/HTTP exporter)."""
