"""What redaction costs per KiB of tool output: `python -m bench redaction [--n 2000]`.

The redactor a worker builds (activities/redaction.py) with two secret variables set,
applied to real command output of two kinds: ordinary text (`ls -la /usr/bin`, cut to
3.3 KiB) and hex-like text (`python -m pip list` with each line's version as hex, cut to
3.7 KiB: the runs of hex digits are what the hex check decodes). Per text: the median
time of one `Redactor.text` call over `--n` calls, and per KiB. Pure CPU in this process,
so the machine's load shows in it: say the load with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from activities.redaction import Redactor, secret_env
from bench.report import git_commit

SECRETS = {"OPENAI_API_KEY": "sk-bench-" + "a1b2c3d4" * 5, "DEPLOY_TOKEN": "tok_" + "9f8e7d6c" * 4}


def ordinary_text() -> str:
    listing = subprocess.run(["ls", "-la", "/usr/bin"], capture_output=True, text=True, check=True).stdout
    return listing[: 33 * 1024 // 10]


def hex_like_text() -> str:
    packages = subprocess.run(
        [sys.executable, "-m", "pip", "list"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    lines = [f"{name:<40} {name.encode().hex()}" for name, *_ in (line.split() for line in packages[2:] if line)]
    return "\n".join(lines * 4)[: 37 * 1024 // 10]


def per_call_ms(redactor: Redactor, text: str, n: int) -> float:
    times = []
    for _ in range(n):
        began = time.perf_counter()
        redactor.text(text)
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    redactor = Redactor(secret_env(SECRETS))
    load = os.getloadavg()[0]
    figures = {}
    for name, text in (("ordinary (ls -la)", ordinary_text()), ("hex-like (pip list as hex)", hex_like_text())):
        ms = per_call_ms(redactor, text, args.n)
        kib = len(text.encode()) / 1024
        figures[name] = {"kib": round(kib, 2), "ms_per_call": round(ms, 4), "ms_per_kib": round(ms / kib, 4)}
    result = {"commit": git_commit(), "secrets": len(SECRETS), "load_average": round(load, 2), "texts": figures}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
