"""The two fields of an X.509 certificate gpuslice reads: serial number and notAfter.

Certificates come as PEM (RFC 7468), each a base64 DER ``Certificate`` (RFC 5280 section 4.1)::

    Certificate ::= SEQUENCE { tbsCertificate TBSCertificate, ... }
    TBSCertificate ::= SEQUENCE { version [0] EXPLICIT OPTIONAL, serialNumber INTEGER,
        signature AlgorithmIdentifier, issuer Name, validity Validity, ... }
    Validity ::= SEQUENCE { notBefore Time, notAfter Time }
    Time ::= CHOICE { utcTime UTCTime, generalTime GeneralizedTime }

The standard library decodes a certificate only for a peer (``SSLSocket.getpeercert``) or a
loaded CA (``SSLContext.get_ca_certs``), not for a file we serve, and ``cryptography`` is not a
dependency of gpuslice; these few DER steps read what the expiry metric needs.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import re

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE, _INTEGER, _UTC_TIME, _GENERALIZED_TIME, _VERSION = 0x30, 0x02, 0x17, 0x18, 0xA0


@dataclasses.dataclass(frozen=True)
class Certificate:
    """What gpuslice reads of one certificate."""

    serial: int
    not_after: float
    """Unix seconds."""


def _tlv(der: bytes, pos: int, limit: int) -> tuple[int, int, int]:
    """``(tag, first content byte, end)`` of the DER element at ``pos`` (ending at most at ``limit``).

    Raises:
        ValueError: not a DER element that fits (high tag numbers and indefinite lengths too).
    """
    if pos + 2 > limit:
        raise ValueError("truncated DER")
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if tag & 0x1F == 0x1F:
        raise ValueError("unexpected DER tag")
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4 or pos + count > limit:
            raise ValueError("bad DER length")
        length = int.from_bytes(der[pos : pos + count], "big")
        pos += count
    if pos + length > limit:
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _expect(der: bytes, pos: int, limit: int, tag: int) -> tuple[int, int]:
    got, start, end = _tlv(der, pos, limit)
    if got != tag:
        raise ValueError(f"expected DER tag {tag:#x}, got {got:#x}")
    return start, end


def _time(tag: int, text: bytes) -> float:
    """A UTCTime (``YYMMDDHHMMSSZ``, years 1950-2049) or GeneralizedTime (``YYYYMMDDHHMMSSZ``)."""
    value = text.decode("ascii")
    if tag == _UTC_TIME and len(value) == 13:
        year = int(value[:2])
        value = ("19" if year >= 50 else "20") + value
    elif not (tag == _GENERALIZED_TIME and len(value) == 15):
        raise ValueError(f"unsupported certificate time {value!r}")
    parsed = dt.datetime.strptime(value, "%Y%m%d%H%M%SZ").replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def decode(der: bytes) -> Certificate:
    """The serial and notAfter of one DER certificate.

    Raises:
        ValueError: not a certificate.
    """
    start, end = _expect(der, 0, len(der), _SEQUENCE)  # Certificate
    pos, tbs_end = _expect(der, start, end, _SEQUENCE)  # TBSCertificate
    tag, _, after = _tlv(der, pos, tbs_end)
    if tag == _VERSION:
        pos = after
    serial_start, pos = _expect(der, pos, tbs_end, _INTEGER)
    serial = int.from_bytes(der[serial_start:pos], "big", signed=True)
    for _ in range(2):  # signature, issuer
        _, pos = _expect(der, pos, tbs_end, _SEQUENCE)
    pos, validity_end = _expect(der, pos, tbs_end, _SEQUENCE)
    _, _, pos = _tlv(der, pos, validity_end)  # notBefore
    tag, start, end = _tlv(der, pos, validity_end)
    return Certificate(serial=serial, not_after=_time(tag, der[start:end]))


def certificates(pem: bytes) -> list[Certificate]:
    """Every certificate of a PEM bundle, in order.

    Raises:
        ValueError: no certificate, or one that does not decode.
    """
    found: list[Certificate] = []
    for block in _PEM.findall(pem):
        try:
            der = base64.b64decode(b"".join(block.split()), validate=True)
        except binascii.Error as err:
            raise ValueError(f"bad PEM: {err}") from None
        found.append(decode(der))
    if not found:
        raise ValueError("no PEM certificate")
    return found
