"""qmgui.core.disk: a model on a network filesystem is read into RAM once when it fits."""

from __future__ import annotations

import pytest

from qmgui.core.disk import is_network, mmap_advice
from qmgui.core.units import GIB


@pytest.mark.parametrize(
    "fstype", ["nfs", "nfs4", "cifs", "smb3", "9p", "fuse.sshfs", "fuse.rclone", "ceph", "remote"]
)
def test_network_filesystems(fstype: str) -> None:
    assert is_network(fstype)


@pytest.mark.parametrize(
    "fstype",
    ["ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "ntfs3", "fuse.gocryptfs", "local"],
)
def test_local_filesystems(fstype: str) -> None:
    assert not is_network(fstype)


def test_local_or_unknown_keeps_mmap_and_says_nothing() -> None:
    for fstype in ("ext4", None):
        advice = mmap_advice(fstype, "", 8 * GIB, 32 * GIB)
        assert advice.mmap and not advice.note and not advice.warning


def test_network_weights_that_fit_in_85_percent_of_ram_are_read_once() -> None:
    advice = mmap_advice("nfs4", "nas:/models", 27 * GIB, 32 * GIB)  # 84% of RAM
    assert not advice.mmap and not advice.warning
    assert "--no-mmap" in advice.note and "nfs4, nas:/models" in advice.note


def test_network_weights_beyond_85_percent_keep_mmap_with_a_warning() -> None:
    advice = mmap_advice("cifs", "//files/share", 28 * GIB, 32 * GIB)  # 87.5%
    assert advice.mmap and "mmap stays on" in advice.note and "85%" in advice.note
    assert "over the network" in advice.warning
    unknown_ram = mmap_advice("nfs", "", GIB, None)
    assert unknown_ram.mmap and unknown_ram.warning
