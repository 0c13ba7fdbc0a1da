"""A failure's stack trace keeps its innermost frames, so an activity's last failure stays under
the 4 KiB the server keeps (durable_agent/failures.py). The end-to-end witness is
tests/test_model_stream.py::test_a_stream_cut_mid_reply_is_retried, whose pending call shows the
reason, not "Failure exceeds size limit."."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import traceback

from temporalio.api.failure.v1 import Failure
from temporalio.exceptions import ApplicationError

from durable_agent.codecs import EncryptionKeys
from durable_agent.connection import data_converter
from durable_agent.failures import STACK_TRACE_CHARS, innermost

DEPTH = 60


def _deep(depth: int) -> None:
    """Two functions in turn: a traceback collapses a run of the same frame."""
    if depth:
        _deeper(depth - 1)
        return
    try:
        raise ConnectionError("peer closed connection " + "x" * 100)
    except ConnectionError as e:
        raise ApplicationError("the model's streamed reply broke off", type="ModelStreamBroken") from e


def _deeper(depth: int) -> None:
    _deep(depth)


def _raised() -> ApplicationError:
    try:
        _deep(DEPTH)
    except ApplicationError as e:
        return e
    raise AssertionError("not raised")


def test_each_failure_in_the_chain_keeps_its_innermost_frames_and_the_exception_is_untouched() -> None:
    error = _raised()
    frames_before = len(traceback.extract_tb(error.__traceback__))
    assert len("\n".join(traceback.format_tb(error.__traceback__))) > 4 * 1024
    failure = Failure()
    data_converter().failure_converter.to_failure(error, data_converter().payload_converter, failure)
    assert failure.message == "the model's streamed reply broke off"
    assert 0 < len(failure.stack_trace) <= STACK_TRACE_CHARS
    assert "raise ApplicationError" in failure.stack_trace  # where it was raised, the innermost frame
    assert failure.cause.message.startswith("peer closed connection")
    assert 0 < len(failure.cause.stack_trace) <= STACK_TRACE_CHARS
    assert failure.ByteSize() < 2 * 1024  # the server's warning size; 4 KiB is its limit
    # The exception itself keeps its whole traceback: a workflow's may be raised again.
    assert len(traceback.extract_tb(error.__traceback__)) == frames_before


def test_an_encrypted_failure_keeps_its_innermost_frames_inside_the_encoded_attributes() -> None:
    converter = data_converter(EncryptionKeys.parse(f"k1:{base64.b64encode(os.urandom(32)).decode()}"))
    failure = Failure()
    converter.failure_converter.to_failure(_raised(), converter.payload_converter, failure)
    assert failure.message == "Encoded failure" and not failure.stack_trace
    attributes = json.loads(failure.encoded_attributes.data)
    assert 0 < len(attributes["stack_trace"]) <= STACK_TRACE_CHARS
    assert "raise ApplicationError" in attributes["stack_trace"]


def test_the_innermost_frame_is_kept_even_past_the_budget_and_cut_to_it() -> None:
    text = "\n".join(traceback.format_tb(_raised().__traceback__))
    assert innermost(text, budget=40) == text[text.rindex('  File "') :][:40]
    kept = innermost(text, budget=150)
    assert kept.startswith('  File "') and kept.count('  File "') == 1 and len(kept) <= 150
    java = "java.lang.Error\n\tat A.b(A.java:1)\n" * 100
    assert innermost(java) == java  # not a Python traceback: kept as it is


def test_exceptions_that_refuse_assignment_or_recurse_deeply_convert_like_any_other() -> None:
    @dataclasses.dataclass(frozen=True)
    class Frozen(Exception):
        code: int = 1

    def deep(n: int) -> None:
        deep(n + 1)

    try:
        try:
            deep(0)
        except RecursionError:
            raise ApplicationError("gave up", type="Deep", non_retryable=True) from Frozen(3)
    except ApplicationError as e:
        error = e
    failure = Failure()
    data_converter().failure_converter.to_failure(error, data_converter().payload_converter, failure)
    assert failure.application_failure_info.non_retryable and failure.cause.message == "3"
    recursion = Failure()
    data_converter().failure_converter.to_failure(error.__context__, data_converter().payload_converter, recursion)
    assert recursion.message.startswith("maximum recursion depth") and len(recursion.stack_trace) <= STACK_TRACE_CHARS
