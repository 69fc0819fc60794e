"""OpenTelemetry traces of runs, off unless ``OTEL_TRACES_EXPORTER`` names an exporter.

The optional extra ``duetime[tracing]`` brings the OpenTelemetry SDK. With it installed and the
standard ``OTEL_TRACES_EXPORTER`` set (``console``, ``otlp``; ``none`` or unset is off), each
attempt of a run is a ``duetime.run`` span, and every webhook call and queue message of it
carries a W3C ``traceparent`` header naming that span, so a target can join its own trace to the
run that called it.

One run, one trace: the trace id is derived from the occurrence's Idempotency-Key, so every
attempt and every redelivery of the same occurrence lands in the same trace, whichever worker
made it, while each attempt has its own span. Without the SDK, or with tracing off, nothing here
is imported beyond the standard library and ``run_spans`` costs one check.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

log = logging.getLogger("duetime.workers")

TRACEPARENT: Final = "traceparent"
EXPORTER_ENV: Final = "OTEL_TRACES_EXPORTER"

_tracer: Any = None  # an opentelemetry Tracer once tracing is on
_trace_id_for_next: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "duetime_trace_id", default=None
)


class TracingUnavailable(RuntimeError):
    """OTEL_TRACES_EXPORTER asks for tracing but the extra (or an exporter) is not installed."""


def trace_id_of(idempotency_key: str) -> int:
    """The occurrence's 128-bit trace id: the same for every attempt of one run (never 0)."""
    value = int.from_bytes(hashlib.sha256(idempotency_key.encode()).digest()[:16], "big")
    return value or 1


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class OccurrenceIds(RandomIdGenerator):
        """Random span ids; the trace id of the run being traced when one is set."""

        def generate_trace_id(self) -> int:
            wanted = _trace_id_for_next.get()
            return wanted if wanted is not None else super().generate_trace_id()

    return OccurrenceIds()


def provider(*processors: Any) -> Any:
    """A TracerProvider with Duetime's id generator and the given span processors."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    service = os.environ.get("OTEL_SERVICE_NAME") or "duetime"
    made = TracerProvider(resource=Resource.create({"service.name": service}), id_generator=_id_generator())
    for processor in processors:
        made.add_span_processor(processor)
    return made


def install(tracer_provider: Any) -> None:
    """Trace runs with this provider (``None`` turns tracing off again)."""
    global _tracer
    _tracer = None if tracer_provider is None else tracer_provider.get_tracer("duetime")


def configure(environ: dict[str, str] | None = None) -> bool:
    """Turn tracing on when ``OTEL_TRACES_EXPORTER`` asks for it; True when it is on."""
    env = os.environ if environ is None else environ
    names = [n.strip().lower() for n in (env.get(EXPORTER_ENV) or "").split(",") if n.strip()]
    names = [n for n in names if n != "none"]
    if not names:
        return False
    try:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise TracingUnavailable(
            f"{EXPORTER_ENV}={env.get(EXPORTER_ENV)} asks for traces, but OpenTelemetry is not "
            "installed: pip install 'duetime[tracing]' (or unset the variable)"
        ) from None
    processors = []
    for name in names:
        if name == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise TracingUnavailable(
                    f"{EXPORTER_ENV}=otlp needs the OTLP exporter: pip install 'duetime[tracing]'"
                ) from None
            processors.append(BatchSpanProcessor(OTLPSpanExporter()))  # reads OTEL_EXPORTER_OTLP_*
        else:
            raise TracingUnavailable(f"{EXPORTER_ENV}: unknown exporter {name!r}; use console, otlp or none")
    install(provider(*processors))
    log.info("tracing runs with exporter(s) %s", ", ".join(names))
    return True


def enabled() -> bool:
    return _tracer is not None


@dataclass(slots=True)
class RunSpan:
    """One attempt's span and the ``traceparent`` that names it; ``end`` records the outcome."""

    span: Any
    traceparent: str

    def end(self, outcome: str, status_code: int | None, error: str | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("duetime.outcome", outcome)
        if status_code is not None:
            self.span.set_attribute("http.response.status_code", status_code)
        if outcome != "succeeded":
            self.span.set_status(Status(StatusCode.ERROR, (error or outcome)[:200]))
        self.span.end()


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a span says about the attempt (no payload, no header values: they may be secrets)."""

    job_id: str
    idempotency_key: str
    attempt: int
    fencing_token: int
    target_type: str


def _start(info: RunInfo) -> RunSpan:
    token = _trace_id_for_next.set(trace_id_of(info.idempotency_key))
    try:
        # A root span of its own: the trace is the run's, not the worker loop's.
        from opentelemetry import context as otel_context

        span = _tracer.start_span(
            "duetime.run",
            context=otel_context.Context(),
            attributes={
                "duetime.job_id": info.job_id,
                "duetime.idempotency_key": info.idempotency_key,
                "duetime.attempt": info.attempt,
                "duetime.fencing_token": info.fencing_token,
                "duetime.target.type": info.target_type,
            },
        )
    finally:
        _trace_id_for_next.reset(token)
    ctx = span.get_span_context()
    return RunSpan(span, f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}")


@contextlib.contextmanager
def run_spans(infos: Sequence[RunInfo]) -> Iterator[list[RunSpan] | None]:
    """Spans for a batch of attempts (None when tracing is off); the caller ends each one. Any
    span the caller did not end (an exception) ends here as an error."""
    if _tracer is None:
        yield None
        return
    spans = [_start(info) for info in infos]
    try:
        yield spans
    finally:
        for run in spans:
            if run.span.is_recording():
                run.end("failed", None, "the attempt ended without an outcome")
