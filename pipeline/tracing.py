"""OpenTelemetry traces of every process (docs/behaviour.md §8), configured only by the standard
`OTEL_*` environment variables.

Off unless an exporter is asked for (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_TRACES_EXPORTER`), and off again with
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. While off, the SDK is never imported and
every instrumented place costs one test of `ON` (plus passing a record's `traceparent` header on
unchanged, so that a trace started elsewhere survives a process that does not trace). While on,
spans go through a batching processor to the OTLP/HTTP exporter, which reads its own endpoint,
headers and timeout variables; `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` name the process
(else `agentstream-<process>`), `OTEL_TRACES_SAMPLER` samples.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from processors import traceparent

ON = False
_tracer: Any = None
_provider: Any = None

# The traceparent that appends made in this context continue: set by the gateway from an HTTP
# request's own header, by the caller and the capability host around the appends of one job.
PARENT: ContextVar[bytes | None] = ContextVar("agentstream_trace_parent", default=None)


def wanted(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(process: str, environ: Mapping[str, str] | None = None) -> bool:
    """Start exporting spans when the environment asks for it; True if it does."""
    global ON, _tracer, _provider
    environ = os.environ if environ is None else environ
    if ON or not wanted(environ):
        return ON
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": f"agentstream-{process}"}))
    exporters = [name.strip() for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")]
    for name in exporters:
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name in ("otlp", ""):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER={name!r} is not supported here: use otlp, console or none")
    # Not installed as OpenTelemetry's global provider: this module's tracer is the only user, and
    # a test can stop it and configure another.
    _provider, _tracer, ON = provider, provider.get_tracer("agentstream"), True
    atexit.register(shutdown)
    return True


def shutdown() -> None:
    """Export what is buffered (a clean exit, the end of a test)."""
    if _provider is not None:
        _provider.force_flush()


def stop() -> None:
    """Export what is buffered and turn tracing off again (a test that configured it)."""
    global ON, _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    ON, _tracer, _provider = False, None, None


# --- spans (call only while ON) ------------------------------------------------------------------


def start(
    name: str,
    parent: bytes | None,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: str = "internal",
    link: bytes | None = None,
) -> Any:
    """A started span, a child of the traceparent `parent` (None: of the current span, else a new
    trace), with a link to the traceparent `link`. End it with `.end()`."""
    from opentelemetry import trace

    context = None
    found = traceparent.parse(parent)
    if found is not None:
        context = trace.set_span_in_context(trace.NonRecordingSpan(_span_context(found)))
    links = None
    linked = traceparent.parse(link)
    if linked is not None:
        links = [trace.Link(_span_context(linked))]
    return _tracer.start_span(
        name, context=context, kind=getattr(trace.SpanKind, kind.upper()), attributes=attributes, links=links
    )


def header_of(span: Any) -> bytes:
    """The traceparent naming `span`: what the records written on its behalf carry."""
    context = span.get_span_context()
    return traceparent.encode(context.trace_id, context.span_id, int(context.trace_flags))


def use(span: Any) -> Any:
    """A context manager making `span` the current one (it is not ended on exit)."""
    from opentelemetry import trace

    return trace.use_span(span, end_on_exit=False)


def current_span() -> Any:
    from opentelemetry import trace

    return trace.get_current_span()


def _span_context(found: traceparent.TraceParent) -> Any:
    from opentelemetry import trace

    return trace.SpanContext(found.trace_id, found.span_id, is_remote=True, trace_flags=trace.TraceFlags(found.flags))


# --- appends -------------------------------------------------------------------------------------


def append_header(path: str, event_type: str, door: str) -> bytes | None:
    """The traceparent of one append command (client or gateway): while on, an `agentstream.append`
    span, a child of `PARENT` (else of the current span, else a new trace), ended at once; while
    off, `PARENT` as it is."""
    parent = PARENT.get()
    if not ON:
        return traceparent.carried(parent)  # whoever set it, a record carries 55 bytes at most
    span = start(
        "agentstream.append",
        parent,
        {"agentstream.stream.path": path, "agentstream.event.type": event_type, "agentstream.door": door},
        kind="producer",
    )
    span.end()
    return header_of(span)


# --- the journal worker --------------------------------------------------------------------------


def journal_header(parent: bytes | None, event: Any | None, outcome: str) -> bytes:
    """The traceparent of one decided command's records: an `agentstream.journal` span (the
    stream path, offset and event type when journaled), a child of the command's, ended at once."""
    attributes: dict[str, Any] = {"agentstream.outcome": outcome}
    if event is not None:
        attributes["agentstream.stream.path"] = event.streamPath
        attributes["agentstream.journal.offset"] = event.offset
        attributes["agentstream.event.type"] = event.type
    span = start("agentstream.journal", parent, attributes)
    span.end()
    return header_of(span)


def schedule_header(trigger: bytes | None, path: str, event_type: str, pending: Any | None) -> bytes:
    """The traceparent of a turn the scheduler decided: an `agentstream.schedule` span with its
    reason, in the trace of the trigger it answers, ended at once."""
    reason = f"{event_type.rsplit('/', 1)[-1]}: {pending.source if pending else 'no'} trigger"
    attributes: dict[str, Any] = {"agentstream.stream.path": path, "agentstream.schedule.reason": reason}
    if pending is not None:
        attributes["agentstream.trigger.offset"] = pending.offset
    span = start("agentstream.schedule", trigger, attributes)
    span.end()
    return header_of(span)
