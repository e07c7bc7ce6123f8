"""Logging is configured here, once per process: structlog, to stderr, JSON or console."""

from __future__ import annotations

import logging
import sys

import structlog


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was configured: a caller that swaps it
    (a test's CLI runner, a daemon redirecting it) never leaves loggers bound to a closed stream."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info", json: bool = False, service: str = "") -> None:
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(
        # Plain tracebacks: rich's would print every frame's locals (request headers, API keys, prompts).
        colors=False, exception_formatter=structlog.dev.plain_traceback)
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json:
        processors.append(structlog.processors.format_exc_info)
    if service:
        processors.insert(0, lambda _logger, _name, event: {**event, "service": service})
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    # vLLM and others use stdlib logging; keep them at warning unless asked.
    logging.basicConfig(stream=_Stderr(),  # type: ignore[arg-type]
                        level=logging.getLevelName(level.upper()) if level == "debug" else logging.WARNING)
