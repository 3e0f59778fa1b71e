"""Go ``strconv`` semantics for the few number and boolean forms HAMi's formats use.

Python's ``int()`` accepts whitespace, underscores and non-ASCII digits; Go does not, so the
codec parses with these helpers and reproduces Go's error texts (HAMi's errors embed them).
"""

from __future__ import annotations

import json
import re

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def quote(s: str) -> str:
    """A double-quoted rendering close to Go's ``%q``."""
    return json.dumps(s, ensure_ascii=False)


def parse_int(s: str, bits: int = 64, func: str = "ParseInt") -> int:
    """Parse a base-10 integer like Go's ``strconv.ParseInt(s, 10, bits)``.

    Args:
        s: the text.
        bits: 32 or 64, the accepted range.
        func: the Go function name used in the error text (``ParseInt`` or ``Atoi``).

    Raises:
        ValueError: with Go's message, for bad syntax or a value out of range.
    """
    if not _DECIMAL.fullmatch(s):
        raise ValueError(f"strconv.{func}: parsing {quote(s)}: invalid syntax")
    value = int(s)
    low, high = (INT32_MIN, INT32_MAX) if bits == 32 else (INT64_MIN, INT64_MAX)
    if not low <= value <= high:
        raise ValueError(f"strconv.{func}: parsing {quote(s)}: value out of range")
    return value


def parse_bool(s: str) -> bool:
    """Parse a boolean like Go's ``strconv.ParseBool``.

    Raises:
        ValueError: with Go's message, for anything but Go's accepted spellings.
    """
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"strconv.ParseBool: parsing {quote(s)}: invalid syntax")


def format_bool(b: bool) -> str:
    """Go's ``%v`` of a bool."""
    return "true" if b else "false"


_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|\u00b5s|ms|s|m|h)", re.ASCII)
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(s: str) -> float:
    """Seconds of a Go ``time.ParseDuration`` string such as ``5m``, ``1h30m`` or ``300s``.

    Raises:
        ValueError: not a Go duration (Go's message: ``time: invalid duration "..."``).
    """
    text = s
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(body):
        m = _DURATION_PART.match(body, pos)
        if m is None:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ValueError(f"time: invalid duration {quote(s)}")
    return sign * total
