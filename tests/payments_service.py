"""A tiny real HTTP service a tool depends on: `python -m tests.payments_service PORT LOG`.

Every request it answers is appended to LOG (`METHOD PATH BODY`), so a test counts the
payments and probes it received while up; stopped, its port refuses connections.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    log_path = ""

    def do_GET(self) -> None:
        self._answer("")

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("content-length") or 0)).decode())

    def _answer(self, body: str) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"{self.command} {self.path} {body}\n")
        reply = f"ok {body}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the log file is the record


def main() -> None:
    port, Handler.log_path = int(sys.argv[1]), sys.argv[2]
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
