"""How deeply a JSON request body nests, measured before it is decoded.

msgspec's decoder recurses once per level of arrays and objects, also where it only skips an
unknown field or keeps a ``msgspec.Raw``; past the interpreter's recursion limit it raises
``RecursionError``, so a body nested a thousand levels deep would end as a 500. The app answers
bodies deeper than ``max_json_depth`` with a 400 before any decoder sees them, using ``too_deep``.

Both steps run at C speed (numpy and ``bytes`` methods, no Python loop over the body):

1. the count of ``[`` and ``{`` bytes bounds the depth from above; kube-scheduler's bodies for
   ordinary pods stay under the limit here (a few microseconds for 50 KB);
2. otherwise brackets inside strings are discounted: a quote is escaped when an odd run of
   backslashes precedes it, and a bracket is outside every string when an even number of
   unescaped quotes precede it; the depth is the largest running sum of +1 (``[``, ``{``) and -1
   (``]``, ``}``) over those brackets.

It relies on JSON's grammar only: in UTF-8 the bytes of quotes, backslashes and brackets never
occur inside a multi-byte character, and outside strings a backslash is invalid. For invalid JSON
the scan is exact up to the first byte a parser rejects, so it never understates how deep a
decoder gets before it fails.
"""

from __future__ import annotations

import numpy as np

_OPEN = 0x7B  # '{'; '[' (0x5B) folds onto it with | 0x20
_CLOSE = 0x7D  # '}'; ']' (0x5D) folds onto it
_QUOTE = 0x22
_BACKSLASH = 0x5C


def _escaped(slashes: np.ndarray) -> np.ndarray:
    """Positions of the bytes that the backslashes at ``slashes`` (sorted) escape."""
    order = np.arange(slashes.size)
    starts = np.empty(slashes.size, np.bool_)
    starts[0] = True
    np.not_equal(np.diff(slashes), 1, out=starts[1:])
    run_start = np.maximum.accumulate(np.where(starts, order, 0))
    # In a run of backslashes the 1st, 3rd, ... escapes the byte after it (``\\`` is one escape).
    escaped: np.ndarray = slashes[((order - run_start) & 1) == 0] + 1
    return escaped


def _depth(data: bytes, a: np.ndarray, folded: np.ndarray, opens: np.ndarray) -> int:
    """``max_depth`` of ``data``.

    ``a`` is ``data`` as bytes, ``folded`` has ``[`` and ``]`` folded onto ``{`` and ``}``, and
    ``opens`` is where ``folded`` is ``{``.
    """
    brackets = np.flatnonzero(opens | (folded == _CLOSE))
    if not brackets.size:
        return 0
    quotes = a == _QUOTE
    if b"\\" in data:
        escaped = _escaped(np.flatnonzero(a == _BACKSLASH))
        quotes[escaped[escaped < a.size]] = False
    # Parity of the unescaped quotes before each bracket: before the first one, then per stretch
    # between two brackets (xor of 0/1 bytes), accumulated.
    stretch = np.bitwise_xor.reduceat(quotes.view(np.uint8), brackets)
    parity = np.empty_like(stretch)
    parity[0] = np.count_nonzero(quotes[: brackets[0]]) & 1
    np.bitwise_xor(np.bitwise_xor.accumulate(stretch[:-1]), parity[0], out=parity[1:])
    steps = np.where(opens[brackets[parity == 0]], 1, -1)
    if not steps.size:
        return 0
    return max(0, int(np.cumsum(steps).max()))


def max_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (0 for a scalar).

    Args:
        data: the JSON text (UTF-8); need not be valid (see the module docstring).

    Returns:
        The largest number of arrays and objects open at once, brackets inside strings ignored.
    """
    a = np.frombuffer(data, np.uint8)
    folded = a | 0x20
    return _depth(data, a, folded, folded == _OPEN)


def too_deep(data: bytes, limit: int) -> bool:
    """True when ``data`` nests arrays and objects deeper than ``limit`` levels.

    The exact scan (``max_depth``) runs only when the count of ``[`` and ``{`` exceeds ``limit``.
    """
    a = np.frombuffer(data, np.uint8)
    folded = a | 0x20
    opens = folded == _OPEN
    if np.count_nonzero(opens) <= limit:
        return False
    return _depth(data, a, folded, opens) > limit
