"""Render qmgui's icons from their SVG sources: PNG sizes for the app, the tray and the
freedesktop icon theme, and a multi-size Windows .ico. The outputs are committed; run this
after changing an SVG:

    .venv/bin/python packaging/make_icons.py          # write the files
    .venv/bin/python packaging/make_icons.py --check  # exit 1 if a file is out of date
    .venv/bin/python packaging/make_icons.py --preview /tmp/icons.png  # on light/dark panels

16-24 px are drawn from the `*-small.svg` designs (a 16-pixel grid, a light rim for dark
panels); 32 px and up from the full designs. Only Qt (QtSvg from PySide6-Essentials) is used.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ROOT = Path(__file__).resolve().parents[1]
ICONS = ROOT / "qmgui" / "resources" / "icons"
ICO = ROOT / "resources" / "windows" / "qmgui.ico"
SMALL = (16, 22, 24)  # drawn from the 16-pixel-grid design
APP_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
RUNNING_SIZES = (16, 22, 24, 32, 48, 64)  # the tray's "engines running" variant
ICO_SIZES = (16, 24, 32, 48, 64, 256)


def render(svg: Path, size: int) -> QImage:
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"make_icons: {svg} is not a valid SVG")
    img = QImage(size, size, QImage.Format.Format_ARGB32)
    img.fill(Qt.GlobalColor.transparent)
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(p, QRectF(0, 0, size, size))
    p.end()
    return img


def source(name: str, size: int) -> Path:
    return ICONS / (f"{name}-small.svg" if size in SMALL else f"{name}.svg")


def png_bytes(img: QImage) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    img.save(buf, "PNG")
    buf.close()
    return bytes(data.data())


def dib_bytes(img: QImage) -> bytes:
    """A 32-bit BGRA DIB as an .ico stores it: height doubled, rows bottom-up, AND mask."""
    img = img.convertToFormat(QImage.Format.Format_ARGB32)  # BGRA in memory (little-endian)
    w, h = img.width(), img.height()
    header = struct.pack("<IiiHHIIiiII", 40, w, 2 * h, 1, 32, 0, w * h * 4, 0, 0, 0, 0)
    rows = []
    for y in range(h - 1, -1, -1):
        line = img.constScanLine(y)
        rows.append(bytes(line)[: w * 4])
    mask_row = ((w + 31) // 32) * 4
    return header + b"".join(rows) + bytes(mask_row * h)  # all-zero mask: alpha decides


def ico_bytes(images: list[QImage]) -> bytes:
    """A Windows .ico: BMP entries below 256 px (every reader), PNG at 256 (Vista and later)."""
    blobs = [png_bytes(i) if i.width() >= 256 else dib_bytes(i) for i in images]
    out = struct.pack("<HHH", 0, 1, len(images))
    offset = 6 + 16 * len(images)
    for img, blob in zip(images, blobs, strict=True):
        dim = 0 if img.width() >= 256 else img.width()
        out += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(blob), offset)
        offset += len(blob)
    return out + b"".join(blobs)


def outputs() -> dict[Path, bytes]:
    files: dict[Path, bytes] = {}
    for name, sizes in (("qmgui", APP_SIZES), ("qmgui-running", RUNNING_SIZES)):
        for size in sizes:
            files[ICONS / f"{name}-{size}.png"] = png_bytes(render(source(name, size), size))
    files[ICO] = ico_bytes([render(source("qmgui", s), s) for s in ICO_SIZES])
    return files


def preview(path: Path) -> None:
    """Both variants at 16, 22, 24, 32 and 48 px on a light and a dark panel, 4x magnified."""
    sizes = (16, 22, 24, 32, 48)
    cell = 56
    sheet = QImage(cell * len(sizes) * 2, cell * 2, QImage.Format.Format_ARGB32)
    p = QPainter(sheet)
    for row, panel in enumerate(("#eeeeee", "#2b2b2b")):
        p.fillRect(0, row * cell, sheet.width(), cell, QColor(panel))
        for col, (name, size) in enumerate(
            (n, s) for n in ("qmgui", "qmgui-running") for s in sizes
        ):
            img = render(source(name, size), size)
            p.drawImage(col * cell + (cell - size) // 2, row * cell + (cell - size) // 2, img)
    p.end()
    sheet.scaled(sheet.width() * 4, sheet.height() * 4).save(str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare, exit 1 if out of date")
    ap.add_argument("--preview", metavar="PNG", help="also write a magnified preview sheet")
    args = ap.parse_args(argv)
    _app = QGuiApplication.instance() or QGuiApplication(["make_icons"])
    stale = []
    for path, data in outputs().items():
        if path.is_file() and path.read_bytes() == data:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path.relative_to(ROOT)}")
    if args.preview:
        preview(Path(args.preview))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
