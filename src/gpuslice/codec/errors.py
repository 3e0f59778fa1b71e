"""The one exception the codec raises for malformed input."""

from __future__ import annotations


class DecodeError(ValueError):
    """A value (annotation, resource quantity, pod field) could not be decoded.

    The message starts with the detail (for the legacy registration format, HAMi's own error
    text), followed by where the problem was, so logs can be matched against HAMi's.

    Attributes:
        annotation: the annotation key or resource name whose value was wrong.
        field: the field name or position inside the value that was wrong.
        detail: what was wrong, without the location.
    """

    def __init__(self, annotation: str, field: str, detail: str) -> None:
        self.annotation = annotation
        self.field = field
        self.detail = detail
        super().__init__(f"{detail} [{annotation}, {field}]")


class AnnotationMissing(DecodeError):
    """A required annotation is absent (e.g. a node without ``hami.io/node-nvidia-register``)."""

    def __init__(self, annotation: str) -> None:
        super().__init__(annotation, "value", f"annos not found {annotation}")
