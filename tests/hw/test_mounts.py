"""qmgui.hw.mounts: which filesystem a model is on, from a recorded mount table."""

from __future__ import annotations

from pathlib import Path

from qmgui.hw.mounts import Mount, filesystem_of, mount_of, parse_mountinfo

# /proc/self/mountinfo of a workstation with a NAS (NFS), a Samba share with a space in its
# mount point (written \040), an sshfs mount, and a local disk mounted over part of the NAS
MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
45 22 0:40 / /mnt/nas rw,relatime shared:30 - nfs4 nas.lan:/export/models rw,vers=4.2
46 45 259:3 / /mnt/nas/local-cache rw,relatime shared:31 - ext4 /dev/nvme1n1p1 rw
47 22 0:41 / /media/team\\040share rw,relatime shared:32 - cifs //files/team\\040share rw
48 22 0:42 / /home/me/remote rw,nosuid shared:33 - fuse.sshfs me@gpu-box:/models rw
49 22 0:43 / /mnt/nas rw,relatime shared:34 - nfs4 nas2.lan:/models rw
garbage line without the separator
"""


def test_parse_keeps_points_types_and_sources_with_escapes() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert Mount("/media/team share", "cifs", "//files/team share") in mounts
    assert len(mounts) == 6  # the garbage line is skipped


def test_the_longest_mount_point_wins_and_the_top_of_a_stack() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert mount_of("/mnt/nas/qwen/q4.gguf", mounts) == Mount(
        "/mnt/nas", "nfs4", "nas2.lan:/models"
    )  # mounted over the first NAS mount
    assert mount_of("/mnt/nas/local-cache/q4.gguf", mounts).fstype == "ext4"  # type: ignore[union-attr]
    assert mount_of("/mnt/nasty/q4.gguf", mounts).fstype == "ext4"  # type: ignore[union-attr]
    assert mount_of("/home/me/remote/m.gguf", mounts).fstype == "fuse.sshfs"  # type: ignore[union-attr]


def test_a_symlink_is_followed_to_where_the_file_lives(tmp_path: Path) -> None:
    table = (
        f"22 1 259:2 / / rw - ext4 /dev/sda1 rw\n45 22 0:40 / {tmp_path}/nas rw - nfs nas:/m rw\n"
    )
    (tmp_path / "nas").mkdir()
    (tmp_path / "nas" / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "link.gguf").symlink_to(tmp_path / "nas" / "m.gguf")
    found = filesystem_of(str(tmp_path / "link.gguf"), mountinfo=table)
    assert found is not None and found.fstype == "nfs"


def test_this_machine_answers_for_a_local_file(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    found = filesystem_of(str(tmp_path / "m.gguf"))
    assert found is not None and found.fstype  # whatever it is, it is named
