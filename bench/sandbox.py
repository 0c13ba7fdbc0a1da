"""What the command sandbox costs per command: `python -m bench sandbox [--n 100]`.

Two measurements, each alternating sandboxed and unsandboxed runs of `true` so that both
see the same machine load:
* launch: the process alone, `bash -c true` against bubblewrap with the worker's
  arguments, rlimits and cgroup (`CommandLaunch`), started and awaited as run_command does;
* tool: the whole `run_command` activity (journal, output capture, process-group checks),
  with the sandbox and with `DURABLE_AGENT_UNSANDBOXED_COMMANDS=i-understand`;
* shell: the whole activity in a run's sandbox (`shell: persistent`, started by the first
  call), against the same unsandboxed activity.
Then CPU per command (this process and its children, each variant as one block of n calls; the
run's sandbox ended inside its block so its helper's CPU is counted), and the memory a run's
sandbox holds between commands: the proportional set size (PSS, shared pages split between
the processes sharing them) of its processes (bubblewrap, the helper, its standby child);
and the CPU of starting and ending a run's sandbox (no command), paid once per run; the CPU of
whole runs of 1 and of 4 commands and their close, this process's and its children's apart, in a
run's sandbox (`shell: persistent`) and in a sandbox per command (`shell: fresh`), alternating;
and what a command's journal start record costs, synced (as it is: the file and its folder) and not.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.journal import write_at
from activities.tools import ToolActivities
from activities.tools.run_sandbox import RUN_SANDBOXES, RunSandbox
from activities.tools.sandbox import UNSANDBOXED_CONSENT, UNSANDBOXED_ENV, CommandLaunch, CommandLimits
from workflows.types import ShellState, ToolCallInput


async def launch_once(workspace: str, unsandboxed: bool) -> float:
    os.environ.pop(UNSANDBOXED_ENV, None)
    if unsandboxed:
        os.environ[UNSANDBOXED_ENV] = UNSANDBOXED_CONSENT
    started = time.perf_counter()
    launch = CommandLaunch.prepare(workspace, "true", False, [], CommandLimits())
    try:
        process = await asyncio.create_subprocess_exec(
            *launch.argv, cwd=workspace, env=launch.env, start_new_session=True
        )
        await process.wait()
    finally:
        launch.close()
    assert process.returncode == 0, process.returncode
    return time.perf_counter() - started


async def tool_once(
    tools: ToolActivities, workspace: str, unsandboxed: bool, shell: bool = False, run_folder: str | None = None
) -> float:
    """One `run_command` of `true`; with `shell` in the run's sandbox of `run_folder` (default RUN);
    with only `run_folder`, in a sandbox of its own as a run of `shell: fresh` runs it."""
    os.environ.pop(UNSANDBOXED_ENV, None)
    if unsandboxed:
        os.environ[UNSANDBOXED_ENV] = UNSANDBOXED_CONSENT
    # Each call a step of its own, as in a run: the journal keeps only the current step's entries.
    run: dict[str, object] = {}
    if shell or run_folder is not None:
        run = {"run_folder": run_folder or RUN, "step": next(SHELL_STEPS), "shell": ShellState() if shell else None}
    call = ToolCallInput(
        call_id="c", idempotency_key=uuid.uuid4().hex, workspace=workspace, arguments={"command": "true"}, **run
    )
    started = time.perf_counter()
    outcome = await ActivityEnvironment().run(tools.run_command, call)
    assert outcome.ok, outcome.error
    return time.perf_counter() - started


RUN = "bench-run"
SHELL_STEPS = itertools.count()


def cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def cpu_per_command(tools: ToolActivities, workspace: str, n: int, variant: str) -> float:
    before = cpu_s()
    for _ in range(n):
        await tool_once(tools, workspace, variant == "unsandboxed", shell=variant == "shell")
    await RUN_SANDBOXES.end_run(workspace, RUN)
    return (cpu_s() - before) / n


def summary(name: str, sandboxed: list[float], plain: list[float]) -> str:
    s, p = statistics.median(sandboxed) * 1000, statistics.median(plain) * 1000
    return f"{name:<7} sandboxed {s:6.1f} ms   unsandboxed {p:6.1f} ms   sandbox cost {s - p:5.1f} ms (medians)"


async def measure(n: int) -> None:
    tools = ToolActivities(roots=[tempfile.gettempdir()])
    with tempfile.TemporaryDirectory() as workspace:
        workspace = os.path.realpath(workspace)
        await launch_once(workspace, False)  # the first call probes bubblewrap once per worker
        kinds = ("launch", "tool", "shell")
        times: dict[tuple[str, bool], list[float]] = {(k, u): [] for k in kinds for u in (False, True)}
        load = os.getloadavg()[0]
        for _ in range(n):
            for unsandboxed in (False, True):
                times["launch", unsandboxed].append(await launch_once(workspace, unsandboxed))
                times["tool", unsandboxed].append(await tool_once(tools, workspace, unsandboxed))
                times["shell", unsandboxed].append(await tool_once(tools, workspace, unsandboxed, shell=True))
        await asyncio.sleep(0.5)  # the helper forks its standby child after the last command returned
        memory = sandbox_memory_kib()
        await RUN_SANDBOXES.end_run(workspace, RUN)
        cpu = {variant: await cpu_per_command(tools, workspace, n, variant) for variant in CPU_VARIANTS}
        start_cpu = await sandbox_start_cpu(workspace, n)
        per_run = {k: await cpu_per_run(tools, workspace, max(n // 4, 5), k) for k in RUN_COMMANDS}
        record = journal_record_costs(workspace, n)
    os.environ.pop(UNSANDBOXED_ENV, None)
    print(f"{n} runs of `true` each, alternating; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    for kind in kinds:
        print(summary(kind, times[kind, False], times[kind, True]))
    print("CPU per run_command (worker + children): " + ", ".join(f"{v} {cpu[v] * 1000:.1f} ms" for v in cpu))
    print(f"a run's sandbox started and ended, CPU (this process + children): {start_cpu * 1000:.1f} ms")
    for k, cpu_of_run in per_run.items():
        print(
            f"a run of {k} command(s), CPU (this process / children): "
            + ", ".join(
                f"{shell} {own * 1000:.1f} / {children * 1000:.1f} ms" for shell, (own, children) in cpu_of_run.items()
            )
        )
    print(
        "a journal start record (600 bytes), wall / CPU: "
        + ", ".join(f"{kind} {wall * 1000:.2f} / {cpu * 1000:.2f} ms" for kind, (wall, cpu) in record.items())
        + " (medians)"
    )
    print("a run's sandbox between commands, PSS: " + ", ".join(f"{name} {kib:,} KiB" for name, kib in memory))


async def cpu_per_run(
    tools: ToolActivities, workspace: str, runs: int, commands: int
) -> dict[str, tuple[float, float]]:
    """CPU seconds per run of `commands` commands and its close, (this process, its children),
    for a run's sandbox and for a sandbox per command; the two alternate run by run."""
    totals = {shell: [0.0, 0.0] for shell in SHELLS}
    for _ in range(runs):
        for shell in SHELLS:
            run_folder = f"bench-run-{uuid.uuid4().hex[:8]}"
            own, both = own_cpu_s(), cpu_s()
            for _ in range(commands):
                await tool_once(tools, workspace, False, shell=shell == "persistent", run_folder=run_folder)
            await RUN_SANDBOXES.end_run(workspace, run_folder)  # as the run's close does: its children reaped
            own = own_cpu_s() - own
            totals[shell][0] += own
            totals[shell][1] += cpu_s() - both - own
    return {shell: (own / runs, children / runs) for shell, (own, children) in totals.items()}


SHELLS = ("persistent", "fresh")
RUN_COMMANDS = (1, 4)
"""Commands per run in `cpu_per_run`: the fleet row's runs make 4."""


async def sandbox_start_cpu(workspace: str, n: int) -> float:
    before = cpu_s()
    for _ in range(n):
        await (await RunSandbox.start(workspace, network=False)).end()
    return (cpu_s() - before) / n


def journal_record_costs(workspace: str, n: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of `write_at` of a start record's size, synced and not, alternating."""
    costs: dict[str, list[tuple[float, float]]] = {"synced": [], "not synced": []}
    with tempfile.TemporaryDirectory(dir=workspace) as folder:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(n):
                for kind, timings in costs.items():
                    began, cpu = time.perf_counter(), own_cpu_s()
                    write_at(folder_fd, f"{i}.{kind}.json", b"x" * 600, 0o600, durable=kind == "synced")
                    timings.append((time.perf_counter() - began, own_cpu_s() - cpu))
        finally:
            os.close(folder_fd)
    return {
        kind: (statistics.median(t[0] for t in timings), statistics.median(t[1] for t in timings))
        for kind, timings in costs.items()
    }


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sandbox_memory_kib() -> list[tuple[str, int]]:
    """(process name, PSS in KiB) of every process of this process's one run sandbox."""
    (sandbox,) = RUN_SANDBOXES._sandboxes.values()
    found = []
    pids = [sandbox.process.pid]
    while pids:
        pid = pids.pop(0)
        pids += map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        pss = next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
        found.append((Path(f"/proc/{pid}/comm").read_text().strip(), pss))
    return found


CPU_VARIANTS = ("sandbox per command", "shell", "unsandboxed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="commands per variant")
    asyncio.run(measure(parser.parse_args().n))


if __name__ == "__main__":
    main()
