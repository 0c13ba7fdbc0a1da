"""How exceptions become Temporal failures: the SDK's conversion, with each stack trace cut
to its innermost frames.

The server keeps an activity's last failure (the Web UI's "Last Failure", a retry's
`last_failure`) only up to 4 KiB (`limit.mutableStateActivityFailureSize.error`); past that
it stores "Failure exceeds size limit." in its place. A Python 3.11 traceback through the
SDK's interceptors, ours and a client library is that long on its own, and how long depends
on where the project is installed. The innermost frames say where the error happened; the
outer ones are the SDK's, so those are the frames dropped.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from temporalio.api.failure.v1 import Failure
from temporalio.converter import (
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadConverter,
)

from durable_agent.codecs import KeyNotHeld

STACK_TRACE_CHARS = 1_200
"""The most of one failure's stack trace kept, in whole frames (at least the innermost one)."""


class ShortStackTraces(DefaultFailureConverter):
    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        with innermost_frames(exception):
            super().to_failure(exception, payload_converter, failure)


class ShortStackTracesEncodedButKeyNotHeld(DefaultFailureConverterWithEncodedAttributes):
    """Failure messages and stack traces encrypted, except a worker's own "cannot decrypt: key
    id k1 not held by this worker" (codecs.KeyNotHeld): encrypted with that worker's other key,
    nobody could read why the run does not go on."""

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        with innermost_frames(exception):
            super().to_failure(exception, payload_converter, failure)
        if isinstance(exception, KeyNotHeld):
            failure.ClearField("encoded_attributes")
            failure.message = str(exception)


@contextmanager
def innermost_frames(error: BaseException, budget: int = STACK_TRACE_CHARS) -> Iterator[None]:
    """While converting: each exception in `error`'s chain (the chain the SDK converts) carries
    only the innermost frames whose formatted text fits `budget`; restored afterwards, since the
    exception may live on (a workflow's, re-raised)."""
    originals: list[tuple[BaseException, TracebackType | None]] = []
    for link in _chain(error):
        originals.append((link, link.__traceback__))
        link.__traceback__ = _innermost(link.__traceback__, budget)
    try:
        yield
    finally:
        for link, original in originals:
            link.__traceback__ = original


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)


def _innermost(tb: TracebackType | None, budget: int) -> TracebackType | None:
    entries: list[TracebackType] = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if not entries:
        return None
    kept = entries[-1]
    for entry in reversed(entries[:-1]):
        if len("\n".join(traceback.format_tb(entry))) > budget:
            break
        kept = entry
    return kept
