"""Secrets never reach history, the journal, saved outputs or the transcript export.

Judged by bytes: the serialized history events and the files on disk, never the tools' words.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import subprocess
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities.journal import JOURNAL_DIR
from activities.redaction import Redactor, StreamRedactor, secret_env, worker_redactor
from activities.tools.output import OUTPUTS_DIR
from durable_agent.model_server import Failure, ModelServer, Reply
from tests.helpers import start, wait_for
from tests.scripts import Script, answer, tools
from tests.test_cli import cli_env, durable_agent
from worker import build_worker
from workflows.types import Message


def _random(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


ALNUM = string.ascii_letters + string.digits


class Secrets:
    """One fresh value of every secret shape, and the label each must be replaced by."""

    def __init__(self) -> None:
        self.env = {
            "DA_TEST_DEPLOY_TOKEN": "tok-" + _random(ALNUM, 24),  # secret by its name
            "DA_TEST_PLAIN_VALUE": "plain-" + _random(ALNUM, 24),  # secret by DURABLE_AGENT_SECRET_ENV
        }
        key_body = _random(ALNUM + "+/", 64)
        self.shapes = {
            "openai-key": "sk-proj-" + _random(ALNUM, 40) + "7",
            "github-token": "ghp_" + _random(ALNUM, 36),
            "aws-access-key-id": "AKIA" + _random(string.ascii_uppercase + string.digits, 16),
            "slack-token": "xoxb-" + _random(string.digits, 12) + "-" + _random(ALNUM, 24),
            "bearer-token": _random(ALNUM, 40),
        }
        self.pat = "github_pat_" + _random(ALNUM, 22) + "_" + _random(ALNUM, 59)
        self.key_body = key_body
        self.text = "\n".join(
            [
                f"env {self.env['DA_TEST_DEPLOY_TOKEN']} {self.env['DA_TEST_PLAIN_VALUE']}",
                self.shapes["openai-key"],
                f"{self.shapes['github-token']} {self.pat}",
                self.shapes["aws-access-key-id"],
                self.shapes["slack-token"],
                f"Bearer {self.shapes['bearer-token']}",
                "-----BEGIN RSA PRIVATE KEY-----",
                key_body,
                "-----END RSA PRIVATE KEY-----",
                "",
            ]
        )

    def needles(self) -> list[str]:
        return [*self.env.values(), *self.shapes.values(), self.pat, self.key_body]

    def labels(self) -> list[str]:
        return [f"[REDACTED:{name}]" for name in [*self.env, *self.shapes, "private-key"]]

    def assert_redacted(self, where: str, text: str) -> None:
        leaked = [needle for needle in self.needles() if needle in text]
        assert not leaked, f"{where} holds secrets {leaked}"
        missing = [label for label in self.labels() if label not in text]
        assert not missing, f"{where} lacks {missing}: it never carried the secrets, the check proves nothing"


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Secrets:
    planted = Secrets()
    for name, value in planted.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DURABLE_AGENT_SECRET_ENV", "OTHER_NAME, DA_TEST_PLAIN_*")
    return planted


# --- the redactor itself ----------------------------------------------------------------


def test_every_shape_and_secret_variable_is_replaced_by_its_label(planted: Secrets) -> None:
    redacted = worker_redactor().text(planted.text)
    planted.assert_redacted("redacted text", redacted)
    assert "\nBearer [REDACTED:bearer-token]\n" in redacted
    assert worker_redactor().text(redacted) == redacted  # labels never match again


def test_short_values_ordinary_words_and_bytes_are_left_alone() -> None:
    redactor = Redactor(secret_env({"PIN_PASSWORD": "1234", "KEYBOARD": "us", "DB_PASSWORD": "hunter2hunter2"}))
    text = "pin 1234 keyboard us; risk-management-and-compliance-report; AKIA_IS_A_PREFIX; Bearer token"
    assert redactor.text(text) == text
    assert redactor.text("pw=hunter2hunter2") == "pw=[REDACTED:DB_PASSWORD]"
    assert redactor.value(b"hunter2hunter2") == b"hunter2hunter2"
    nested = {"n": 1, "items": ["hunter2hunter2", 2.5]}
    assert redactor.value(nested) == {"n": 1, "items": ["[REDACTED:DB_PASSWORD]", 2.5]}


def test_a_rotation_list_value_is_redacted_part_by_part() -> None:
    one, two = "A" * 43 + "=", "B" * 43 + "="
    redactor = Redactor({"DURABLE_AGENT_ENCRYPTION_KEY": f"new:{one},old:{two}"})
    label = "[REDACTED:DURABLE_AGENT_ENCRYPTION_KEY]"
    assert redactor.text(f"{two} {one}") == f"{label} {label}"


def test_json_text_stays_valid_json(planted: Secrets) -> None:
    arguments = json.dumps({"path": "a.txt", "content": planted.text})
    redacted = worker_redactor().text(arguments)
    planted.assert_redacted("arguments", json.loads(redacted)["content"])


def test_a_stream_cut_anywhere_is_redacted_as_a_whole(planted: Secrets) -> None:
    data = ("filler line\n" * 50 + planted.text) * 3
    blob = data.encode() + b"\xff\xfe binary tail"
    for size in (1, 7, 64, 4096):
        stream = StreamRedactor(worker_redactor(), max_hold=256, overlap=128)
        out = b"".join(stream.feed(blob[i : i + size]) for i in range(0, len(blob), size)) + stream.flush()
        planted.assert_redacted(f"stream in {size}-byte chunks", out.decode(errors="replace"))
        assert out.endswith(b"\xff\xfe binary tail")
    unended = StreamRedactor(worker_redactor())
    cut = unended.feed(f"-----BEGIN PRIVATE KEY-----\n{planted.key_body}\n".encode()) + unended.flush()
    assert planted.key_body.encode() not in cut and b"[REDACTED:private-key]" in cut


def test_an_error_keeps_its_type_and_retry_behaviour_and_loses_its_secrets(planted: Secrets) -> None:
    try:
        try:
            raise ConnectionError(planted.text)
        except ConnectionError as inner:
            raise ApplicationError(planted.text, planted.text, type="ModelHttp401", non_retryable=True) from inner
    except ApplicationError as e:
        redacted = worker_redactor().error(e)
    assert redacted.type == "ModelHttp401" and redacted.non_retryable
    planted.assert_redacted("message", redacted.message)
    planted.assert_redacted("details", redacted.details[0])
    cause = redacted.__cause__
    assert isinstance(cause, ApplicationError) and cause.type == "ConnectionError" and not cause.non_retryable
    planted.assert_redacted("cause", cause.message)
    assert redacted.__traceback__ is not None


# --- a real run: every channel, judged by the bytes in history and on disk --------------


async def test_secrets_in_every_channel_stay_out_of_history_and_files(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, planted: Secrets
) -> None:
    filler = "".join(f"filler line {i}\n" for i in range(200))
    (workspace / "secrets.txt").write_text(planted.text + filler + planted.text + filler + planted.text)
    endpoint_failed = []

    def first_turn(request: dict) -> Reply | Failure:
        if not endpoint_failed:  # the endpoint's error message carries the secrets once
            endpoint_failed.append(True)
            return Failure(400, message=planted.text)
        return Reply(
            content=planted.text,
            tool_calls=[
                ("run_command", {"command": "cat secrets.txt"}),
                ("read_file", {"path": "secrets.txt"}),
                ("write_file", {"path": "echo.txt", "content": planted.text}),
            ],
        )

    # A gated step after the tools holds the run open: its journal is removed at the close.
    model_server.responder = Script([first_turn, tools(("list_files", {})), answer(planted.text)])
    async with build_worker(client, task_queue):
        handle = await start(
            client,
            task_queue,
            goal="read the secrets",
            workspace=str(workspace),
            context={"tool_output_chars": 1_500},
            approval={"tools": ["list_files"]},
        )
        status = await wait_for(handle, lambda s: s.state == "needs_attention")
        planted.assert_redacted("attention report", status.attention.last_error)
        await handle.execute_update("resolve", {"action": "retry"})
        gated = await wait_for(handle, lambda s: len(s.pending_approvals) == 1)
        entries = [p for p in (workspace / JOURNAL_DIR).rglob("*") if p.is_file()]
        assert len(entries) == 4  # write_file's and run_command's outcomes, run_command's start record, the chain's id
        assert [path for path in entries if path.stat().st_mode & 0o777 != 0o600] == []
        planted.assert_redacted("journal", "".join(path.read_text() for path in entries))
        await handle.execute_update("approve", {"call_id": gated.pending_approvals[0].call_id, "approved": True})
        result = await handle.result()
        transcript = await handle.query("transcript", result_type=list[Message])
    planted.assert_redacted("final answer", result.output)
    tool_messages = {m.tool_call_id: m.content or "" for m in transcript if m.role == "tool"}
    assert len(tool_messages) == 4
    for call_id, content in list(tool_messages.items())[:2]:  # run_command, read_file
        planted.assert_redacted(f"tool result {call_id}", content)
    planted.assert_redacted("the model's arguments, as the tool got them", (workspace / "echo.txt").read_text())

    history = await handle.fetch_history()
    planted.assert_redacted("history", b"".join(e.SerializeToString() for e in history.events).decode(errors="replace"))

    saved = list((workspace / OUTPUTS_DIR).rglob("*.txt"))
    assert len(saved) == 1  # the command's output, cut for the model (read_file pages instead)
    for path in saved:
        planted.assert_redacted(str(path), path.read_text())
    assert [p for p in (workspace / JOURNAL_DIR).rglob("*") if p.is_file()] == []  # removed at the close


async def test_export_redacts_a_run_recorded_without_redaction(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, planted: Secrets
) -> None:
    model_server.responder = Script([answer(planted.text)])
    # A worker as it was before redaction existed: the secrets reach history.
    async with build_worker(client, task_queue, interceptors=[]):
        handle = await start(client, task_queue, goal="say it", workspace=str(workspace))
        await handle.result()
        history = await handle.fetch_history()
        assert planted.shapes["openai-key"].encode() in b"".join(e.SerializeToString() for e in history.events)
        out = workspace / "t.jsonl"
        exported = await durable_agent("export", handle.id, "-o", str(out), env=cli_env())
    assert exported.returncode == 0, exported
    planted.assert_redacted("export", out.read_text())


ENCODERS = {
    "base64": 'echo "$T" | base64',
    "base64 at offset 1": 'echo "x$T" | base64 -w0',
    "base64 at offset 2": 'echo "xy$T" | base64 -w0',
    "base64url": 'echo "$T" | base64 -w0 | tr +/ -_',
    "hex (xxd -p, wrapped)": 'echo "$T" | xxd -p -c 8',
    "hex (od, with addresses)": 'echo "$T" | od -tx1',
    "hex (od -An, upper case)": 'echo "$T" | od -An -tx1 | tr a-f A-F',
    "reversed": 'echo "$T" | rev',
}


@pytest.mark.parametrize("encoder", ENCODERS)
def test_a_known_value_is_caught_in_its_common_encodings(encoder: str) -> None:
    value = "tok-" + _random(ALNUM + "+/", 40)
    printed = subprocess.run(
        ["bash", "-c", ENCODERS[encoder]], env={"T": value, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    ).stdout
    redacted = Redactor({"DEPLOY_TOKEN": value}).text(printed)
    assert "[REDACTED:DEPLOY_TOKEN]" in redacted, (printed, redacted)
    # What is left is the encoding of the characters around the value, never enough of it to decode.
    assert len(re.sub(r"\[REDACTED:DEPLOY_TOKEN\]|\s", "", redacted)) < 16, redacted


def test_credentials_in_any_url_and_database_urls_are_redacted() -> None:
    url = "postgres://admin:FAKEDBPASS-" + _random(ALNUM, 12) + "@db.internal:5432/prod"
    redactor = Redactor(secret_env({"DATABASE_URL": url, "SENTRY_DSN": "https://k" + _random(ALNUM, 20) + "@s.io/1"}))
    assert redactor.text(f"url={url}") == "url=[REDACTED:DATABASE_URL]"
    other = "mysql://app:" + _random(ALNUM, 10) + "@10.0.0.5/x"
    assert redactor.text(f"connect {other} now") == "connect mysql://[REDACTED:url-credentials]@10.0.0.5/x now"
    plain = "see https://example.com/a@b and git@github.com:o/r.git"
    assert redactor.text(plain) == plain


def test_a_known_value_split_across_writes_of_a_long_line_is_still_caught() -> None:
    value = "tok-" + _random(ALNUM, 60)
    blob = ("x" * 300 + value + "y" * 300).encode()  # no line break: released in pieces
    for size in (1, 7, 33, 64):
        stream = StreamRedactor(Redactor({"DEPLOY_TOKEN": value}), max_hold=64, overlap=16)
        out = b"".join(stream.feed(blob[i : i + size]) for i in range(0, len(blob), size)) + stream.flush()
        assert value.encode()[:12] not in out and out.count(b"[REDACTED:DEPLOY_TOKEN]") == 1, (size, out)


async def test_encoded_secrets_and_url_credentials_stay_out_of_history(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = "tok-" + _random(ALNUM, 40)
    password = "FAKEDBPASS-" + _random(ALNUM, 12)
    monkeypatch.setenv("DA_TEST_DEPLOY_TOKEN", value)
    monkeypatch.setenv("DATABASE_URL", f"postgres://admin:{password}@db.internal:5432/prod")
    printing = "; ".join(
        [
            'echo "$DATABASE_URL"',
            'echo "$DA_TEST_DEPLOY_TOKEN" | base64',
            'echo "$DA_TEST_DEPLOY_TOKEN" | od -An -tx1',
            'echo "$DA_TEST_DEPLOY_TOKEN" | rev',
            'printf "%s" "${DA_TEST_DEPLOY_TOKEN:0:20}"; sleep 0.3; echo "${DA_TEST_DEPLOY_TOKEN:20}"',
            'echo "copy to postgres://svc:${DA_TEST_DEPLOY_TOKEN:0:12}x@backup/db"',
        ]
    )
    model_server.responder = Script([tools(("run_command", {"command": printing}))], final="printed")
    async with build_worker(client, task_queue):
        handle = await start(
            client,
            task_queue,
            goal="print the secrets",
            workspace=str(workspace),
            env_allow=["DA_TEST_DEPLOY_TOKEN", "DATABASE_URL"],
        )
        assert (await handle.result()).output == "printed"
    history = b"".join(e.SerializeToString() for e in (await handle.fetch_history()).events).decode(errors="replace")
    assert history.count("[REDACTED:DA_TEST_DEPLOY_TOKEN]") == 4 and "[REDACTED:DATABASE_URL]" in history
    assert "postgres://[REDACTED:url-credentials]@backup/db" in history
    encoded = subprocess.run(
        ["bash", "-c", 'echo "$T" | base64; echo "$T" | od -An -tx1 | tr -d " \\n"'],
        env={"T": value, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    ).stdout.split()
    leaked = [s for s in [value, value[::-1], password, encoded[0][:40], encoded[1][:40], value[:12]] if s in history]
    assert not leaked, leaked
