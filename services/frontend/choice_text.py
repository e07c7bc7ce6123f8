"""One choice's answer as its output slices arrive: text (stop strings and stop ids applied), finish reason,
logprobs."""

from __future__ import annotations

from typing import Any

from common.protocol import TokenLogprobs, Tokens
from services.frontend.echo import Echo
from services.frontend.logprobs import LogprobsRenderer
from services.frontend.tokenizer import DetokenizeOptions, IncrementalDetokenizer


def detokenize_options(body: Any) -> DetokenizeOptions:
    """A chat or completion request's detokenization fields (vLLM's)."""
    return DetokenizeOptions(skip_special_tokens=body.skip_special_tokens,
                             spaces_between_special_tokens=body.spaces_between_special_tokens,
                             include_stop_str_in_output=body.include_stop_str_in_output)


class ChoiceText:
    """One choice's text, finish reason and logprobs as its output slices arrive. ``echo``: what the answer
    starts with (echo.py), on its first slice."""

    def __init__(self, detok: IncrementalDetokenizer, renderer: LogprobsRenderer | None,
                 echo: Echo | None = None) -> None:
        self.detok = detok
        self.renderer = renderer
        self.texts: list[str] = []
        self.parts: list[dict] = []
        self.finish = "length"
        self.stopped = False  # a stop string ended it before its worker did
        self._echo = echo
        # SamplingParams.prompt_logprobs: from the first slice that carries them.
        self.prompt_logprobs: tuple[TokenLogprobs, ...] = ()

    def feed(self, out: Tokens, stop_token_ids: tuple[int, ...], stop: tuple[str, ...]) -> tuple[str, dict | None]:
        """The new text (stop strings applied) and logprobs of one slice; kept too for a whole response."""
        if self.stopped:
            return "", None
        if out.prompt_logprobs and not self.prompt_logprobs:
            self.prompt_logprobs = out.prompt_logprobs
        echo, self._echo = self._echo, None
        shown = out.token_ids
        if (out.finish_reason == "stop" and shown and shown[-1] in stop_token_ids
                and not self.detok.options.include_stop_str_in_output):
            shown = shown[:-1]  # a stop id ends the answer unseen, as in vLLM (its logprob stays)
        step = self.detok.feed(shown, stop)
        text = step.text if step.stopped or out.finish_reason is None else step.text + self.detok.flush()
        if step.stopped:
            self.finish, self.stopped = "stop", True
        elif out.finish_reason is not None:
            self.finish = "stop" if out.finish_reason == "stop" else "length"
        part = None
        if echo is not None:
            text = echo.text + text
            if echo.token_ids and self.renderer is not None:  # rendered first: its text offsets come first
                part = self.renderer.render_prompt(echo.token_ids, self.prompt_logprobs)
        if self.renderer is not None and out.logprobs:
            rendered = self.renderer.render(out.logprobs)
            part = rendered if part is None else {k: part[k] + rendered[k] for k in part}
        self.texts.append(text)
        if part is not None:
            self.parts.append(part)
        return text, part

    def result(self) -> tuple[str, str, dict | None]:
        logprobs = None if self.renderer is None else self.renderer.merge(self.parts)
        return "".join(self.texts), self.finish, logprobs
