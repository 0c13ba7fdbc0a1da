"""How exceptions become Temporal failures: the SDK's conversion, with each Python stack trace
cut to its innermost frames.

The server keeps an activity's last failure (the Web UI's "Last Failure", a retry's
`last_failure`) only up to 4 KiB (`limit.mutableStateActivityFailureSize.error`); past that
it stores "Failure exceeds size limit." in its place. A Python 3.11 traceback through the
SDK's interceptors, ours and a client library is that long on its own, and how long depends
on where the project is installed. The innermost frames say where the error happened; the
outer ones are the SDK's, so those are the frames dropped.

The cut works on the text the SDK made, never on the exception: an exception may refuse
attribute assignment (a frozen dataclass), be converted again, or live on.
"""

from __future__ import annotations

import re

from temporalio.api.failure.v1 import Failure
from temporalio.converter import (
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadConverter,
)

from durable_agent.codecs import KeyNotHeld

STACK_TRACE_CHARS = 1_200
"""The most of one failure's stack trace kept: whole frames, innermost first (the innermost
one cut to this length if it alone is longer)."""

_FRAME = re.compile(r'^  File "', re.MULTILINE)
"""Where each frame of `traceback.format_tb`'s text begins."""


class ShortStackTraces(DefaultFailureConverter):
    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        # The SDK converts each cause through this method too: each level cuts its own trace.
        super().to_failure(exception, payload_converter, failure)
        failure.stack_trace = innermost(failure.stack_trace)


class ShortStackTracesEncodedButKeyNotHeld(DefaultFailureConverterWithEncodedAttributes):
    """Failure messages and stack traces encrypted, except a worker's own "cannot decrypt: key
    id k1 not held by this worker" (codecs.KeyNotHeld): encrypted with that worker's other key,
    nobody could read why the run does not go on."""

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        super().to_failure(exception, payload_converter, failure)
        if isinstance(exception, KeyNotHeld):
            failure.ClearField("encoded_attributes")
            failure.message = str(exception)
        elif failure.HasField("encoded_attributes"):
            _cut_encoded(failure, payload_converter)


def innermost(stack_trace: str, budget: int = STACK_TRACE_CHARS) -> str:
    """`stack_trace` (a Python traceback's text) with only its innermost frames that fit
    `budget`; text of another form is kept as it is."""
    if len(stack_trace) <= budget:
        return stack_trace
    starts = [match.start() for match in _FRAME.finditer(stack_trace)]
    if not starts:
        return stack_trace
    kept = starts[-1]  # the innermost frame, whatever its length
    for start in reversed(starts[:-1]):
        if len(stack_trace) - start > budget:
            break
        kept = start
    return stack_trace[kept : kept + budget]


def _cut_encoded(failure: Failure, payload_converter: PayloadConverter) -> None:
    """The stack trace inside the encoded attributes (still plain JSON: the codec runs after
    this converter) cut as `innermost` cuts it."""
    [attributes] = payload_converter.from_payloads([failure.encoded_attributes])
    if not isinstance(attributes, dict) or not isinstance(attributes.get("stack_trace"), str):
        return
    cut = innermost(attributes["stack_trace"])
    if cut != attributes["stack_trace"]:
        [payload] = payload_converter.to_payloads([{**attributes, "stack_trace": cut}])
        failure.encoded_attributes.CopyFrom(payload)
