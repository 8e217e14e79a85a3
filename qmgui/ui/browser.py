"""Opening an address in the user's browser: one seam, so tests replace `open_url`."""

from __future__ import annotations

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices


def open_url(url: str) -> bool:
    """Hand `url` to the desktop's browser (returns at once); whether it was taken."""
    return bool(QDesktopServices.openUrl(QUrl(url)))
