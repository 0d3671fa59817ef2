"""Text as PostgreSQL (and Arrow) can store it: the one rule for every error text, reason and
payload-derived string we write (consumer and relay dead letters, the side-effect ledger,
the lake's quarantine). Pure: standard library only.

PostgreSQL's ``text`` and ``jsonb`` refuse NUL (U+0000). UTF-8 has no encoding for a lone
surrogate (U+D800 to U+DFFF), which a Python ``str`` can hold: JSON may escape one
(``json.loads('"\\ud800"')``), and ``surrogateescape`` decoding makes them of undecodable
bytes. psycopg then fails to send the whole statement with ``UnicodeEncodeError``: a
consumer that wrote a handler's error quoting such a payload into its dead letters stopped
on that record, again after every restart. Both become U+FFFD, the replacement character;
a surrogate pair held as two code points is joined into its character. Names that identify
a row (a consumer, an event id, a message id) are not changed but refused:
:func:`is_storable` tells.
"""

from __future__ import annotations

__all__ = ["MAX_REASON_CHARS", "REPLACEMENT", "is_storable", "storable_text"]

REPLACEMENT = "\ufffd"
MAX_REASON_CHARS = 4000
"""A reason (an error's text, a third party's answer) is cut to this many characters."""


def is_storable(text: str) -> bool:
    """True when PostgreSQL can store ``text`` as it is: no NUL, no lone surrogate."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable_text(text: str, *, max_chars: int | None = None) -> str:
    """``text`` with each NUL and lone surrogate replaced by U+FFFD, at most ``max_chars``
    characters long. Text that was storable comes back unchanged (the same object)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 with surrogatepass writes every code unit as it is; decoding joins valid
        # pairs and replaces the lone ones. (-le: no byte order mark added or taken.)
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars]
    return text
