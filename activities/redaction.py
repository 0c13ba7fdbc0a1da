"""Secrets out of everything an activity hands to history or leaves on disk.

Two kinds of secret become `[REDACTED:<what>]`:
* the values of the worker's secret-looking environment variables: names containing KEY,
  TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL, DSN or DATABASE_URL (any case), plus the
  names or globs listed in `DURABLE_AGENT_SECRET_ENV` (comma-separated); `<what>` is the
  variable's name. Each value is also caught in its common encodings (`encodings`): base64
  and base64url at any alignment, hex (either case, bytes apart or not, across lines, as
  `xxd -p`, `od -tx1` or `hexdump -v -e '/1 "%02x "'` print it) and reversed. Values shorter than
  `MIN_SECRET_CHARS` are skipped: they would match ordinary text.
* well-known token shapes wherever they come from (`SHAPES`), among them the
  `user:password` of any `scheme://user:password@host` URL; `<what>` names the shape.

`RedactingInterceptor` applies it to every activity's result and to every error an
activity raises (message, details and the whole cause chain), so the model's replies,
tool outcomes and endpoint errors are redacted before they are encoded for history.
It must be the innermost worker interceptor: anything outside it sees redacted values.
Only text is touched: strings inside the result, never bytes.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import os
import re
import string
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
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|DSN|DATABASE_URL", re.IGNORECASE)
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
    "url-credentials": ("://", r"(?P<kept>://)[^\s/@:\"'<>]+:[^\s/@\"'<>]+(?=@)"),
}
"""Shape name -> (a substring every match holds, the pattern). The substring is tested
first: far cheaper than the pattern on text that cannot match. An unterminated private-key
block (a cut output) is redacted to the end of the text. An `sk-` key needs a digit:
hyphenated words (`risk-management-...`) are not keys. A `kept` group stays in the text
(`://` of a URL: a pattern that starts with a literal is found fast, a look-behind is not)."""
_SHAPES = [
    (rf"\g<kept>[REDACTED:{name}]" if "(?P<kept>" in rx else f"[REDACTED:{name}]", hint, re.compile(rx))
    for name, (hint, rx) in SHAPES.items()
]


class Redactor:
    """Replaces secret values (name -> value), their encodings and token shapes in text."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        by_value: dict[str, str] = {}
        self._raw: dict[bytes, str] = {}
        for name, value in secrets.items():
            for part in _parts(value):
                for variant in [part, *encodings(part)]:
                    by_value.setdefault(variant, name)
                self._raw.setdefault(part.encode(), name)
        self._names = by_value
        self.longest = max(map(len, by_value), default=0)
        longest_first = sorted(by_value, key=len, reverse=True)
        self._values = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None

    def text(self, text: str) -> str:
        if self._values is not None and any(value in text for value in self._names):
            text = self._values.sub(lambda m: f"[REDACTED:{self._names[m.group()]}]", text)
        if self._raw and _may_hold_hex(text):
            text = _HEX_RUN.sub(self._hex_run, text)
        for label, hint, pattern in _SHAPES:
            if hint in text:
                text = pattern.sub(label, text)
        return text

    def _hex_run(self, match: re.Match[str]) -> str:
        """A run of hex bytes (`_HEX_RUN`) whole, or its label when it encodes a secret value."""
        digits = _HEX_NOISE.sub("", match.group())
        decoded = [bytes.fromhex(digits[start : start + (len(digits) - start) // 2 * 2]) for start in (0, 1)]
        names = [name for raw, name in self._raw.items() if any(raw in run for run in decoded)]
        return f"[REDACTED:{names[0]}]" if names else match.group()

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where in `text` a secret value, an encoding of one or a token shape may lie."""
        patterns = [p for p in (self._values, _HEX_RUN if self._raw else None) if p is not None]
        return [m.span() for pattern in [*patterns, *(rx for _, _, rx in _SHAPES)] for m in pattern.finditer(text)]

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


def encodings(value: str) -> list[str]:
    """How a command commonly prints `value` in other words: base64 and base64url at each of
    the three alignments it can have inside a longer encoded text (only the characters that
    do not depend on the bytes around it), and reversed. Hex is decoded instead (`_HEX_RUN`)."""
    raw = value.encode()
    found = [value[::-1]]
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        stable = encoded[4 if offset else 0 : (offset + len(raw)) // 3 * 4]
        found += [stable, stable.replace("+", "-").replace("/", "_")]
    return [variant for variant in dict.fromkeys(found) if len(variant) >= MIN_SECRET_CHARS and variant != value]


_HEX_BYTES = MIN_SECRET_CHARS - 1
_HEX_RUN = re.compile(rf"[0-9a-fA-F]{{2}}(?:(?:\s*\n[0-7]{{7}}\b)?[ \t\n]*[0-9a-fA-F]{{2}}){{{_HEX_BYTES},}}")
"""At least MIN_SECRET_CHARS bytes in hex, apart or not, across lines, with the octal
address `od` starts each line with."""
_HEX_NOISE = re.compile(r"\n[0-7]{7}\b|\s")
_AS_HEX = str.maketrans(dict.fromkeys(string.hexdigits, "h"))


def _may_hold_hex(text: str) -> bool:
    """A cheap test before `_HEX_RUN`, which scanning costs 0.2 ms per KiB of ordinary text."""
    classes = text.translate(_AS_HEX)
    return "hhhhhhhh" in classes or "hh hh hh hh" in classes


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
        # Longer than any known value, even in hex as `od` prints it (about 3.5 characters a
        # byte): a value not yet whole at the cut then lies wholly after it, held back.
        self._overlap = max(overlap, 4 * redactor.longest + 64)

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
        cut = max(len(text) - self._overlap, 0)
        spanning = [start for start, end in self._redactor.spans(text) if start < cut < end]
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
