"""The disk rule applied to a launch: a model on a network filesystem is read into RAM once
(`--no-mmap`) when its weights fit in 85% of RAM (`qmgui.core.disk`), unless the command line
or the profile said how to read it. Used by `plan`, the emitted commands (`preview`, `serve`,
exports) and the window's plan, so all of them agree."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from qmgui.core.discovery import ModelEntry
from qmgui.core.disk import MmapAdvice, mmap_advice
from qmgui.core.launch import LaunchSettings

LOCAL = MmapAdvice(True)


def disk_advice(
    entry: ModelEntry,
    settings: LaunchSettings,
    given: Collection[str] = (),
    *,
    ram_bytes: int | None = None,
) -> tuple[LaunchSettings, MmapAdvice]:
    """`settings` with the disk rule applied, and the advice (its note for the plan).
    `ram_bytes` defaults to this machine's RAM."""
    if "mmap" in given or not settings.mmap or entry.source == "url" or not entry.path:
        return settings, LOCAL
    from qmgui.hw.mounts import filesystem_of  # noqa: PLC0415 - a plan of a URL reads no mounts

    mount = filesystem_of(entry.shards[0] if entry.shards else entry.path)
    if mount is None:
        return settings, LOCAL
    if ram_bytes is None:
        from qmgui.hw.host import read_ram  # noqa: PLC0415

        ram_bytes = read_ram()[0]
    advice = mmap_advice(mount.fstype, mount.source, entry.size_bytes, ram_bytes)
    return (settings if advice.mmap else replace(settings, mmap=False)), advice
