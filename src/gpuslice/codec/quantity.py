"""Kubernetes resource quantities (``resource.Quantity``): ``1``, ``500m``, ``1Gi``, ``2e3``.

A small exact parser (``fractions.Fraction``) with Go's accessors: ``Value()`` rounds away from
zero, ``AsInt64()`` succeeds only for an exact integer in int64 range.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from gpuslice.codec import errors, goparse

_SUFFIX_SCALE: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?",
    re.ASCII,
)

MAX_EXPONENT = 100
"""Decimal exponents beyond this are rejected (no real quantity needs them)."""

MAX_LENGTH = 128
"""Longer texts are rejected before parsing."""


def parse(text: object, resource: str) -> Fraction:
    """The exact value of a quantity.

    Args:
        text: the quantity as a string (ints and floats from YAML are accepted too).
        resource: the resource name, for error messages.

    Raises:
        DecodeError: not a Kubernetes quantity.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise errors.DecodeError(
            resource, "quantity", f"quantity must be a string, got {type(text).__name__}"
        )
    s = text if isinstance(text, str) else str(text)
    if isinstance(text, float) and not math.isfinite(text):
        raise errors.DecodeError(resource, "quantity", f"quantity {s} is not finite")
    m = _QUANTITY.fullmatch(s) if len(s) <= MAX_LENGTH else None
    if m is None or not (m["int"] or m["frac"]):
        raise errors.DecodeError(
            resource, "quantity", f"quantity {goparse.quote(s[:MAX_LENGTH])} is not valid"
        )
    digits = m["int"] + (m["frac"] or "")
    value = Fraction(int(digits), 10 ** len(m["frac"] or ""))
    if m["exp"]:
        exponent = int(m["exp"][1:])
        if abs(exponent) > MAX_EXPONENT:
            raise errors.DecodeError(resource, "quantity", f"quantity {goparse.quote(s)} is out of range")
        value *= Fraction(10) ** exponent
    else:
        value *= _SUFFIX_SCALE[m["suffix"] or ""]
    return -value if m["sign"] == "-" else value


def value(q: Fraction) -> int:
    """Go's ``Quantity.Value()``: the integer value rounded away from zero."""
    return math.ceil(q) if q >= 0 else math.floor(q)


def milli_value(q: Fraction) -> int:
    """Go's ``Quantity.MilliValue()``: thousandths, rounded away from zero."""
    return value(q * 1000)


def as_int64(q: Fraction) -> int | None:
    """Go's ``Quantity.AsInt64()``: the value when it is an exact integer in int64 range, else None."""
    if q.denominator != 1 or not goparse.INT64_MIN <= q.numerator <= goparse.INT64_MAX:
        return None
    return q.numerator
