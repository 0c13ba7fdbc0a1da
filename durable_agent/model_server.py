"""A small OpenAI-compatible chat-completions server, driven by a Python function.

The offline demo model and the tests' scripted stub both sit on it: the function gets
the decoded request and returns a `Reply` (text and/or tool calls, with usage) or a
`Failure` (an HTTP error with headers). It speaks just enough of the API for the real
`openai` SDK: `POST /v1/chat/completions` (and without `/v1`), whole or streamed (`"stream":
true`: server-sent `data:` events, one per few characters, the usage in a last chunk when
`stream_options.include_usage` asks for it, then `data: [DONE]`), `GET /v1/models`.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workflows.compaction import SUMMARY_PROMPT, folded_through
from workflows.done import JUDGE_PROMPT


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    """(tool name, arguments); a str is sent as raw argument text, malformed or not."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    call_ids: list[str] | None = None
    """The tool calls' ids as sent; by default unique ones (`call_<turn>_<index>`)."""
    cut_after_chunks: int | None = None
    """Streamed, the connection is dropped after this many events, mid-reply."""
    no_usage: bool = False
    """The reply carries no usage, whole or streamed (as some vLLM and llama.cpp setups send)."""


@dataclass
class Failure:
    status: int
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Stream:
    """A streamed reply's events, as the handler writes them."""

    chunks: list[dict[str, Any]]
    interval_s: float = 0.0
    cut_after: int | None = None
    end_delay_s: float = 0.0


Responder = Callable[[dict[str, Any]], "Reply | Failure"]
STREAM_CHUNK_CHARS = 4
"""About a token: what OpenAI and vLLM send per event."""
MAX_STREAM_CHUNKS = 1_000
REASONING_MODEL = re.compile(r"(o\d|gpt-5)")
"""OpenAI's models that take `max_completion_tokens` only (o1, o3, o4-mini, gpt-5...)."""
MAX_TOKENS_REFUSED = {
    "message": (
        "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
    ),
    "type": "invalid_request_error",
    "param": "max_tokens",
    "code": "unsupported_parameter",
}
"""The real API's answer (HTTP 400) to `max_tokens` for such a model."""
MAX_COMPLETION_TOKENS_REFUSED = {
    "message": "Unrecognized request argument supplied: max_completion_tokens",
    "type": "invalid_request_error",
    "param": None,
    "code": None,
}
"""What servers that predate `max_completion_tokens` answer (older Azure OpenAI API versions)."""
"""A longer reply is sent in longer pieces, so a 3 MB hostile reply stays cheap to serve."""


def count_assistant_turns(request: dict[str, Any]) -> int:
    """The conversation's turn number: a retried call sees the same one, so replies repeat.
    Folded steps count too (one model reply each), as the summary's index names them."""
    messages = request.get("messages", [])
    folded = max((folded_through(m.get("content") or "") for m in messages if m.get("role") == "user"), default=0)
    return folded + sum(1 for m in messages if m.get("role") == "assistant")


def is_summary_request(request: dict[str, Any]) -> bool:
    """A compaction's summarising call (workflows/compaction.py), not an agent turn."""
    messages = request.get("messages") or [{}]
    return messages[0].get("role") == "system" and (messages[0].get("content") or "") == SUMMARY_PROMPT


def stub_summary(request: dict[str, Any]) -> Reply:
    """The stub's answer to a summarising call: the five fields, from the steps it was sent."""
    body = json.loads(request["messages"][1]["content"])
    summary = body.get("previous_summary") or {
        "goal": body.get("goal", ""),
        "inputs": [],
        "outputs": [],
        "key_decisions": [],
        "open_issues": [],
    }
    for step in body.get("new_steps", []):
        for call in step.get("tool_calls", []):
            summary["outputs"].append(f"step {step['step']}: {call['name']} {call['arguments']}"[:200])
        content = step.get("content") or ""
        if step["role"] == "tool" and content.startswith("ERROR"):
            summary["open_issues"].append(f"step {step['step']}: {content[:200]}")
        elif step["role"] == "assistant" and content:
            summary["key_decisions"].append(f"step {step['step']}: {content[:200]}")
    return Reply(content=json.dumps(summary))


def is_judge_request(request: dict[str, Any]) -> bool:
    """A check of the success criteria (workflows/done.py), not an agent turn."""
    messages = request.get("messages") or [{}]
    return messages[0].get("role") == "system" and (messages[0].get("content") or "") == JUDGE_PROMPT


def stub_judge(request: dict[str, Any]) -> Reply:
    """The stub's judge: every criterion met (a test scripts its own judge to say otherwise)."""
    body = json.loads(request["messages"][1]["content"])
    verdicts = [{"index": c["index"], "met": True, "evidence": "stub judge"} for c in body["criteria"]]
    return Reply(content=json.dumps({"criteria": verdicts}))


class ModelServer:
    """Serves `responder` on 127.0.0.1 in a background thread; records every request."""

    def __init__(
        self,
        responder: Responder,
        port: int = 0,
        latency_s: float = 0.0,
        summarizer: Responder = stub_summary,
        model_name: str | None = None,
        judge: Responder = stub_judge,
    ) -> None:
        self.responder = responder
        self.summarizer = summarizer
        """Answers compactions' summarising calls, which `responder` never sees."""
        self.judge = judge
        """Answers the checks of success criteria, which `responder` never sees either."""
        self.latency_s = latency_s
        self.model_name = model_name
        """The model every reply and `GET /v1/models` name; None echoes the request's."""
        self.stream_interval_s = 0.0
        """Streamed replies: the wait between two events, so a test can watch progress."""
        self.stream_usage = True
        """Streamed replies: False ignores `stream_options`, like some servers do."""
        self.streams = True
        """False answers a streamed request with a whole reply, as servers that ignore `stream` do."""
        self.stream_end_delay_s = 0.0
        """Streamed replies: how long the body stays open after the end marker."""
        self.requests: list[dict[str, Any]] = []
        self.completion_tokens_only: set[str] = set()
        """Models beside the o-series and gpt-5 that refuse `max_tokens`, as some deployments do."""
        self.max_tokens_only: set[str] = set()
        """Models that refuse `max_completion_tokens`, as servers that predate it do."""
        self.down = False
        """An outage: every request (completions and `GET /models`) is answered HTTP 503 and counted."""
        self.refused: dict[str, int] = {"POST": 0, "GET": 0}
        """Requests answered while `down`, by method: calls that reached a down endpoint, and probes."""
        self.refused_log: list[tuple[float, str, str]] = []
        """The same, each as (monotonic time, method, path): workers given base URLs of their
        own (any prefix before `/chat/completions` works) are told apart by the path."""
        self.connections = 0
        """TCP connections accepted so far: a client that reuses its connections opens few."""
        self.open_connections = 0
        """Of those, the ones not closed yet."""
        self._lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="model-server", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def respond(self, request: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any] | Stream]:
        with self._lock:
            self.requests.append(request)
        if self.latency_s:
            time.sleep(self.latency_s)
        if (refusal := self._token_cap_refusal(request)) is not None:
            return 400, {}, {"error": refusal}
        outcome = self._responder_for(request)(request)
        if isinstance(outcome, Failure):
            body = {"error": {"message": outcome.message, "type": "scripted", "code": outcome.status}}
            return outcome.status, outcome.headers, body
        body = completion_body(request, outcome, self.model_name)
        if not (request.get("stream") and self.streams):
            return 200, {}, body
        usage = self.stream_usage and bool((request.get("stream_options") or {}).get("include_usage"))
        chunks = completion_chunks(body, usage)
        return 200, {}, Stream(chunks, self.stream_interval_s, outcome.cut_after_chunks, self.stream_end_delay_s)

    def _token_cap_refusal(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The real API's 400 for a reply's token cap under a name the model does not take."""
        model = str(request.get("model", ""))
        if "max_tokens" in request and (REASONING_MODEL.match(model) or model in self.completion_tokens_only):
            return MAX_TOKENS_REFUSED
        if "max_completion_tokens" in request and model in self.max_tokens_only:
            return MAX_COMPLETION_TOKENS_REFUSED
        return None

    def _responder_for(self, request: dict[str, Any]) -> Responder:
        if is_summary_request(request):
            return self.summarizer
        return self.judge if is_judge_request(request) else self.responder


def completion_body(request: dict[str, Any], reply: Reply, model_name: str | None = None) -> dict[str, Any]:
    prompt_chars = len(json.dumps(request.get("messages", [])))
    ids = reply.call_ids or [f"call_{count_assistant_turns(request)}_{i}" for i in range(len(reply.tool_calls))]
    calls = [
        {
            "id": ids[i],
            "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
        }
        for i, (name, args) in enumerate(reply.tool_calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if calls:
        message["tool_calls"] = calls
    input_tokens = reply.input_tokens if reply.input_tokens is not None else prompt_chars // 4
    output_tokens = (
        reply.output_tokens
        if reply.output_tokens is not None
        else (len(reply.content or "") + sum(len(c["function"]["arguments"]) for c in calls)) // 4 + 1
    )
    body = {
        "id": f"chatcmpl-{count_assistant_turns(request)}",
        "object": "chat.completion",
        "created": 0,
        "model": model_name or request.get("model", "stub"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
    }
    if not reply.no_usage:
        body["usage"] = {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
    return body


def completion_chunks(body: dict[str, Any], usage: bool) -> list[dict[str, Any]]:
    """`body` (a whole completion) as the events of a streamed one, split the way OpenAI
    splits it: a role event, content fragments, per tool call an event with its id and name
    then argument fragments, a finish event, and the usage (when asked) in an event of its own."""
    choice = body["choices"][0]
    message = choice["message"]
    content = message["content"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": "" if content is not None else None}]
    deltas += [{"content": piece} for piece in _pieces(content or "")]
    for index, call in enumerate(message.get("tool_calls", [])):
        function = call["function"]
        first = {"index": index, "id": call["id"], "type": "function", "function": {"name": function["name"]}}
        first["function"]["arguments"] = ""
        deltas.append({"tool_calls": [first]})
        deltas += [
            {"tool_calls": [{"index": index, "function": {"arguments": p}}]} for p in _pieces(function["arguments"])
        ]
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    if usage and "usage" in body:
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    return chunks


def _pieces(text: str) -> list[str]:
    size = max(STREAM_CHUNK_CHARS, -(-len(text) // MAX_STREAM_CHUNKS))
    return [text[i : i + size] for i in range(0, len(text), size)]


class _QuietServer(ThreadingHTTPServer):
    request_queue_size = 512
    """http.server listens with a backlog of 5: 50 agents connecting at once would see
    dropped SYNs (a 1 s retransmit) or resets."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-request is a worker that was killed: expected in the
        # demo, the crash tests and the chaos runs, and nothing the stub must report.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _handler_for(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        """A response goes out in several writes; with Nagle's algorithm on, a write after an
        unacknowledged one waits for the client's delayed ACK (40 ms). Servers set TCP_NODELAY."""

        def setup(self) -> None:  # once per connection
            super().setup()
            with server._lock:
                server.connections += 1
                server.open_connections += 1

        def finish(self) -> None:  # once per connection, when it closes
            with server._lock:
                server.open_connections -= 1
            super().finish()

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            if self._refused():
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {}, {"error": {"message": f"no route {self.path}"}})
                return
            length = int(self.headers.get("content-length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._send(400, {}, {"error": {"message": "request body is not JSON"}})
                return
            status, headers, body = server.respond(request)
            if isinstance(body, Stream):
                self._stream(body)
            else:
                self._send(status, headers, body)

        def do_GET(self) -> None:  # noqa: N802
            if self._refused():
                return
            model = {"id": server.model_name or "stub", "object": "model", "created": 0, "owned_by": "durable-agent"}
            self._send(200, {}, {"object": "list", "data": [model]})

        def _refused(self) -> bool:
            if not server.down:
                return False
            with server._lock:
                server.refused[self.command] = server.refused.get(self.command, 0) + 1
                server.refused_log.append((time.monotonic(), self.command, self.path))
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self._send(503, {}, {"error": {"message": "the model endpoint is down (scripted outage)"}})
            return True

        def _send(self, status: int, headers: dict[str, str], body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, stream: Stream) -> None:
            """Server-sent events in chunked transfer encoding; a cut leaves the body unfinished."""
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            events = [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in stream.chunks]
            events.append(b"data: [DONE]\n\n")
            chunks = [
                b"%x\r\n%s\r\n" % (len(event), event) for event in events
            ]  # an HTTP chunk each, as servers send them
            cut = stream.cut_after is not None
            chunks = chunks[: stream.cut_after] if cut else chunks
            if stream.interval_s:  # a cut reply too comes at the pace asked, up to its cut
                for chunk in chunks:
                    self.wfile.write(chunk)
                    time.sleep(stream.interval_s)
            else:
                self.wfile.write(b"".join(chunks))
            if cut:
                self.close_connection = True
                return
            if stream.end_delay_s:
                self.wfile.flush()
                time.sleep(stream.end_delay_s)
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the CLI and tests print what matters

    return Handler
