"""Model prices in USD per million tokens, so cost budgets count real money.

Overridable without a release: `DURABLE_AGENT_PRICES` is a JSON file path or inline JSON
object `{"model": {"input_per_million": 0.4, "output_per_million": 1.6}}`, merged over
the built-in table. An unknown model has no price: its cost counts as 0 and the run's
status says the cost is unknown.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

from workflows.types import Price

BUILT_IN: dict[str, tuple[float, float]] = {
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "o3": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
}

_DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")


@cache
def price_table() -> dict[str, Price]:
    table = {name: Price(input_per_million=i, output_per_million=o) for name, (i, o) in BUILT_IN.items()}
    override = os.environ.get("DURABLE_AGENT_PRICES", "").strip()
    if not override:
        return table
    text = override if override.startswith("{") else Path(override).read_text()
    for name, price in json.loads(text).items():
        table[name] = Price.model_validate(price)
    return table


def price_of(model: str) -> Price | None:
    table = price_table()
    return table.get(model) or table.get(_DATED.sub("", model))
