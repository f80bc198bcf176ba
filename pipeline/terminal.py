"""Journal content bound for a terminal: control characters shown, never obeyed.

Anything in a journal (a model's answer, a webhook's text, a payload an integration wrote) may hold
escape sequences that would retitle or clear the reader's terminal, carriage returns that overwrite
what was printed, or bidirectional overrides that make text read differently from what it is. Every
human-readable printer of journal content passes it through `escape_controls`; JSON output passes
through `escape_json_controls`, which keeps it valid JSON that decodes to the same text.
"""

from __future__ import annotations

# C0 (0x00-0x1f), DEL (0x7f) and C1 (0x80-0x9f) controls, and the bidirectional embeddings,
# overrides and isolates (U+202A-U+202E, U+2066-U+2069).
_CONTROL_CODES = (*range(0x00, 0x20), *range(0x7F, 0xA0))
_BIDI_CODES = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Kept as they are where output spans lines (`agent show`): they move the cursor down or right only.
_LAYOUT = ("\n", "\t")


def _visible(char: str) -> str:
    code = ord(char)
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


_ONE_LINE = str.maketrans({code: _visible(chr(code)) for code in (*_CONTROL_CODES, *_BIDI_CODES)})
_MULTI_LINE = str.maketrans(
    {code: _visible(chr(code)) for code in (*_CONTROL_CODES, *_BIDI_CODES) if chr(code) not in _LAYOUT}
)
# JSON text already escapes C0 inside strings (RFC 8259) and holds none outside them; DEL, C1 and the
# bidi controls may stand raw in a string, and `\\uXXXX` is what JSON itself would write for them.
_JSON = str.maketrans({code: f"\\u{code:04x}" for code in (*range(0x7F, 0xA0), *_BIDI_CODES)})


def escape_controls(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control character written visibly: `\\n`, `\\r`, `\\t`, `\\x1b`, `\\x9b`,
    `\\u202e`. With `keep_newlines`, newlines and tabs stay as they are (multi-line output)."""
    if text.isprintable():  # the common case, and no control character is printable
        return text
    return text.translate(_MULTI_LINE if keep_newlines else _ONE_LINE)


def escape_json_controls(json_text: str) -> str:
    """JSON text with DEL, C1 and bidi controls written as `\\uXXXX` escapes: still valid JSON that
    decodes to the same values, and safe to show on a terminal."""
    return json_text.translate(_JSON)
