"""Examples that live beside the package, not in it: the demos and the synthetic data and models."""

from __future__ import annotations

import shutil
from pathlib import Path


def private_folder(path: Path, *, fresh: bool = False) -> Path:
    """``path`` as a folder only its owner may read (0700): a demo's work folder holds a run's conf (the lineage
    file), Airflow's metadata database and the data. ``fresh``: emptied first. The folders it creates above
    ``path`` are 0700 too; one already there is tightened, whatever the umask made it."""
    if fresh and path.exists():
        shutil.rmtree(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    for folder in (path, *missing):
        folder.chmod(0o700)  # mkdir's mode is masked by the umask; chmod's is not
    return path
