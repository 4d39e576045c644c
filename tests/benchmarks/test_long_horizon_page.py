"""The long-horizon research page is generated from the committed result file, never edited by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import long_horizon_page  # noqa: E402


def test_the_page_is_generated_from_the_committed_result() -> None:
    assert long_horizon_page.main(["--check"]) == 0, "run python benchmarks/long_horizon_page.py and commit"
