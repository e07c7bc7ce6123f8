"""One choice's answer as its output slices arrive: text (stop strings and stop ids applied), finish reason,
logprobs."""

from __future__ import annotations

from common.protocol import Tokens
from services.frontend.logprobs import LogprobsRenderer
from services.frontend.tokenizer import IncrementalDetokenizer


class ChoiceText:
    """One choice's text, finish reason and logprobs as its output slices arrive."""

    def __init__(self, detok: IncrementalDetokenizer, renderer: LogprobsRenderer | None) -> None:
        self.detok = detok
        self.renderer = renderer
        self.texts: list[str] = []
        self.parts: list[dict] = []
        self.finish = "length"
        self.stopped = False  # a stop string ended it before its worker did

    def feed(self, out: Tokens, stop_token_ids: tuple[int, ...], stop: tuple[str, ...]) -> tuple[str, dict | None]:
        """The new text (stop strings applied) and logprobs of one slice; kept too for a whole response."""
        if self.stopped:
            return "", None
        shown = out.token_ids
        if out.finish_reason == "stop" and shown and shown[-1] in stop_token_ids:
            shown = shown[:-1]  # a stop id ends the answer unseen, as in vLLM (its logprob stays)
        step = self.detok.feed(shown, stop)
        text = step.text if step.stopped or out.finish_reason is None else step.text + self.detok.flush()
        if step.stopped:
            self.finish, self.stopped = "stop", True
        elif out.finish_reason is not None:
            self.finish = "stop" if out.finish_reason == "stop" else "length"
        part = self.renderer.render(out.logprobs) if self.renderer is not None and out.logprobs else None
        self.texts.append(text)
        if part is not None:
            self.parts.append(part)
        return text, part

    def result(self) -> tuple[str, str, dict | None]:
        logprobs = None if self.renderer is None else self.renderer.merge(self.parts)
        return "".join(self.texts), self.finish, logprobs
