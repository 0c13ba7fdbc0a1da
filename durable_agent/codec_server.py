"""Temporal's remote codec protocol over HTTP, so the Temporal CLI and the Web UI show payloads in clear.

`POST /encode` and `POST /decode` take and return `{"payloads": [...]}` (Temporal's
`Payloads` in protobuf JSON) and run them through this process's codec
(durable_agent/codecs.py, keys from `DURABLE_AGENT_ENCRYPTION_KEY`). Browsers may call
it from the allowed origins (the Web UI's); with a token set, every request must carry
`Authorization: Bearer <token>`. Anyone who can reach it can decrypt: it listens on
127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from durable_agent.codecs import CodecError, PayloadCodecChain

TOKEN_ENV = "DURABLE_AGENT_CODEC_TOKEN"
ALLOWED_HEADERS = "Content-Type, X-Namespace, Authorization"
MAX_BODY_BYTES = 64 * 2**20
SOCKET_TIMEOUT_S = 30
"""A client that stops sending (or never sends its body) frees its thread after this."""


def ui_origins(ui_port: int) -> list[str]:
    return [f"http://localhost:{ui_port}", f"http://127.0.0.1:{ui_port}"]


class CodecServer:
    """Serves the codec on `host:port` (0: any free port) from a background thread."""

    def __init__(
        self,
        codec: PayloadCodecChain,
        port: int = 0,
        host: str = "127.0.0.1",
        origins: Iterable[str] = (),
        token: str | None = None,
    ) -> None:
        self.codec = codec
        self.origins = frozenset(origins)
        self.token = token or None
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="codec-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> CodecServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> CodecServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        return hmac.compare_digest((header or "").encode(), f"Bearer {self.token}".encode())

    def transform(self, route: str, body: bytes) -> dict[str, Any]:
        payloads = json_format.Parse(body, Payloads())
        if route == "encode":
            done = self.codec.encode_all(payloads.payloads)
        else:
            done = self.codec.decode_all(payloads.payloads)
        return json_format.MessageToDict(Payloads(payloads=done))


def _handler_for(server: CodecServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = SOCKET_TIMEOUT_S

        def do_OPTIONS(self) -> None:  # noqa: N802 (http.server's naming): a browser's CORS preflight
            self._send(204, None)

        def do_POST(self) -> None:  # noqa: N802
            # Route, token and declared length are checked before a byte of the body is read:
            # a client that fails them is answered and the connection closed, its body unread.
            route = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
            length = _declared_length(self.headers.get("content-length"))
            if route not in ("encode", "decode"):
                self._refuse(404, f"no route {self.path}: POST /encode or /decode")
            elif not server.authorized(self.headers.get("authorization")):
                self._refuse(401, "this codec server needs Authorization: Bearer <token>")
            elif length is None:
                self._refuse(400, "a request body needs a Content-Length of 0 or more bytes")
            elif length > MAX_BODY_BYTES:
                self._refuse(413, f"request body over {MAX_BODY_BYTES:,} bytes")
            else:
                body = self.rfile.read(length)
                try:
                    self._send(200, server.transform(route, body))
                except (CodecError, json_format.ParseError) as e:
                    self._send(400, {"message": str(e)})

        def _refuse(self, status: int, message: str) -> None:
            self.close_connection = True  # the body, if any, is still unread
            self._send(status, {"message": message})

        def _send(self, status: int, body: dict[str, Any] | None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            origin = self.headers.get("origin")
            if origin in server.origins:
                self.send_header("access-control-allow-origin", origin)
                self.send_header("access-control-allow-methods", "POST, OPTIONS")
                self.send_header("access-control-allow-headers", ALLOWED_HEADERS)
                self.send_header("access-control-allow-credentials", "true")
                self.send_header("vary", "Origin")
            if body is not None:
                self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _declared_length(header: str | None) -> int | None:
    """The Content-Length, or None when missing, negative or not a number."""
    if header is None or not header.strip().isdigit():
        return None
    return int(header)
