"""Where the repository and the results live (`$PFLREPRO_RESULTS`, default results/)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def results_root() -> Path:
    return Path(os.environ.get("PFLREPRO_RESULTS", REPO_ROOT / "results"))


def write_atomic(path: Path, data) -> None:
    """Write `path` by rename from a temporary file of this process (`.<name>.<pid>.tmp`, removed when the write fails,
    swept by `sweep_stale_tmp` when its writer was killed): a reader finds the old file or the whole new one. `data`:
    bytes or text, or a function that writes the temporary file given its path (torch.save)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if callable(data):
            data(tmp)
        else:
            tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sweep_stale_tmp(folder: Path) -> list[Path]:
    """Remove the temporary files `.<name>.<pid>.tmp` in `folder` whose writer process is gone (a kill mid-write leaves
    one: the file it was writing is untouched, the temporary is garbage). A live process's are left alone."""
    gone = []
    for tmp in Path(folder).glob(".*.tmp") if Path(folder).is_dir() else ():
        pid = tmp.name[:-4].rpartition(".")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
            gone.append(tmp)
        except PermissionError:   # someone else's live process
            pass
    return gone
