"""bench/RESULTS.md says what its own run measured: the time it took and the machine it ran
on, as recorded with the figures, whatever machine renders it."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import output_file, write_results
from tests.unprivileged import nobody_folder, unprivileged_argv, unprivileged_unavailable

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


def test_an_out_file_that_cannot_be_written_is_refused_before_anything_is_measured(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="its folder cannot be made"):
        output_file(f"{blocker}/RESULTS.md")
    with pytest.raises(argparse.ArgumentTypeError, match="a folder"):
        output_file(str(tmp_path))
    made = output_file(str(tmp_path / "new" / "deeper" / "RESULTS.md"))
    assert made.parent.is_dir() and not made.exists()  # its folder made now; the file only once measured


def test_an_out_file_in_a_folder_the_user_may_not_write_is_refused() -> None:
    folder = nobody_folder()  # root's, 0755: nobody may read it, not write in it
    check = f"from bench.report import output_file; output_file({str(folder / 'RESULTS.md')!r})"
    try:
        if os.getuid() != 0:  # this user is unprivileged already: a folder of its own, closed to writes
            folder.chmod(0o555)
            with pytest.raises(argparse.ArgumentTypeError, match="its folder is not writable"):
                output_file(str(folder / "RESULTS.md"))
            return
        if (why := unprivileged_unavailable()) is not None:
            pytest.skip(why)
        done = subprocess.run(
            unprivileged_argv([sys.executable, "-c", check], folder), cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode != 0 and "its folder is not writable" in done.stderr, done.stderr[-2000:]
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


def test_bench_fleet_refuses_an_out_it_cannot_write_at_once(tmp_path: Path) -> None:
    pytest.importorskip("psutil")  # the bench extra, which `python -m bench fleet` needs
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "fleet", "--agents", "1", "--out", f"{blocker}/fleet.json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "cannot write" in done.stderr and not done.stdout, done
