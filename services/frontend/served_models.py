"""The model names this frontend answers to: the served name (what workers register and responses carry) and its
aliases, as vLLM's `--served-model-name NAME ALIAS...` (an alias is answered under the first name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import msgspec
import orjson

from services.frontend.openai_api import ApiError, ChatCompletionRequest, CompletionRequest

_Body = TypeVar("_Body", ChatCompletionRequest, CompletionRequest)


@dataclass(frozen=True, slots=True)
class ServedModels:
    name: str
    aliases: tuple[str, ...] = ()

    def canonical(self, requested: str) -> str:
        """The served name for a request's ``model``; 404 in OpenAI's shape for one not served here."""
        if requested == self.name or requested in self.aliases:
            return self.name
        served = ", ".join(repr(n) for n in (self.name, *self.aliases))
        raise ApiError(404, f"model {requested!r} does not exist; this server serves {served}", param="model",
                       code="model_not_found")

    def served(self, body: _Body) -> _Body:
        """The request under the served name (what workers registered and responses carry)."""
        name = self.canonical(body.model)
        return body if name == body.model else msgspec.structs.replace(body, model=name)

    def listing(self) -> bytes:
        """/v1/models: every name, each pointing at the served one (``root``)."""
        return orjson.dumps({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "splitserve", "root": self.name}
            for name in (self.name, *self.aliases)]})
