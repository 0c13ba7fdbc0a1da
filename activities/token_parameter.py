"""The name of the reply's token cap a model takes: `max_tokens`, or `max_completion_tokens`.

The adaptive quota (workflows/quota.py) caps each call's reply. OpenAI's reasoning models
(o1, o3, o4-mini, gpt-5...) reject `max_tokens` with HTTP 400 ("Unsupported parameter:
'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."), and
so do some deployments of other models; servers that predate `max_completion_tokens` (older
vLLM, llama.cpp, Azure API versions) may refuse it in turn. So the worker sends the name the
model's name suggests (`max_completion_tokens` for the o-series and gpt-5, `max_tokens`
otherwise), and on a 400 that rejects that parameter by name it sends the call once more
with the other name, and remembers it for that endpoint and model: each worker pays one
rejected request per endpoint and model, at most.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio import activity

from activities.model_clients import openai_sdk

if TYPE_CHECKING:
    from openai import BadRequestError

MAX_TOKENS = "max_tokens"
MAX_COMPLETION_TOKENS = "max_completion_tokens"
REASONING_MODEL = re.compile(r"(o\d|gpt-5)", re.IGNORECASE)
"""Matched at the start of the model's name (after any `provider/` prefix)."""
REJECTED = re.compile(r"unsupported|unrecognized|not supported|unknown|not permitted|extra", re.IGNORECASE)
"""How a 400 says it does not take a parameter (not that its value is too large)."""

T = TypeVar("T")


def suggested(model: str) -> str:
    return MAX_COMPLETION_TOKENS if REASONING_MODEL.match(model.rsplit("/", 1)[-1]) else MAX_TOKENS


def rejects(error: BadRequestError, name: str) -> bool:
    """The endpoint refused the parameter `name` itself."""
    body = error.body if isinstance(error.body, dict) else {}
    inner = body.get("error", body)
    inner = inner if isinstance(inner, dict) else {}
    message = str(inner.get("message") or error.message)
    if inner.get("param") == name and inner.get("code") == "unsupported_parameter":
        return True
    return name in message and bool(REJECTED.search(message))


class TokenParameters:
    """One worker's knowledge of which name each endpoint and model takes."""

    def __init__(self) -> None:
        self._learned: dict[tuple[str, str], str] = {}

    def name(self, endpoint: str, model: str) -> str:
        return self._learned.get((endpoint, model)) or suggested(model)

    async def send(
        self,
        endpoint: str,
        model: str,
        limit: int | None,
        request: dict[str, Any],
        call: Callable[[dict[str, Any]], Awaitable[T]],
    ) -> T:
        """`call` with the request, its reply capped at `limit` tokens under the name the model
        takes; once more under the other name when the endpoint rejects the first by name."""
        if limit is None:
            return await call(request)
        name = self.name(endpoint, model)
        try:
            return await call({**request, name: limit})
        except openai_sdk().BadRequestError as e:
            if not rejects(e, name):
                raise
        other = MAX_TOKENS if name == MAX_COMPLETION_TOKENS else MAX_COMPLETION_TOKENS
        reply = await call({**request, other: limit})
        self._learned[(endpoint, model)] = other
        activity.logger.info("%s at %s takes %s, not %s: sent from now on", model, endpoint, other, name)
        return reply
