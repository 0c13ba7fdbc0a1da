"""Encrypted history: the codec, key rotation, and what is left in clear where.

Judged by bytes: the payloads' bytes, the server's SQLite files, what the Temporal CLI and
the Web UI (headless Chromium) print, never by the codec's own words.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client

from durable_agent.codec_server import CodecServer
from durable_agent.codecs import ENCRYPTED, KEY_CHECK, KEY_ENV, KEY_ID, CodecError, EncryptionKeys, PayloadCodecChain
from durable_agent.connection import connect, data_converter
from durable_agent.model_server import Failure, ModelServer, Reply
from durable_agent.server import EmbeddedServer, free_port, port_open
from tests.browser import CHROMIUM, Browser
from tests.helpers import run_cli, skip_without, start, wait_for
from tests.scripts import Script, answer
from tests.test_cli import cli_env, durable_agent, one_line_error
from worker import build_worker
from workflows.types import AgentInput, AgentResult

ROOT = Path(__file__).resolve().parent.parent


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def marker() -> str:
    return f"MARKER{uuid.uuid4().hex}"


# --- the codec ------------------------------------------------------------------------


async def test_round_trip_encrypts_every_payload_and_compresses_large_ones() -> None:
    converter = data_converter(EncryptionKeys.parse(f"k1:{new_key()}"))
    secret = marker()
    small = AgentInput(goal=secret, workspace="/w")
    large = AgentInput(goal=secret + " " + "word " * 5_000, workspace="/w")
    payloads = await converter.encode([small, large])
    for payload in payloads:
        assert payload.metadata["encoding"] == ENCRYPTED and payload.metadata[KEY_ID] == b"k1"
        assert secret.encode() not in payload.SerializeToString()
    plain_large = converter.payload_converter.to_payloads([large])[0]
    assert payloads[1].ByteSize() * 10 < plain_large.ByteSize()  # compressed before it was encrypted
    assert await converter.decode(payloads, [AgentInput, AgentInput]) == [small, large]
    # Encryption is randomized: the same value never gives the same bytes twice.
    assert (await converter.encode([small]))[0].data != payloads[0].data


def test_a_bad_key_setting_says_what_is_wrong_and_never_quotes_the_key() -> None:
    short = base64.b64encode(b"x" * 16).decode()
    cases = {
        short: "is 16 bytes; AES-256 needs 32",
        f"a:{new_key()},a:{new_key()}": "the id is used twice",
        "k1:not base64!": "is not valid base64",
        f"bad id:{new_key()}": "bad id",
    }
    for setting, reason in cases.items():
        with pytest.raises(CodecError, match=reason) as raised:
            EncryptionKeys.parse(setting)
        assert KEY_ENV in str(raised.value)
        assert setting.rpartition(":")[2] not in str(raised.value)


def test_a_tampered_payload_fails_naming_its_key_id() -> None:
    codec = PayloadCodecChain(EncryptionKeys.parse(f"k1:{new_key()},k2:{new_key()}"))
    [sealed] = codec.encode_all([Payload(metadata={"encoding": b"json/plain"}, data=b'"hello"')])
    flipped = Payload()
    flipped.CopyFrom(sealed)
    flipped.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    with pytest.raises(CodecError, match="key id 'k1' does not authenticate: it was altered"):
        codec.decode_all([flipped])
    relabelled = Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata[KEY_ID] = b"k2"  # the id is bound to the ciphertext too
    with pytest.raises(CodecError, match="key id k2 not held by this process .it holds another key under that id"):
        codec.decode_all([relabelled])
    del relabelled.metadata[KEY_CHECK]  # as payloads written before the check existed
    with pytest.raises(CodecError, match="key id 'k2' does not authenticate"):
        codec.decode_all([relabelled])


def test_an_unknown_key_id_or_no_key_fails_naming_the_id() -> None:
    [sealed] = PayloadCodecChain(EncryptionKeys.parse(f"old:{new_key()}")).encode_all(
        [Payload(metadata={"encoding": b"json/plain"}, data=b'"hello"')]
    )
    with pytest.raises(
        CodecError,
        match=r"cannot decrypt: key id old not held by this process; DURABLE_AGENT_ENCRYPTION_KEY holds 'new'",
    ):
        PayloadCodecChain(EncryptionKeys.parse(f"new:{new_key()}")).decode_all([sealed])
    with pytest.raises(CodecError, match=r"key id old not held .* holds none: it is not set"):
        PayloadCodecChain(None).decode_all([sealed])
    with pytest.raises(CodecError, match=r"key id old not held by this process .it holds another key under that id"):
        PayloadCodecChain(EncryptionKeys.parse(f"old:{new_key()}")).decode_all([sealed])


def test_rotation_old_payloads_still_decode_and_new_ones_use_the_first_key() -> None:
    old = new_key()
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"hello"')
    [before] = PayloadCodecChain(EncryptionKeys.parse(f"k1:{old}")).encode_all([plain])
    rotated = PayloadCodecChain(EncryptionKeys.parse(f"k2:{new_key()},k1:{old}"))
    assert rotated.decode_all([before]) == [plain]
    [after] = rotated.encode_all([plain])
    assert after.metadata[KEY_ID] == b"k2" and rotated.decode_all([after]) == [plain]
    # A bare key is id "default": rotating away from it names it so.
    bare = new_key()
    [unnamed] = PayloadCodecChain(EncryptionKeys.parse(bare)).encode_all([plain])
    assert PayloadCodecChain(EncryptionKeys.parse(f"k3:{new_key()},default:{bare}")).decode_all([unnamed]) == [plain]


def test_an_unencrypted_payload_still_decodes_with_a_key_and_none_is_made_without_one() -> None:
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"started by the plain Temporal CLI"')
    assert PayloadCodecChain(EncryptionKeys.parse(f"k1:{new_key()}")).decode_all([plain]) == [plain]
    large = Payload(metadata={"encoding": b"json/plain"}, data=b'"' + b"a" * 100_000 + b'"')
    assert PayloadCodecChain(None).encode_all([plain, large]) == [plain, large]  # no key: left as is


# --- a real run: bytes at rest, the Temporal CLI, rotation ------------------------------


def database_bytes(server: EmbeddedServer) -> bytes:
    """Every byte of the server's SQLite database: the file, its WAL and shared memory."""
    assert server.db_file is not None
    files = sorted(server.db_file.parent.glob(server.db_file.name + "*"))
    assert {f.name for f in files} >= {"temporal.sqlite", "temporal.sqlite-wal"}
    return b"".join(f.read_bytes() for f in files)


def scripted_run(secret: str) -> Script:
    """A run that carries `secret` in every kind of payload: an endpoint error (a failure
    message), the model's reply and tool-call arguments, a command's output and summary."""
    failed: list[bool] = []

    def first(request: dict[str, Any]) -> Reply | Failure:
        if not failed:
            failed.append(True)
            return Failure(400, message=f"rejected {secret}")
        return Reply(content=f"thinking {secret}", tool_calls=[("run_command", {"command": f"echo out-{secret}"})])

    return Script([first, answer(f"done {secret}")])


async def run_through(client: Client, task_queue: str, workspace: Path, secret: str) -> str:
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal=f"goal {secret}", workspace=str(workspace))
        await wait_for(handle, lambda s: s.state == "needs_attention")
        await handle.execute_update("resolve", {"action": "retry"})
        result = await handle.result()
    assert result.output == f"done {secret}" and result.usage.tool_calls == 1
    return handle.id


async def test_an_encrypted_run_leaves_nothing_in_clear_and_stays_readable_with_its_keys(
    client: Client, temporal_server: EmbeddedServer, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    old_key = new_key()
    encrypted = await connect(temporal_server.address, converter=data_converter(EncryptionKeys.parse(f"k1:{old_key}")))
    secret, control = marker(), marker()
    model_server.responder = scripted_run(secret)
    run_id = await run_through(encrypted, task_queue, workspace, secret)
    # The control: the same run without a key leaves its marker in clear in the database.
    model_server.responder = scripted_run(control)
    await run_through(client, task_queue + "-plain", workspace, control)

    history = await encrypted.get_workflow_handle(run_id).fetch_history()
    raw_history = b"".join(e.SerializeToString() for e in history.events)
    assert secret.encode() not in raw_history
    at_rest = database_bytes(temporal_server)
    assert control.encode() in at_rest
    assert secret.encode() not in at_rest

    # Rotation: with a new key added in front, the old run still reads; without k1 it cannot.
    rotated = await connect(
        temporal_server.address, converter=data_converter(EncryptionKeys.parse(f"k2:{new_key()},k1:{old_key}"))
    )
    result = await rotated.get_workflow_handle(run_id, result_type=AgentResult).result()
    assert result.output == f"done {secret}"
    for setting in (f"k2:{new_key()}", None):
        keys = EncryptionKeys.parse(setting) if setting else None
        other = await connect(temporal_server.address, converter=data_converter(keys))
        with pytest.raises(CodecError, match="key id k1 not held"):
            await other.get_workflow_handle(run_id, result_type=AgentResult).result()

    # durable-agent says so in one line, naming the key id.
    env = cli_env(**{KEY_ENV: f"k2:{new_key()}"})
    refused = await durable_agent("status", run_id, env=env)
    one_line_error(refused, 2, "cannot decrypt: key id k1 not held by this process")

    # The Temporal CLI reads it in clear through the codec server, and only through it.
    with CodecServer(PayloadCodecChain(EncryptionKeys.parse(f"k1:{old_key}")), token="codec-token") as codec:
        show = ["workflow", "show", "-w", run_id, "--detailed"]
        clear = await run_cli(
            temporal_server.address, *show, "--codec-endpoint", codec.url, "--codec-auth", "Bearer codec-token"
        )
        assert clear.returncode == 0, clear
        for expected in (f"goal {secret}", f"thinking {secret}", f"echo out-{secret}", f"done {secret}"):
            assert expected in clear.stdout, expected
        assert clear.stdout.count(f"out-{secret}") >= 2  # the command, and its output
        assert secret not in (await run_cli(temporal_server.address, *show)).stdout
        wrong = await run_cli(temporal_server.address, *show, "--codec-endpoint", codec.url, "--codec-auth", "Bearer x")
        assert secret not in wrong.stdout


# --- the codec server as a command --------------------------------------------------------


def durable_agent_process(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A long-running `durable-agent` command; its output, stderr included, on a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "durable_agent.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def codec_command(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`durable-agent codec-server` in a subprocess: (its URL, its key setting)."""
    setting = f"k1:{new_key()}"
    port = free_port()
    env = {**os.environ, KEY_ENV: setting, "DURABLE_AGENT_CODEC_TOKEN": "tok"}
    process = durable_agent_process("codec-server", "--port", str(port), env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert f"codec server on http://127.0.0.1:{port} (key ids ['k1'], bearer token" in line, line
        yield f"http://127.0.0.1:{port}", setting
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    assert not port_open("127.0.0.1", port)


def post(
    url: str, body: bytes | None, headers: dict[str, str], method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_the_codec_server_speaks_temporals_protocol_with_cors_and_a_bearer_token(
    codec_command: tuple[str, str],
) -> None:
    url, setting = codec_command
    ui = "http://localhost:8233"
    status, headers, _ = post(
        f"{url}/decode", None, {"Origin": ui, "Access-Control-Request-Headers": "content-type,x-namespace"}, "OPTIONS"
    )
    assert status == 204 and headers["access-control-allow-origin"] == ui
    assert "X-Namespace" in headers["access-control-allow-headers"]
    assert (
        "access-control-allow-origin"
        not in post(f"{url}/decode", None, {"Origin": "http://evil.example"}, "OPTIONS")[1]
    )

    [sealed] = PayloadCodecChain(EncryptionKeys.parse(setting)).encode_all(
        [Payload(metadata={"encoding": b"json/plain"}, data=b'"hello codec"')]
    )
    body = json.dumps(
        {
            "payloads": [
                {
                    "metadata": {k: base64.b64encode(v).decode() for k, v in sealed.metadata.items()},
                    "data": base64.b64encode(sealed.data).decode(),
                }
            ]
        }
    ).encode()
    json_headers = {"Content-Type": "application/json", "X-Namespace": "default", "Origin": ui}
    assert post(f"{url}/decode", body, json_headers)[0] == 401
    status, headers, answer_body = post(f"{url}/decode", body, {**json_headers, "Authorization": "Bearer tok"})
    assert status == 200 and headers["access-control-allow-origin"] == ui
    [decoded] = json.loads(answer_body)["payloads"]
    assert base64.b64decode(decoded["data"]) == b'"hello codec"'
    assert base64.b64decode(decoded["metadata"]["encoding"]) == b"json/plain"

    status, _, encoded_body = post(f"{url}/encode", answer_body, {**json_headers, "Authorization": "Bearer tok"})
    [encoded] = json.loads(encoded_body)["payloads"]
    assert status == 200 and base64.b64decode(encoded["metadata"]["encoding"]) == ENCRYPTED

    tampered = json.loads(body)
    data = bytearray(base64.b64decode(tampered["payloads"][0]["data"]))
    data[-1] ^= 1
    tampered["payloads"][0]["data"] = base64.b64encode(bytes(data)).decode()
    status, _, error = post(
        f"{url}/decode", json.dumps(tampered).encode(), {**json_headers, "Authorization": "Bearer tok"}
    )
    assert status == 400 and "key id 'k1' does not authenticate" in json.loads(error)["message"]


# --- the Web UI, in headless Chromium -------------------------------------------------------


def ui_settings(ui_port: int, timeout_s: float = 30) -> dict[str, Any]:
    """The Web UI's settings, once its HTTP server answers (it starts after the frontend)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/settings", timeout=10) as response:
                return json.loads(response.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def test_durable_agent_server_makes_the_web_ui_decrypt_through_its_codec_server(
    tmp_path: Path, model_server: ModelServer, workspace: Path
) -> None:
    if CHROMIUM is None:
        skip_without(
            "browser",
            "chromium is not installed (Debian: apt-get install -y --no-install-recommends chromium, which .ci/run "
            "does as root): the Web UI check needs a browser",
        )
    setting = f"k1:{new_key()}"
    env = {**os.environ, KEY_ENV: setting, "DURABLE_AGENT_HOME": str(tmp_path / "home")}
    for _ in range(3):  # a port found free may be taken by a parallel test before the server binds it
        port, ui_port = free_port(), free_port()
        while port_open("127.0.0.1", ui_port + 1):
            ui_port = free_port()
        codec_port = ui_port + 1  # README: the codec is on the UI port + 1 unless --codec-port says
        server = durable_agent_process("server", "--port", str(port), "--ui-port", str(ui_port), env=env)
        assert server.stdout is not None
        lines = [server.stdout.readline().decode() for _ in range(3)]
        if "Address already in use" not in lines[0]:
            break
        server.wait(timeout=30)
    try:
        assert f"the Web UI decrypts it through the codec server at http://127.0.0.1:{codec_port}" in lines[2], lines
        assert ui_settings(ui_port)["Codec"]["Endpoint"] == f"http://127.0.0.1:{codec_port}"

        address = f"127.0.0.1:{port}"
        shown, hidden = marker(), marker()
        runs = {}
        # A run under the server's key, and a control under a key the codec server lacks.
        for secret, keys in ((shown, setting), (hidden, f"k9:{new_key()}")):
            client = await connect(address, converter=data_converter(EncryptionKeys.parse(keys)))
            model_server.responder = Script([answer(f"reply {secret}")])
            queue = f"ui-{uuid.uuid4().hex[:8]}"
            async with build_worker(client, queue):
                handle = await start(client, queue, goal=f"goal {secret}", workspace=str(workspace))
                await handle.result()
            runs[secret] = (
                f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/{handle.id}/{handle.result_run_id}/history"
            )

        browser = Browser()
        try:
            # Decrypted through the codec server: the reply in the history and the goal in the input.
            await browser.page_showing(runs[shown], f"reply {shown}", f"goal {shown}")
            # The control page rendered its history, but nothing of what it could not decode.
            control = await browser.page_showing(runs[hidden], "Workflow Execution Completed")
            assert hidden not in control
        finally:
            browser.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert not port_open("127.0.0.1", codec_port)


def peak_rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)[1]) * 1024


def send_raw(port: int, head: str, body_bytes: int) -> bytes:
    """Send a request head and `body_bytes` of body (until the server closes), then whatever it answered."""
    chunk = b"x" * 2**20
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        try:
            connection.sendall(head.encode())
            for _ in range(body_bytes // len(chunk)):
                connection.sendall(chunk)
            connection.shutdown(socket.SHUT_WR)
            return connection.recv(4096)
        except OSError:  # closed or reset by the server with the body unread: that is the point
            return b""


def test_the_codec_server_reads_no_body_before_the_token_and_refuses_a_negative_length(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, KEY_ENV: f"k1:{new_key()}", "DURABLE_AGENT_CODEC_TOKEN": "tok"}
    process = durable_agent_process("codec-server", "--port", str(port), env=env)
    try:
        assert process.stdout is not None and b"codec server on" in process.stdout.readline()
        before = peak_rss_bytes(process.pid)
        head = "POST /decode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: -1\r\n\r\n"
        answer = send_raw(port, head, 300 * 2**20)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 401")
        grew = peak_rss_bytes(process.pid) - before
        assert grew < 32 * 2**20, f"an unauthenticated body grew the codec server by {grew / 2**20:.0f} MiB"

        authorized = head.replace("Host: x\r\n", "Host: x\r\nAuthorization: Bearer tok\r\n")
        assert send_raw(port, authorized, 0).startswith(b"HTTP/1.1 400")  # no body: no reset before the answer
        assert peak_rss_bytes(process.pid) - before < 32 * 2**20
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


async def line_while_following(env: dict[str, str], wanted: str, *args: str) -> str:
    """The first line of `durable-agent ARGS` holding `wanted` (or all it printed before it
    ended), then Ctrl-C: watch and run follow a wedged run for ever."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_agent.cli", *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    printed: list[str] = []
    try:
        async with asyncio.timeout(90):
            while line := (await process.stdout.readline()).decode():
                printed.append(line)
                if wanted in line:
                    return line
        return "".join(printed)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        await process.wait()


async def test_a_worker_with_another_key_says_so_and_the_run_waits_for_one_that_holds_it(
    temporal_server: EmbeddedServer, task_queue: str, model_server: ModelServer, workspace: Path, tmp_path: Path
) -> None:
    key = new_key()
    right = await connect(temporal_server.address, converter=data_converter(EncryptionKeys.parse(f"k1:{key}")))
    model_server.responder = Script([answer("done with the right key")])
    log = tmp_path / "wrong-worker.log"
    env = {
        **os.environ,
        KEY_ENV: f"k1:{new_key()}",  # the same id, another key: the probe's wrong worker
        "DURABLE_AGENT_TASK_QUEUE": task_queue,
        "TEMPORAL_ADDRESS": temporal_server.address,
    }
    with open(log, "wb") as out:
        wrong = subprocess.Popen([sys.executable, "worker.py"], cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        handle = await start(right, task_queue, goal="x", workspace=str(workspace))
        said = "cannot decrypt: key id k1 not held by this worker (it holds another key under that id)"
        while said not in log.read_text():  # the wrong worker tried the run's first task
            assert wrong.poll() is None, log.read_text()
            await asyncio.sleep(0.2)
        holder = cli_env(**{KEY_ENV: f"k1:{key}", "DURABLE_AGENT_TASK_QUEUE": task_queue})
        status = await durable_agent("status", handle.id, env=holder)
        one_line_error(status, 2, f"{handle.id} is running, but its workflow task fails: {said}")
        # watch and run say the same, not "no worker answered" (a worker does poll).
        explained = f"the run makes no progress: its workflow task fails: {said}"
        assert explained in await line_while_following(holder, explained, "watch", handle.id)
        started = f"wrong-key-run-{uuid.uuid4().hex[:8]}"
        assert explained in await line_while_following(
            holder, explained, "run", "x", "--workspace", str(workspace), "--id", started
        )
        await right.get_workflow_handle(started).terminate("the test is done with it")
    finally:
        wrong.send_signal(signal.SIGTERM)
        wrong.wait(timeout=30)
    text = log.read_text()
    # One line per run (this one and the one `run` started), not a traceback at every retry of
    # the task (the SDK's core adds a WARN of its own).
    assert "Traceback" not in text and text.count("the run waits for a worker that holds it") == 2, text
    async with build_worker(right, task_queue):  # a worker holding the key takes the run on
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.output == "done with the right key"
