"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol on a pipe.

A page is read once it shows what a test waits for: its DOM is polled until it holds the
expected string or a deadline passes, so a slow machine waits longer instead of failing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]


class Browser:
    """One Chromium process; `page_showing` opens a tab and waits for a string in its DOM."""

    def __init__(self) -> None:
        assert CHROMIUM is not None, "chromium is not installed"
        self._profile = tempfile.mkdtemp(prefix="durable-agent-chromium-")
        commands, self._commands = os.pipe()
        self._replies, replies = os.pipe()
        # The protocol reads commands on fd 3 and writes replies on fd 4, NUL-terminated JSON.
        launch = f'exec "$@" 3<&{commands} 4>&{replies}'
        self._process = subprocess.Popen(
            ["bash", "-c", launch, "chromium", CHROMIUM, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            pass_fds=(commands, replies),
            start_new_session=True,
            # Its own temporary files (org.chromium.Chromium.*) go with the profile at close.
            env={**os.environ, "TMPDIR": self._profile},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(commands)
        os.close(replies)
        self._ids = itertools.count(1)
        self._buffer = b""

    def _call(self, method: str, params: dict[str, Any], session: str | None = None) -> dict[str, Any]:
        message_id = next(self._ids)
        message = {"id": message_id, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._replies, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium exited during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _wait_for_text(self, url: str, texts: tuple[str, ...], timeout_s: float) -> str:
        target = self._call("Target.createTarget", {"url": url})["targetId"]
        session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        read = {"expression": "document.documentElement.outerHTML", "returnByValue": True}
        deadline = time.monotonic() + timeout_s
        while True:
            shown = self._call("Runtime.evaluate", read, session)["result"].get("value", "")
            missing = [text for text in texts if text not in shown]
            if not missing or time.monotonic() > deadline:
                self._call("Target.closeTarget", {"targetId": target})
                if missing:
                    raise AssertionError(
                        f"{url} did not show {missing!r} in {timeout_s} s; it showed:\n{shown[-2000:]}"
                    )
                return shown
            time.sleep(0.2)

    async def page_showing(self, url: str, *texts: str, timeout_s: float = 60) -> str:
        """The page's DOM once it shows every one of `texts` (its scripts have run and fetched
        their data; parts of the page fetch theirs separately)."""
        return await asyncio.to_thread(self._wait_for_text, url, texts, timeout_s)

    def close(self) -> None:
        # The whole group: Chromium's helper processes outlive its main one and would write
        # into the profile after it is removed.
        os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self._process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        os.close(self._commands)
        os.close(self._replies)
        shutil.rmtree(self._profile, ignore_errors=True)
