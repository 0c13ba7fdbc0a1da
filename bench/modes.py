"""The seed's three run modes under the same kills: `python -m bench modes [--steps 40] [--kills 3] [--seed 4]`.

Stateless (a kill loses the run; run again it starts from zero), manual checkpoint (a
snapshot every 10 steps; run again it redoes the steps since) and automatic per step
(durable-agent), each SIGKILLed at the same steps and moments, restarted at once. Prints
steps redone, model calls and tokens wasted, side effects duplicated and time to
completion per mode (`bench.compare.modes`, also part of `python -m bench compare`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from bench.compare import Options, Session, modes
from bench.contenders import DurableContender
from bench.harness import StepScript, bench
from bench.observe import Recorder
from bench.report import git_commit
from durable_agent.connection import connect


async def measure(o: Options) -> dict[str, object]:
    recorder = Recorder(StepScript(o.kill_steps))
    load_before = os.getloadavg()
    with bench(recorder) as b:
        client = await connect(b.server.address)
        durable = DurableContender(b, client)
        await durable.prepare()
        figures = await modes(Session(b, recorder, [durable], o), durable)
    return {
        "commit": git_commit(),
        "steps": o.kill_steps,
        "kills": o.kills,
        "seed": o.seed,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "modes": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args()
    o = Options(kill_steps=args.steps, kills=args.kills, seed=args.seed)
    print(json.dumps(asyncio.run(measure(o)), indent=2), flush=True)
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
