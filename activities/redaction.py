"""Secrets out of everything an activity hands to history or leaves on disk.

Two kinds of secret become `[REDACTED:<what>]`:
* the values of the worker's secret-looking environment variables: names containing KEY,
  TOKEN, SECRET, PASSWORD, PASSWD or CREDENTIAL (any case), plus the names or globs
  listed in `DURABLE_AGENT_SECRET_ENV` (comma-separated); `<what>` is the variable's name.
  Values shorter than `MIN_SECRET_CHARS` are skipped: they would match ordinary text.
* well-known token shapes wherever they come from (`SHAPES`); `<what>` names the shape.

`RedactingInterceptor` applies it to every activity's result and to every error an
activity raises (message, details and the whole cause chain), so the model's replies,
tool outcomes and endpoint errors are redacted before they are encoded for history.
It must be the innermost worker interceptor: anything outside it sees redacted values.
Only text is touched: strings inside the result, never bytes.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

SECRET_ENV_LIST = "DURABLE_AGENT_SECRET_ENV"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MIN_SECRET_CHARS = 8


def _token(prefix: str, width: int, body: str) -> str:
    """`prefix` (`width` chars) then `body`, where the prefix does not start inside a word,
    except right after a JSON escape such as `\\n` (tool-call arguments are JSON text). The
    pattern starts with the literal prefix, which `re` finds fast."""
    before = "." * width
    return rf"{prefix}(?:(?<![A-Za-z0-9_]{before})|(?<=\\[nrt]{before})){body}"


SHAPES: dict[str, tuple[str, str]] = {
    "private-key": (
        "PRIVATE KEY",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:[^-]|-(?!----END ))*(?:-----END [A-Z0-9 ]*PRIVATE KEY-----)?",
    ),
    "openai-key": ("sk-", _token("sk-", 3, r"(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}")),
    "github-token": (
        "gh",
        _token("gh[pousr]_", 4, "[A-Za-z0-9]{30,}") + "|" + _token("github_pat_", 11, "[A-Za-z0-9_]{22,}"),
    ),
    "aws-access-key-id": ("A", _token("(?:AKIA|ASIA)", 4, "[A-Z0-9]{16}(?![A-Za-z0-9])")),
    "slack-token": ("xox", _token("xox[abeoprst]-", 5, "[A-Za-z0-9-]{10,}")),
    "bearer-token": ("earer ", r"(?<=[Bb]earer )[A-Za-z0-9._~+/=-]{16,}"),
}
"""Shape name -> (a substring every match holds, the pattern). The substring is tested
first: far cheaper than the pattern on text that cannot match. An unterminated private-key
block (a cut output) is redacted to the end of the text. An `sk-` key needs a digit:
hyphenated words (`risk-management-...`) are not keys."""
_SHAPES = [(f"[REDACTED:{name}]", hint, re.compile(rx)) for name, (hint, rx) in SHAPES.items()]


class Redactor:
    """Replaces secret values (name -> value) and token shapes in text."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        by_value: dict[str, str] = {}
        for name, value in secrets.items():
            for part in _parts(value):
                by_value.setdefault(part, name)
        self._names = by_value
        longest_first = sorted(by_value, key=len, reverse=True)
        self._values = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None

    def text(self, text: str) -> str:
        if self._values is not None and any(value in text for value in self._names):
            text = self._values.sub(lambda m: f"[REDACTED:{self._names[m.group()]}]", text)
        for label, hint, pattern in _SHAPES:
            if hint in text:
                text = pattern.sub(label, text)
        return text

    def value(self, value: Any) -> Any:
        """A copy with every string inside redacted (models, lists, dicts); bytes and numbers as they are."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, BaseModel):
            changes = {name: self.value(getattr(value, name)) for name in type(value).model_fields}
            return value.model_copy(update=changes)
        if isinstance(value, list | tuple):
            return type(value)(self.value(item) for item in value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        return value

    def error(self, error: BaseException) -> ApplicationError:
        """The error as an ApplicationError of the same type and retry behaviour, every message
        in its cause chain redacted; the traceback (code locations only) is kept."""
        if isinstance(error, ApplicationError):
            redacted = ApplicationError(
                self.text(error.message),
                *self.value(list(error.details)),
                type=error.type,
                non_retryable=error.non_retryable,
                next_retry_delay=error.next_retry_delay,
                category=error.category,
            )
        else:
            # What the SDK would send for it: the class name as the type, retryable.
            redacted = ApplicationError(self.text(str(error)), type=type(error).__name__)
        origin = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
        if origin is not None:
            redacted.__cause__ = self.error(origin)
        return redacted.with_traceback(error.__traceback__)


def _parts(value: str) -> list[str]:
    """The value, and for a list value (`id1:key1,id2:key2`) each part and each key too."""
    parts = [value, *value.split(",")]
    parts += [part.split(":", 1)[1] for part in parts if ":" in part]
    return [part for part in dict.fromkeys(parts) if len(part) >= MIN_SECRET_CHARS]


def secret_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The worker's secret-looking variables: by name pattern, plus `DURABLE_AGENT_SECRET_ENV`."""
    listed = [name.strip() for name in environ.get(SECRET_ENV_LIST, "").split(",") if name.strip()]
    return {
        name: value
        for name, value in environ.items()
        if SECRET_NAME.search(name) or any(fnmatch.fnmatchcase(name, pattern) for pattern in listed)
    }


def worker_redactor() -> Redactor:
    """The redactor for this process's environment as it is now (keyed by the raw environment,
    which is cheaper to compare than to scan for secrets on every activity)."""
    return _redactor(frozenset(os.environ._data.items()))  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=8)
def _redactor(_raw_environment: frozenset[tuple[bytes, bytes]]) -> Redactor:
    return Redactor(dict(sorted(secret_env(os.environ).items())))


class StreamRedactor:
    """Redacts a byte stream written in arbitrary chunks (a command's output on its way to disk).

    Text is released line by line once whole; an open private-key block is held until it
    ends. A line longer than `max_hold` is released in pieces that keep `overlap` bytes
    back, so a token cut by a chunk boundary is still seen whole. Bytes that are not
    UTF-8 pass through unchanged (surrogate escapes).
    """

    def __init__(self, redactor: Redactor, max_hold: int = 1 << 20, overlap: int = 4096) -> None:
        self._redactor = redactor
        self._pending = ""
        self._max_hold = max_hold
        self._overlap = overlap

    def feed(self, data: bytes) -> bytes:
        self._pending += data.decode("utf-8", "surrogateescape")
        cut = self._safe_cut()
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        return self._encode(ready)

    def flush(self) -> bytes:
        ready, self._pending = self._pending, ""
        return self._encode(ready)

    def _safe_cut(self) -> int:
        text = self._pending
        cut = text.rfind("\n") + 1
        block = text.rfind("-----BEGIN ", 0, cut)
        if block >= 0 and "PRIVATE KEY-----" in text[block : block + 80] and "-----END " not in text[block:cut]:
            cut = block  # a key block still arriving
        if len(text) - cut <= self._max_hold:
            return cut
        cut = len(text) - self._overlap
        spanning = [m.start() for _, _, rx in _SHAPES for m in rx.finditer(text) if m.start() < cut < m.end()]
        return min(spanning, default=cut)

    def _encode(self, text: str) -> bytes:
        return self._redactor.text(text).encode("utf-8", "surrogateescape") if text else b""


# --- the worker interceptor ------------------------------------------------------------


class RedactingInterceptor(Interceptor):
    """Redacts every activity's result and raised error (see the module docstring)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _RedactingActivityInbound(next)


class _RedactingActivityInbound(ActivityInboundInterceptor):
    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        super().init(_RedactingActivityOutbound(outbound))

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            result = await super().execute_activity(input)
        except CancelledError:  # the SDK reads cancellation from its type
            raise
        except Exception as e:
            redacted = worker_redactor().error(e)
            raise redacted from redacted.__cause__
        return worker_redactor().value(result)


class _RedactingActivityOutbound(ActivityOutboundInterceptor):
    """Heartbeat details reach the server, `durable-agent run`'s live view and, on a timeout, history."""

    def heartbeat(self, *details: Any) -> None:
        super().heartbeat(*worker_redactor().value(details))
