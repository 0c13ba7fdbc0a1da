"""Every measured figure in docs/ names the command that produced it (#30).

A figure a throwaway driver produced cannot be checked again, and goes stale unseen. Scope:
a block of a page (a paragraph, a list item, a table) holds a measured figure when it has a
quantity with a unit of time, size or CPU and a word of measuring (median, measured, load
average, CPU per, ...). Such a block, or one before it in the same section, must
name a `python -m bench` command. Settings (a 1.5 s timeout, 64 KB) name no measuring word
and are not figures.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
QUANTITY = re.compile(r"\d[\d,]*(\.\d+)?\s?(ms|s|µs|KiB|MiB|KB|MB|bytes)\b")
MEASURING = re.compile(
    r"\b(measured|measures|median|p90|load average|quiet machine|CPU per|worst|one run|rounds?)\b",
    re.IGNORECASE,
)
COMMAND = re.compile(r"python -m bench[\s.]")
UNBACKED = re.compile(r"throwaway|one-off script|not kept in the repository", re.IGNORECASE)
"""Words that say a figure's driver is not in the repository."""


def blocks(text: str) -> list[tuple[str, str]]:
    """(section heading, block) for each block of a page, in order."""
    found: list[tuple[str, str]] = []
    heading = ""
    for block in re.split(r"\n\s*\n|\n(?=- )", text):
        lines = block.strip("\n").split("\n")
        if lines and lines[0].startswith("#"):
            heading, lines = lines[0], lines[1:]
        if any(line.strip() for line in lines):
            found.append((heading, "\n".join(lines)))
    return found


def unbacked_figures(text: str) -> list[str]:
    """Blocks with a measured figure and no `python -m bench` command in them or before them in their section."""
    problems = []
    named: set[str] = set()
    for heading, block in blocks(text):
        if COMMAND.search(block):
            named.add(heading)
        figure = QUANTITY.search(block) and MEASURING.search(block)
        if figure and (heading not in named or UNBACKED.search(block)):
            problems.append(f"{heading or '(top)'}: {block[:160]!r}")
    return problems


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_figure_in_the_docs_names_its_bench_command(page: str) -> None:
    assert unbacked_figures((DOCS / page).read_text()) == []


def test_a_figure_without_its_command_is_found() -> None:
    measured = "The run took 3.2 s median on a quiet machine."
    assert unbacked_figures(f"# A\n\n{measured}\n") != []
    assert unbacked_figures(f"# A\n\n`python -m bench fleet`:\n\n{measured}\n") == []
    assert unbacked_figures(f"# A\n\n`python -m bench fleet`:\n\n# B\n\n{measured}\n") != []  # another section's
    assert unbacked_figures(f"# A\n\n`python -m bench fleet`; a throwaway driver: {measured}\n") != []
    assert unbacked_figures("# A\n\nThe task timeout is 1.5 s.\n") == []  # a setting, not a figure
