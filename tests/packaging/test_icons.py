"""The icons: package data the running app loads, the PNG sizes and the Windows .ico."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from qmgui.ui import icons

ROOT = Path(__file__).resolve().parents[2]
ICO = ROOT / "resources" / "windows" / "qmgui.ico"


def test_the_icon_folder_is_package_data() -> None:
    # importlib.resources finds it in a checkout, a wheel and the PyInstaller bundle alike
    assert icons.ICON_DIR == ROOT / "qmgui" / "resources" / "icons"
    for name in ("qmgui.svg", "qmgui-running.svg", "qmgui-small.svg", "qmgui-running-small.svg"):
        assert (icons.ICON_DIR / name).is_file()


@pytest.mark.parametrize("stem", ["qmgui", "qmgui-running"])
@pytest.mark.parametrize("size", [16, 22, 24, 32, 48, 64])
def test_pngs_have_their_size_and_show_something(stem: str, size: int, qapp) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtGui import QImage

    img = QImage(str(icons.ICON_DIR / f"{stem}-{size}.png"))
    assert (img.width(), img.height()) == (size, size)
    opaque = sum(img.pixelColor(x, y).alpha() > 200 for x in range(size) for y in range(size))
    assert opaque > size * size // 2  # a filled tile, not a faint outline


@pytest.mark.parametrize("size", [16, 24])
def test_tray_icons_read_at_small_sizes_and_differ_when_engines_run(size: int, qapp) -> None:  # type: ignore[no-untyped-def]
    idle = icons.app_icon(False).pixmap(size, size).toImage()
    busy = icons.app_icon(True).pixmap(size, size).toImage()
    assert idle.width() == size and busy.width() == size

    def greens(img) -> int:  # type: ignore[no-untyped-def]
        cols = (img.pixelColor(x, y) for x in range(size) for y in range(size))
        return sum(c.green() > 120 and c.red() < 80 and c.blue() < 120 for c in cols)

    assert greens(busy) >= size // 2 and greens(idle) == 0  # the green "live" dot
    # a light rim: the tile stays visible on a dark panel
    edge = idle.pixelColor(size // 2, 0)
    assert edge.lightness() > 120 and edge.alpha() > 128


def test_app_icon_offers_every_packaged_size(qapp) -> None:  # type: ignore[no-untyped-def]
    sizes = {s.width() for s in icons.app_icon(False).availableSizes()}
    assert {16, 22, 24, 32, 48, 64, 128, 256, 512} <= sizes


def test_ico_holds_the_windows_sizes() -> None:
    data = ICO.read_bytes()
    reserved, kind, count = struct.unpack_from("<HHH", data)
    assert (reserved, kind) == (0, 1)
    sizes = []
    for i in range(count):
        entry = struct.unpack_from("<BBBBHHII", data, 6 + 16 * i)
        w, _h, _colours, _reserved, planes, bpp, length, offset = entry
        assert offset + length <= len(data) and bpp == 32 and planes == 1
        sizes.append(w or 256)
        blob = data[offset : offset + length]
        assert blob.startswith(b"\x89PNG") if (w or 256) == 256 else blob[:4] == b"(\0\0\0"
    assert sorted(sizes) == [16, 24, 32, 48, 64, 256]
