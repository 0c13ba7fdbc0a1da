"""bench/RESULTS.md says what its own run measured: the time it took and the machine it ran
on, as recorded with the figures, whatever machine renders it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.report import write_results

ROOT = Path(__file__).resolve().parent.parent
MACHINE = {
    "cpu": "Recorded CPU 9000",
    "cores": 7,
    "ram_gb": 3.0,
    "platform": "Linux-recorded",
    "python": "3.11.0",
    "packages": {"temporalio": "0.0-recorded"},
    "temporal": "temporal version 0.0.0-recorded",
}


def render(data: dict, tmp_path: Path) -> str:
    out = tmp_path / "RESULTS.md"
    write_results(data, out, "python -m bench compare")
    return out.read_text()


def test_the_report_gives_its_runs_time_and_the_machine_recorded_when_measuring(tmp_path: Path) -> None:
    data = json.loads((ROOT / "bench" / "RESULTS.json").read_text())
    data["run"]["seconds"] = 2_028.0
    data["run"]["machine"] = MACHINE
    text = render(data, tmp_path)
    assert "(this full run took 33.8 min on 7 cores)" in text
    assert "about 15 min" not in text
    assert "- CPU: Recorded CPU 9000, 7 cores; RAM 3 GB; Linux-recorded" in text
    assert "- Python 3.11.0; temporalio 0.0-recorded" in text
    assert "- Temporal CLI: temporal version 0.0.0-recorded" in text


def test_figures_measured_without_the_machine_do_not_borrow_the_renderers(tmp_path: Path) -> None:
    data = json.loads((ROOT / "bench" / "RESULTS.json").read_text())
    data["run"].pop("machine", None)
    text = render(data, tmp_path)
    assert "- machine and versions: not recorded with these figures" in text
    assert "- CPU:" not in text and "Temporal CLI:" not in text


def test_the_bench_readme_quotes_the_run_that_results_md_holds() -> None:
    """bench/README.md's "Latest figures" are those of the run bench/RESULTS.md holds: they name
    its commit, and no other paragraph names another as the one RESULTS.md holds."""
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    commit = re.search(r"^- durable-agent commit: (\w+)", results, re.MULTILINE)
    assert commit, "RESULTS.md records no commit"
    readme = (ROOT / "bench" / "README.md").read_text()
    latest = readme.split("\n## Latest figures\n", 1)[1].split("\n## ", 1)[0]
    assert f"({commit[1]}," in latest
    claimed = re.findall(r"RESULTS\.md` in the repository is [^.]*? on (\w+)", readme)
    assert set(claimed) <= {commit[1]}, claimed
