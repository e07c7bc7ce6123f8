"""A response's id as vLLM makes it: ``<prefix>-<X-Request-Id header>``, else ``<prefix>-<body's request_id>``,
else a random one; and the id the request travels under inside the graph, unique even when clients reuse ids."""

from __future__ import annotations

from typing import Any

from common.transport import new_id


def response_ids(prefix: str, headers: dict[str, str], body: Any) -> tuple[str, str | None]:
    """(the response's id, the graph's id for the request or None when it is the response's own)."""
    chosen = headers.get("x-request-id") or getattr(body, "request_id", None)
    if not chosen:
        return new_id(prefix), None
    # Two clients may send one id at once: inside the graph each request gets its own.
    return f"{prefix}-{chosen}", new_id(prefix)
