"""The application icon and its "engines running" variant, light enough for the window's first
paint (the tray and the window both use it; nothing here imports more than Qt)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QIcon, QPainter, QPen, QPixmap

__all__ = ["APP_ICON", "ICON_DIR", "ICON_SIZES", "RUNNING_ICON", "app_icon"]

# package data (qmgui/resources/icons): SVG sources and the PNG sizes packaging/make_icons.py
# renders from them (16-24 px from a design drawn for small sizes)
ICON_DIR = Path(str(importlib.resources.files("qmgui") / "resources" / "icons"))
APP_ICON, RUNNING_ICON = "qmgui.svg", "qmgui-running.svg"
ICON_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)


def _drawn_icon(running: bool) -> QIcon:
    """The same design drawn in code, for an install without the resources folder."""
    icon = QIcon()
    for size in (16, 22, 24, 32, 48, 64):
        pm = QPixmap(size, size)
        pm.fill(Qt.GlobalColor.transparent)
        p = QPainter(pm)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.scale(size / 64, size / 64)
        p.setPen(QPen(QColor("#1b2c4b"), 2))
        p.setBrush(QBrush(QColor("#2f4a7a")))
        p.drawRoundedRect(QRectF(2, 2, 60, 60), 13, 13)
        p.setPen(Qt.PenStyle.NoPen)
        for x, top, colour in ((12, 30, "#ffffff"), (26.5, 20, "#ffffff"), (41, 12, "#8fd3ff")):
            p.setBrush(QBrush(QColor(colour)))
            p.drawRoundedRect(QRectF(x, top, 11, 52 - top), 2, 2)
        if running:
            p.setBrush(QBrush(QColor("#ffffff")))
            p.drawEllipse(QPointF(47, 47), 15, 15)
            p.setBrush(QBrush(QColor("#16a34a")))
            p.drawEllipse(QPointF(47, 47), 11.5, 11.5)
        p.end()
        icon.addPixmap(pm)
    return icon


def app_icon(running: bool = False) -> QIcon:
    """The application icon, or its "engines running" variant: the packaged PNG sizes (no SVG
    plugin needed, small sizes hinted), else the SVG, else the same design drawn in code."""
    svg = ICON_DIR / (RUNNING_ICON if running else APP_ICON)
    icon = QIcon()
    for size in ICON_SIZES:
        png = ICON_DIR / f"{svg.stem}-{size}.png"
        if png.is_file():
            icon.addFile(str(png), QSize(size, size))
    if icon.isNull() and svg.is_file():
        icon = QIcon(str(svg))
    if not icon.isNull() and not icon.pixmap(16, 16).isNull():
        return icon
    return _drawn_icon(running)
