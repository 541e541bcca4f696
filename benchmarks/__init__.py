"""Benchmarks and evaluations: each module runs with ``python -m benchmarks.<name>``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(out: Path, stem: str, results: Any, text: str) -> None:
    """An evaluation's results as ``<stem>.json`` and its printed report as ``<stem>.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(text)
