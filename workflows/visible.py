"""Text from a model or a tool, shown to a person as what it is.

Control characters and terminal escape sequences in such text would act on the terminal
that shows them: move the cursor and overwrite the approval line a person reads, set the
window title or the clipboard (OSC 52). Every C0 control but line feed and tab, DEL, every
C1 control and the bidirectional overrides (which reorder what a person reads, "Trojan
source") are shown escaped instead: `\\x1b`, `\\x9b`, `\\u202e`. Pure functions: the workflow
uses them for the Web UI's details, the CLI for everything it prints.
"""

from __future__ import annotations

import re

_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SPACES = re.compile(r" {8,}")


def visible(text: str) -> str:
    """`text` with its controls escaped; line feeds and tabs kept."""
    return _HIDDEN.sub(_escaped, text)


def visible_json(line: str) -> str:
    """JSON text with the controls JSON leaves raw (DEL, C1, bidi) as `\\u` escapes: the
    same JSON, the same decoded bytes, nothing a terminal acts on."""
    return _HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def one_line(text: str) -> str:
    """`text` escaped on one line, whole: line feeds and tabs as `\\n` and `\\t`, and a run of
    8 or more spaces as `[N spaces]`, so nothing hides past the edge of the screen."""
    flat = visible(text).replace("\n", "\\n").replace("\t", "\\t")
    return _SPACES.sub(lambda m: f"[{len(m.group())} spaces]", flat)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
