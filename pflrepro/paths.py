"""Where the repository and the results live (`$PFLREPRO_RESULTS`, default results/)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def results_root() -> Path:
    return Path(os.environ.get("PFLREPRO_RESULTS", REPO_ROOT / "results"))
