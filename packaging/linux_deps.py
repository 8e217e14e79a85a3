"""What a Linux bundle needs from the system: the libraries its ELF files load that the bundle
does not carry, the Debian packages that provide them, and the newest glibc symbol version
any of them uses.

    python packaging/linux_deps.py dist/qmgui            # a report
    python packaging/linux_deps.py dist/qmgui --depends  # one line for a .deb's Depends

`ldd` runs with the bundle's own folders first on the library path (as PyInstaller's
bootloader arranges), so what it resolves outside the bundle really comes from the system.
A library nobody provides ("not found") is an error unless a plugin that is optional at run
time needs it (listed in OPTIONAL).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

# libraries the loader and libc provide; they are the libc6 dependency
LIBC = re.compile(r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libresolv)\.so")
# system libraries the wayland platform loads, which a machine without Wayland may lack (the
# .deb depends on them anyway; elsewhere Qt falls back to xcb)
OPTIONAL = {"libwayland-cursor.so.0"}
ELF_MAGIC = b"\x7fELF"


def elf_files(root: Path) -> list[Path]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            with p.open("rb") as f:
                if f.read(4) == ELF_MAGIC:
                    out.append(p)
    return sorted(out)


def system_libraries(root: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """{soname: path outside the bundle}, {missing soname: [bundle files needing it]}."""
    files = elf_files(root)
    dirs = sorted({str(f.parent) for f in files})
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(dirs))
    found: dict[str, str] = {}
    missing: dict[str, list[str]] = {}
    root_s = str(root.resolve())
    for f in files:
        res = subprocess.run(["ldd", str(f)], capture_output=True, text=True, env=env, check=False)
        for line in res.stdout.splitlines():
            m = re.match(r"\s*(\S+) => (not found|\S+)", line)
            if not m:
                continue
            soname, where = m.groups()
            if where == "not found":
                missing.setdefault(soname, []).append(str(f.relative_to(root)))
            elif not os.path.realpath(where).startswith(root_s):
                found.setdefault(soname, where)
    return found, missing


def packages(paths: list[str]) -> dict[str, str]:
    """{path: Debian package} through dpkg -S (the /usr-merged twin of a path, too)."""
    out: dict[str, str] = {}
    for path in paths:
        for candidate in (path, os.path.realpath(path), path.replace("/usr/lib/", "/lib/", 1)):
            res = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True,
                                 check=False)  # fmt: skip
            if res.returncode == 0:
                out[path] = res.stdout.split(":", 1)[0].strip()
                break
    return out


def max_glibc(root: Path) -> str:
    """The newest GLIBC_x.y symbol version any bundled ELF file asks for."""
    best = (0, 0)
    for f in elf_files(root):
        res = subprocess.run(["objdump", "-T", str(f)], capture_output=True, text=True,
                             check=False)  # fmt: skip
        for major, minor in re.findall(r"GLIBC_(\d+)\.(\d+)", res.stdout):
            best = max(best, (int(major), int(minor)))
    return f"{best[0]}.{best[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--depends", action="store_true", help="print the Debian packages only")
    args = ap.parse_args(argv)
    found, missing = system_libraries(args.bundle)
    hard_missing = {k: v for k, v in missing.items() if k not in OPTIONAL}
    pkgs = packages(sorted(p for s, p in found.items() if not LIBC.match(s)))
    if args.depends:
        print(" ".join(sorted(set(pkgs.values()))))
    else:
        print(f"newest glibc symbol version used: GLIBC_{max_glibc(args.bundle)}")
        for soname, path in sorted(found.items()):
            pkg = pkgs.get(path, "libc6" if LIBC.match(soname) else "?")
            print(f"system   {soname:32} {path:48} {pkg}")
        for soname, users in sorted(missing.items()):
            tag = "optional" if soname in OPTIONAL else "MISSING"
            print(f"{tag:9}{soname:32} needed by {', '.join(users[:3])}")
    if hard_missing:
        print(f"linux_deps: not found on this system: {', '.join(sorted(hard_missing))}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
