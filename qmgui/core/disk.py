"""Where a model's file lives decides how the engine should read it (pure: the filesystem
type comes from `qmgui.hw.mounts`).

llama-server maps the weights by default (mmap): pages are read from the file when touched,
and the kernel may drop clean ones under memory pressure and read them again later. On a local
disk that is cheap and lets several engines share one copy. On a network filesystem every
such read crosses the network, so the launch reads the weights into RAM once (`--no-mmap`)
when they fit in 85% of RAM; larger weights keep mmap (reading them whole would push
everything else out) and the plan warns that paging will go over the network.
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.units import format_bytes

# kernel filesystem types that are remote; FUSE mounts are "fuse.<program>"
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre",
    "gpfs", "beegfs", "davfs", "ncpfs", "coda", "orangefs", "remote",
})  # fmt: skip
NETWORK_FUSE = frozenset({
    "sshfs", "rclone", "s3fs", "gcsfuse", "goofys", "davfs2", "glusterfs", "ceph-fuse",
    "juicefs", "mountpoint-s3", "blobfuse", "blobfuse2", "smbnetfs", "curlftpfs",
})  # fmt: skip
RAM_SHARE = 0.85  # weights up to this share of RAM are read into memory from a network disk


def is_network(fstype: str) -> bool:
    """Whether a filesystem type (as the kernel names it) is a network one."""
    t = fstype.lower()
    if t.startswith("fuse."):
        return t.removeprefix("fuse.") in NETWORK_FUSE
    return t in NETWORK_FS


@dataclass(frozen=True)
class MmapAdvice:
    """How to read the weights: `mmap` False means `--no-mmap`; `note` says which and why
    ("" for a local disk); `warning` is set when mmap stays on a network disk."""

    mmap: bool
    note: str = ""
    warning: str = ""


def mmap_advice(
    fstype: str | None, source: str, weights_bytes: int, ram_bytes: int | None
) -> MmapAdvice:
    """The advice for weights of `weights_bytes` on a filesystem of `fstype` (None: unknown,
    treated as local) on a host with `ram_bytes` of RAM (None: unknown)."""
    if fstype is None or not is_network(fstype):
        return MmapAdvice(True)
    where = f"a network filesystem ({fstype}{', ' + source if source else ''})"
    if ram_bytes is not None and weights_bytes <= RAM_SHARE * ram_bytes:
        return MmapAdvice(
            False,
            f"the model is on {where}: --no-mmap reads its {format_bytes(weights_bytes)} of "
            "weights into RAM once instead of paging them over the network",
        )
    ram = format_bytes(ram_bytes) if ram_bytes is not None else "an unknown amount of"
    return MmapAdvice(
        True,
        f"the model is on {where}; mmap stays on: its {format_bytes(weights_bytes)} of weights "
        f"are more than {RAM_SHARE:.0%} of the {ram} RAM",
        "pages dropped under memory pressure will be read again over the network (slow); "
        "copy the model to a local disk",
    )
