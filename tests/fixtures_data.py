"""Paths and expectations of the committed fixtures (shared with the C++ tests)."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CORRUPT = FIXTURES / "corrupt"
MANIFEST: dict = json.loads((FIXTURES / "MANIFEST.json").read_text())
EXPECTED: dict = json.loads((CORRUPT / "EXPECTED.json").read_text())
GOOD = sorted(MANIFEST)
BAD = sorted(EXPECTED)
