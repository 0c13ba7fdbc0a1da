"""Checking a final answer against the run's definition of done (workflows/done.py).

A part of `AgentWorkflow` (workflows/agent.py), whose state it works on: when the model
answers without tools, `_answer_accepted` runs the check command (the `run_command`
activity, in the command sandbox) and one judge call of the model for the statements.
Every check is charged like any call (a tool call, a model call) and counted in
`usage.done_checks`.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.done import (
        CriterionResult,
        command_result,
        judge_messages,
        statements_of,
        unchecked,
        unconfirmed,
        unmet_text,
        verdicts,
    )
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled
    from workflows.types import ToolCallInput, ToolOutcome


class DoneSteps:
    """The definition of done, as `AgentWorkflow` checks it."""

    async def _answer_accepted(self, answer: str) -> bool:
        """Whether the run may close with `answer`: no criteria, all met, or the checks used up
        (the result then lists what is unmet). Otherwise the model is told what is unmet."""
        agent = self._agent
        statements = statements_of(agent.success_criteria)
        if not (statements or agent.check_command) or not self._patched(options.DONE_PATCH):
            return True
        check = self._carry.done_checks + 1
        if (budget := self._hard_stop()) not in (None, "hard_step_limit"):  # a check is not a step
            self._carry.criteria = unchecked(statements, agent.check_command, budget, check)
            return True
        self._carry.done_checks = check
        self._carry.usage.done_checks += 1
        self._doing = f"checking the success criteria (check {check} of {self._limits.max_done_checks})"
        self._publish()
        results: list[CriterionResult] = []
        if agent.check_command:
            results.append(await self._run_check_command(agent.check_command, check))
        if statements:
            results += await self._judge(statements, answer, check)
        self._carry.criteria = results
        if all(r.met for r in results) or check >= self._limits.max_done_checks:
            return True
        self._add_message("user", unmet_text(results, check, self._limits.max_done_checks), kind="done_check")
        return False

    async def _run_check_command(self, command: str, check: int) -> CriterionResult:
        """The command as `run_command` runs (same activity path, host and time cap), in a
        sandbox of its own: no shell state, so it starts in the workspace."""
        info = workflow.info()
        args = self._clip_command({"command": command}, options.DEFAULT_COMMAND_TIMEOUT_S)
        request = ToolCallInput(
            call_id=f"done-check-{check}",
            idempotency_key=f"{info.workflow_id}/{self._carry.first_run_id}/{self._carry.step}/done-check-{check}",
            workspace=self._agent.workspace,
            arguments=args,
            output_chars=self._carry.quota.output_chars(self._agent.context.tool_output_chars),
            sandbox=self._agent.sandbox,
            env_allow=self._agent.env_allow,
            run_folder=self._run_folder(),
            step=self._carry.step,
        )
        self._carry.usage.tool_calls += 1
        try:
            outcome = await self._builtin_activity("run_command", request, args, f"done check {check}: {command}"[:120])
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            outcome = ToolOutcome(ok=False, error=f"run_command failed: {failure_message(e)}")
        return command_result(command, outcome.ok, outcome.output, outcome.error, check)

    async def _judge(self, statements: list[str], answer: str, check: int) -> list[CriterionResult]:
        """One model call: each statement met or not, by the transcript's evidence."""
        view = self._carry.view
        messages = judge_messages(self._agent.goal, statements, answer, view.messages, view.summary)
        try:
            reply = await self._execute_model_call(messages, tools=[], summary=f"done check {check}")
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            return unconfirmed(statements, check, f"the judge call failed ({failure_message(e)})")
        self._charge(reply)
        return verdicts(reply.content, statements, check)
