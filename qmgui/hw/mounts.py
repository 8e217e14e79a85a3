"""Which filesystem a model file lives on, and whether that is a network one.

llama-server maps the weights (`mmap`) by default: pages come from the file as the engine
touches them, and the kernel may drop them under memory pressure and read them again. On a
network filesystem (NFS, SMB/CIFS, sshfs and other FUSE network mounts, 9p) every such read
crosses the network, so a model there is better read into RAM once (`--no-mmap`) when it fits
(`qmgui.core.disk` decides). Linux: the mount table of this process (`/proc/self/mountinfo`,
the longest mount point that contains the file's real path). Windows: the drive type of the
path's root (a mapped network drive or a UNC path). Elsewhere, or when in doubt: unknown.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    point: str  # where it is mounted ("" when unknown, e.g. Windows)
    fstype: str  # as the kernel names it: nfs4, cifs, fuse.sshfs, ext4… ("remote" on Windows)
    source: str = ""  # what is mounted (server:/export, //host/share), for messages


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040...)."""
    out, i = [], 0
    while i < len(field):
        ch = field[i]
        if ch == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            try:
                out.append(chr(int(field[i + 1 : i + 4], 8)))
                i += 4
                continue
            except ValueError:
                pass
        out.append(ch)
        i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a mountinfo text (malformed lines are skipped)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        a, b = left.split(), right.split()
        if len(a) < 5 or len(b) < 2:
            continue
        mounts.append(Mount(_unescape(a[4]), b[0], _unescape(b[1])))
    return mounts


def _contains(point: str, path: str) -> bool:
    if point == "/":
        return path.startswith("/")
    return path == point or path.startswith(point.rstrip("/") + "/")


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding `path` (an absolute, resolved path): the longest matching point; of
    mounts stacked on the same point, the last (the one on top)."""
    best: Mount | None = None
    for m in mounts:
        if _contains(m.point, path) and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def _windows_mount(path: str) -> Mount | None:
    import ctypes  # noqa: PLC0415 - Windows only

    root = os.path.splitdrive(os.path.abspath(path))[0]
    if root.startswith(("\\\\", "//")):
        return Mount("", "remote", root)
    try:
        kind = ctypes.windll.kernel32.GetDriveTypeW(root + "\\")  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None
    drive_remote = 4
    return Mount(root, "remote" if kind == drive_remote else "local", root)


def filesystem_of(path: str, *, mountinfo: str | None = None) -> Mount | None:
    """The filesystem `path` is on (None when it cannot be told). `mountinfo` is a recorded
    table (tests); by default this process's."""
    if sys.platform == "win32" and mountinfo is None:
        return _windows_mount(path)
    if mountinfo is None:
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
                mountinfo = f.read(4 << 20)
        except OSError:
            return None
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    return mount_of(real, parse_mountinfo(mountinfo))
