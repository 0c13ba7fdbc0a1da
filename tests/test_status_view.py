"""The Web UI's current details: markdown the UI's renderer shows as intended."""

from __future__ import annotations

from workflows.status_view import details_markdown, start_details
from workflows.tool_specs import call_summary
from workflows.types import AgentInput, AgentStatus, AttentionReport, Limits, PendingApproval, Usage


def status(**fields: object) -> AgentStatus:
    base: dict[str, object] = {"state": "running", "step": 3, "model": "m", "usage": Usage(), "limits": Limits()}
    return AgentStatus.model_validate({**base, **fields})


def test_lists_follow_a_blank_line_so_they_render_as_lists() -> None:
    text = details_markdown(
        status(
            state="needs_attention",
            pending_approvals=[
                PendingApproval(
                    call_id="3:c1", tool="run_command", summary="run_command: rm -rf build", step=3, reason="matches rm"
                )
            ],
            attention=AttentionReport(
                what_failed="read_file: a.txt failed 3 times",
                last_error="missing",
                attempts=3,
                step=3,
                suggested_actions=["retry: again", "skip: drop it"],
            ),
        )
    )
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("- ") and not lines[i - 1].startswith("- "):
            assert lines[i - 1] == "", f"list item without a blank line before it: {line!r}"
    assert "Last error: missing" in lines
    assert "`resolve` update" in text and "`approve` update" in text and "`3:c1`" in text


def test_each_call_that_needs_attention_has_its_own_report() -> None:
    reports = [
        AttentionReport(
            call_id=f"3:c{i}",
            what_failed=f"read_file: {name} failed 3 times",
            last_error="missing",
            attempts=3,
            step=3,
            suggested_actions=["retry: again"],
        )
        for i, name in enumerate(["a.txt", "b.txt"])
    ]
    text = details_markdown(status(state="needs_attention", attention=reports[0], attention_reports=reports))
    assert text.count("**Needs attention:**") == 2 and "b.txt" in text
    assert '`"call_id": "3:c0"`' in text and '`"call_id": "3:c1"`' in text


def test_free_text_is_not_read_as_markdown() -> None:
    text = details_markdown(status(state="completed", activity="completed: final_answer", paused_reason=None))
    assert "completed: final\\_answer" in text


def test_the_budget_is_a_fixed_width_block_with_a_bar_per_budget() -> None:
    text = details_markdown(status(usage=Usage(model_calls=50, input_tokens=1000)))
    block = text.split("```")[1].strip().splitlines()
    assert block[0].split() == ["budget", "used", "limit"]
    assert len(block) == 7 and all("░" in row or "█" in row for row in block[1:])
    assert "model calls" in block[4] and "50%" in block[4]


def test_start_details_say_what_the_run_was_given() -> None:
    agent = AgentInput(goal="g", workspace="/w", approval={"commands": ["^rm "]}, fallback_model="small")
    text = start_details(agent)
    assert "**Workspace:** /w" in text and "falls back to small" in text and "run\\_command ~ /^rm /" in text


def test_summaries_name_what_a_call_touches() -> None:
    assert call_summary("list_files", {"pattern": "*.py"}) == "list_files: *.py"
    assert call_summary("list_files", {"path": "src", "pattern": "*.py"}) == "list_files: src *.py"
    assert call_summary("search_files", {"pattern": "TODO", "path": "src"}) == "search_files: TODO src"
    assert call_summary("run_command", {"command": "pytest -q\n"}) == "run_command: pytest -q "
    assert len(call_summary("write_file", {"path": "x" * 300})) == 120
