"""Another team's worker: plain Temporal, no durable-agent code, serving `open_ticket` on its
own task queue; a run names it in `activity_tools`.

    python -m tests.ticket_worker ADDRESS TASK_QUEUE LEDGER
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

LEDGER = sys.argv[3] if len(sys.argv) > 3 else "/dev/null"


@activity.defn(name="open_ticket")
async def open_ticket(call: dict) -> dict:
    """Receives the call as durable-agent sends it (`ToolCallInput`), answers `{"ok", "output"}`."""
    arguments = call["arguments"]
    with open(LEDGER, "a") as f:
        f.write(json.dumps({"key": call["idempotency_key"], **arguments}) + "\n")
    # A token shape, and a password both teams' workers hold (their shared database's).
    shared = os.environ.get("SHOP_DB_PASSWORD", "")
    return {"ok": True, "output": f"ticket opened: {arguments['title']} (token sk-{'a1' * 20}) db {shared}"}


async def main(address: str, queue: str) -> None:
    client = await Client.connect(address)
    async with Worker(client, task_queue=queue, activities=[open_ticket]):
        print("serving open_ticket", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
