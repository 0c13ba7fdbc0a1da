"""Who waits on whom: a run's wait chains, and the deadlocks and stalls they reveal.

A run that waits names what it waits for: a person (an approval, a resolve, a resume) or
a delegate, which in turn names what it waits for. Each chain runs from the run itself to
the thing that would unblock it, with the command that does: `parent → child → awaiting
approval of call 3:call_2_0`. A chain that comes back to a run already in it is a cycle of
waits (a deadlock): nothing in it can move. Pure functions of the runs' statuses.
"""

from __future__ import annotations

from workflows.types import AttentionReport, ChildRun, PendingApproval, RunState, WaitLink


def wait_chains(
    workflow_id: str,
    state: RunState | str,
    pending: list[PendingApproval],
    attention: list[AttentionReport],
    paused_reason: str | None,
    children: list[ChildRun],
) -> list[list[WaitLink]]:
    """Every chain of waits starting at this run; empty when it is not waiting on anything."""
    if state == "needs_attention":
        command = f"durable-agent resolve {workflow_id} retry|skip|terminate"
        return [
            [WaitLink(workflow_id=workflow_id, waiting_for=f"needs attention: {a.what_failed}", command=command)]
            for a in attention
        ]
    if state == "paused":
        reason = f"paused ({paused_reason})" if paused_reason else "paused"
        return [[WaitLink(workflow_id=workflow_id, waiting_for=reason, command=f"durable-agent resume {workflow_id}")]]
    chains = [
        [
            WaitLink(
                workflow_id=workflow_id,
                waiting_for=f"awaiting approval of call {p.call_id} ({p.summary})",
                command=f"durable-agent approve {workflow_id} {p.call_id}",
            )
        ]
        for p in pending
    ]
    for child in children:
        link = WaitLink(workflow_id=workflow_id, waiting_for=f"delegate {child.workflow_id}")
        chains += [[link, *chain] for chain in child.wait_chains]
    return chains


def find_cycle(chains: list[list[WaitLink]]) -> list[WaitLink] | None:
    """The first chain in which a run appears twice, cut just after its second appearance."""
    for chain in chains:
        seen: set[str] = set()
        for index, link in enumerate(chain):
            if link.workflow_id in seen:
                return chain[: index + 1]
            seen.add(link.workflow_id)
    return None


def chain_text(chain: list[WaitLink]) -> str:
    """`a → a/child → awaiting approval of call 3:call_2_0`: the runs, then what the last waits for."""
    if not chain:
        return ""
    runs = " → ".join(link.workflow_id for link in chain)
    last = chain[-1]
    return f"{runs} → {last.waiting_for}" + (f" (unblock: {last.command})" if last.command else "")
