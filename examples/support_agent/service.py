"""The shop's order service, as small as an example allows: orders to look up, refunds to make.

    GET  /orders/<id>   -> {"id", "status", "total", "refunded"}
    POST /refunds       {"order_id", "amount"} with an Idempotency-Key header -> {"refund_id", ...}

A refund repeated with the same key returns the first one: what a real payment API does, and
what an `idempotent` tool relies on. `python -m examples.support_agent.service --port 8765`.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ORDERS: dict[str, dict[str, Any]] = {
    "A100": {"id": "A100", "status": "delivered", "total": 42.0, "refunded": 0.0},
    "A200": {"id": "A200", "status": "in transit", "total": 15.5, "refunded": 0.0},
}


class Shop:
    def __init__(self) -> None:
        self.orders = {k: dict(v) for k, v in ORDERS.items()}
        self.refunds: dict[str, dict[str, Any]] = {}
        """By idempotency key."""
        self.lock = threading.Lock()

    def refund(self, key: str, order_id: str, amount: float) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if key in self.refunds:
                return 200, self.refunds[key]
            order = self.orders.get(order_id)
            if order is None:
                return 404, {"error": f"no order {order_id}"}
            if order["refunded"] + amount > order["total"]:
                return 409, {"error": f"refund of {amount} exceeds what is left of {order['total']}"}
            order["refunded"] += amount
            refund = {"refund_id": f"R{len(self.refunds) + 1}", "order_id": order_id, "amount": amount}
            self.refunds[key] = refund
            return 201, refund


def serve(shop: Shop, port: int = 0) -> ThreadingHTTPServer:
    """Serve `shop` on 127.0.0.1:`port` (0: any free port) from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            order = shop.orders.get(self.path.removeprefix("/orders/"))
            self._answer(200 if order else 404, order or {"error": "no such order"})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            key = self.headers.get("Idempotency-Key")
            if self.path != "/refunds" or not key:
                self._answer(400, {"error": "POST /refunds with an Idempotency-Key header"})
                return
            self._answer(*shop.refund(key, body["order_id"], float(body["amount"])))

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    port = parser.parse_args().port
    serve(Shop(), port)
    print(f"order service on http://127.0.0.1:{port}", flush=True)
    threading.Event().wait()
