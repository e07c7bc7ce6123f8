"""`--otlp-traces-endpoint` (vLLM's name): OpenTelemetry traces by OTLP from this process (docs/fleet.md#traces).

The only place the tracer provider is built, once per process; unset, nothing of OpenTelemetry is imported and
common/tracing.py stays off. The protocol follows OpenTelemetry's (and vLLM's) environment variable
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: grpc (default) or http/protobuf.
"""

from __future__ import annotations

import os

import typer

OtlpTracesEndpoint = typer.Option(
    "", "--otlp-traces-endpoint", envvar="SPLITSERVE_OTLP_TRACES_ENDPOINT",
    help="Send OpenTelemetry trace spans here by OTLP (e.g. http://127.0.0.1:4317 for gRPC, "
    "http://127.0.0.1:4318/v1/traces with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf); empty: no tracing")


def configure_tracing(endpoint: str, service_name: str) -> None:
    """Turn tracing on for this process when ``endpoint`` is set (spans batched, exported off the event loop)."""
    if not endpoint:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from common import tracing

    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    else:
        raise typer.BadParameter(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL must be grpc or http/protobuf, not "
                                 f"{protocol!r}", param_hint="--otlp-traces-endpoint")
    provider = TracerProvider(resource=Resource.create({"service.name": f"splitserve-{service_name}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracing.configure(provider)


def tracing_args(endpoint: str) -> list[str]:
    """The option as `up` hands it to each child."""
    return ["--otlp-traces-endpoint", endpoint] if endpoint else []
