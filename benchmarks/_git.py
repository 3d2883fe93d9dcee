"""A commit checked out beside this one, for the benchmarks that measure a baseline in the same run."""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def worktree(ref: str, path: Path | None = None) -> tuple[Path, str]:
    """A detached `git worktree` of `ref` at `path` (default: one folder per commit under the temp dir, reused when
    it is there already); (path, full commit)."""
    sha = subprocess.run(["git", "rev-parse", ref], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    path = path or Path(tempfile.gettempdir()) / f"pflrepro-bench-{sha[:10]}"
    if not (path / "pflrepro").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(path), sha], cwd=REPO, check=True,
                       capture_output=True)
    return path, sha
