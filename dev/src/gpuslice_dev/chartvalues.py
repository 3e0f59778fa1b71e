"""The Helm chart's values table: generated from ``values.yaml`` comments into the README.

A key documented with a ``# -- text`` comment right above it (continued on ``#   more`` lines, the
convention of the helm-docs tool) becomes one row: its dotted path, its default from the parsed
YAML, and the text. Keys without such a comment are containers whose children carry the rows.

Usage::

    python -m gpuslice_dev.chartvalues charts/gpuslice/values.yaml README.md          # rewrite
    python -m gpuslice_dev.chartvalues charts/gpuslice/values.yaml README.md --check  # exit 1 if stale

The table sits in the README between ``BEGIN``/``END`` marker comments.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

BEGIN = "<!-- values-table:begin (generated from charts/gpuslice/values.yaml: make chart-docs) -->"
END = "<!-- values-table:end -->"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")
_DOC = re.compile(r"^\s*# -- ?(?P<text>.*)$")
_MORE = re.compile(r"^\s*#\s{2,}(?P<text>\S.*)$")


def documented(text: str) -> list[tuple[str, str]]:
    """``(dotted key, description)`` for every documented key, in file order."""
    rows: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in text.splitlines():
        doc = _DOC.match(line)
        if doc:
            pending = [doc.group("text").strip()]
            continue
        more = _MORE.match(line)
        if more and pending is not None:
            pending.append(more.group("text").strip())
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            pending = None if not line.strip() else pending
            continue
        key = _KEY.match(line)
        if key is None:  # list items and continuation lines of values
            continue
        indent = len(key.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key.group("key")))
        if pending is not None:
            rows.append((".".join(k for _, k in stack), " ".join(pending)))
        pending = None
    return rows


def _lookup(values: Any, dotted: str) -> Any:
    node = values
    for part in dotted.split("."):
        node = node[part]
    return node


def _cell(value: Any) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return "`" + text.replace("|", "\\|") + "`"


def table(values_text: str) -> str:
    """The markdown table of ``values_text`` (a values.yaml)."""
    values = yaml.safe_load(values_text)
    lines = ["| Key | Default | Description |", "|---|---|---|"]
    for key, text in documented(values_text):
        escaped = text.replace("|", "\\|")
        lines.append(f"| `{key}` | {_cell(_lookup(values, key))} | {escaped} |")
    return "\n".join(lines) + "\n"


def splice(readme: str, generated: str) -> str:
    """``readme`` with the text between the markers replaced by ``generated``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README lacks the markers {BEGIN!r} ... {END!r}")
    return readme[: start + len(BEGIN)] + "\n" + generated + readme[end:]


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite (or with ``--check`` verify) the README's values table; 1 when stale."""
    parser = argparse.ArgumentParser(description="Generate the chart values table into a README.")
    parser.add_argument("values", type=Path)
    parser.add_argument("readme", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is out of date")
    args = parser.parse_args(argv)
    current = args.readme.read_text()
    wanted = splice(current, table(args.values.read_text()))
    if wanted == current:
        return 0
    if args.check:
        print(f"{args.readme}: values table is stale; run make chart-docs", file=sys.stderr)
        return 1
    args.readme.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
