"""pydantic's validation errors as a person reads them: the field, then what is wrong."""

from __future__ import annotations

from pydantic import ValidationError

_PLAIN = {
    "extra_forbidden": "unknown field",
    "missing": "required",
}


def validation_text(error: ValidationError) -> str:
    """`limits.hard_steps: must be >= 1; goal: required`, without pydantic's wording."""
    return "; ".join(_item_text(item) for item in error.errors())


def _item_text(item: dict) -> str:  # type: ignore[type-arg]
    where = ".".join(str(part) for part in item["loc"])
    if item["type"] == "value_error":
        what = str(item["ctx"]["error"])  # our own validator's message, without "Value error, "
    else:
        what = _PLAIN.get(item["type"]) or _lowercase_first(item["msg"])
    return f"{where}: {what}" if where else what


def _lowercase_first(text: str) -> str:
    return text[:1].lower() + text[1:]
