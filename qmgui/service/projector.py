"""The vision projector a scan pairs with a model, read for its plan: the CLI's `plan` and the
window's plan, fit badge and "Fit context" all charge it (its weights and its compute bound,
`core.bounds`), because llama-server loads it beside the model (`--mmproj`).

Reading it is a header read (disk), so callers run it where disk reads belong (the CLI, the
window's workers). The window plans on every slider move and sizes every row for its badge:
headers are kept by (path, size, mtime), so a projector is read once until its file changes."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.meta import ModelMeta

KEPT = 64  # projectors remembered (a library has a few; each is a parsed header)

_lock = threading.Lock()
_kept: OrderedDict[tuple[str, int, int], ModelMeta | None] = OrderedDict()


def projector_meta(entry: ModelEntry) -> ModelMeta | None:
    """The projector paired with `entry`, or None: none paired, or one that cannot be read (a
    plan without it rather than no plan; the scan already marked the file)."""
    if not entry.mmproj:
        return None
    try:
        st = os.stat(entry.mmproj)
    except OSError:
        return None
    key = (entry.mmproj, st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    proj = entry_for_path(entry.mmproj)
    meta = proj.meta if proj.meta is not None and not proj.error else None
    with _lock:
        _kept[key] = meta
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return meta
