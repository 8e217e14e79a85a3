"""Replacing a file whole: a temporary file beside it, written and flushed to disk, then renamed
over it. A reader (another qmgui, a crash) sees the old file or the new one, never half of one.
Used by the stores qmgui rewrites (the engines' run registry, the residuals, the device cache);
the settings file has its own, which also syncs the folder and keeps an unusable file aside."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_file(path: Path, data: bytes, *, prefix: str, suffix: str = ".tmp") -> None:
    """`path` now holds `data`; OSError (the temporary file removed) when it cannot."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
