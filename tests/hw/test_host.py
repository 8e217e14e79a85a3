"""Host facts: /proc/cpuinfo parsing (x86 and ARM), psutil readings, and failure as notes."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qmgui.hw.host import SIMD_FLAGS, has_flags, parse_cpuinfo, read_host

# The first processor's entry of this development machine's /proc/cpuinfo (recorded, trimmed
# of the power-management and bugs lines).
X86_CPUINFO = """\
processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 143
model name	: Intel(R) Xeon(R) Processor
stepping	: 8
cpu MHz		: 1900.000
cache size	: 107520 KB
physical id	: 0
siblings	: 2
core id		: 0
cpu cores	: 2
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush \
mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology \
nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe \
popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch \
cpuid_fault ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms \
invpcid rtm avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni \
avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd arat \
avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg \
tme avx512_vpopcntdq rdpid cldemote movdiri movdir64b md_clear serialize tsxldtrk amx_bf16 \
avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities

processor	: 1
model name	: Intel(R) Xeon(R) Processor
flags		: fpu
"""

# Constructed in the Linux arm64 format (a Raspberry Pi 5: Cortex-A76 cores).
ARM_CPUINFO = """\
processor	: 0
BogoMIPS	: 108.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
lrcpc dcpop asimddp
CPU implementer	: 0x41
CPU architecture: 8
CPU part	: 0xd0b

Revision	: d04170
Serial		: 10000000abcdef01
Model		: Raspberry Pi 5 Model B Rev 1.0
"""


def test_parse_x86_cpuinfo() -> None:
    model, flags = parse_cpuinfo(X86_CPUINFO)
    assert model == "Intel(R) Xeon(R) Processor"
    assert {"avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"} <= flags
    assert "fpu" in flags and len(flags) > 100  # the first processor's line, not the last


def test_parse_arm_cpuinfo() -> None:
    model, flags = parse_cpuinfo(ARM_CPUINFO)
    assert model == "Raspberry Pi 5 Model B Rev 1.0"
    assert {"asimd", "asimddp"} <= flags
    assert "avx2" not in flags


def test_parse_empty_cpuinfo() -> None:
    assert parse_cpuinfo("") == (None, frozenset())


def test_read_host_from_a_recorded_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(X86_CPUINFO)
    fake = SimpleNamespace(
        virtual_memory=lambda: SimpleNamespace(total=64 * 2**30, available=50 * 2**30),
        swap_memory=lambda: SimpleNamespace(total=8 * 2**30),
        cpu_count=lambda logical=True: 32 if logical else 16,
    )
    host = read_host(psutil_module=fake, cpuinfo_path=str(cpuinfo))
    assert (host.ram_total_bytes, host.ram_available_bytes) == (64 * 2**30, 50 * 2**30)
    assert host.swap_total_bytes == 8 * 2**30
    assert (host.physical_cores, host.logical_cores) == (16, 32)
    if host.system.startswith("Linux"):  # cpuinfo is only read on Linux
        assert host.cpu_model == "Intel(R) Xeon(R) Processor"
        assert host.simd[:5] == ("sse4_2", "avx", "f16c", "fma", "avx2")
        assert "amx_int8" in host.simd
        assert has_flags(host, ["avx2", "fma"])
    assert not has_flags(host, ["sve2"])
    assert host.problems == ()
    json.dumps(host.to_json())


def test_what_cannot_be_read_is_a_note(tmp_path: Path) -> None:
    def broken(**_: Any) -> Any:
        raise OSError("no /proc here")

    fake = SimpleNamespace(
        virtual_memory=broken, swap_memory=broken, cpu_count=lambda logical=True: None
    )
    host = read_host(psutil_module=fake, cpuinfo_path=str(tmp_path / "gone"))
    assert host.ram_total_bytes is None and host.ram_available_bytes is None
    assert host.physical_cores is None and host.logical_cores is None
    assert any("RAM could not be read" in p for p in host.problems)
    if host.system.startswith("Linux"):
        assert any("could not be read" in p and "gone" in p for p in host.problems)


def test_without_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    # a context of its own: the harness needs psutil back before its own teardown
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
        host = read_host()
    assert host.ram_total_bytes is None
    assert host.problems[0] == "psutil is not installed: RAM and core counts are unknown"


def test_this_machine() -> None:
    host = read_host()
    assert host.ram_total_bytes and host.ram_total_bytes > 0
    assert host.ram_available_bytes is not None
    assert host.ram_available_bytes <= host.ram_total_bytes
    assert host.logical_cores and host.logical_cores >= 1
    assert host.machine
    assert set(host.simd) <= set(SIMD_FLAGS)


def test_ram_on_linux_is_read_from_meminfo_as_psutil_reads_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`qmgui plan` reads RAM without importing psutil: MemTotal and MemAvailable, in bytes."""
    from qmgui.hw.host import _meminfo

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       24683584 kB\nMemFree:         1000000 kB\n"
        "MemAvailable:   24101360 kB\nBuffers:           12345 kB\n"
    )
    assert _meminfo(str(meminfo)) == (24683584 * 1024, 24101360 * 1024)
    meminfo.write_text("MemTotal:       24683584 kB\n")  # an old kernel: no MemAvailable
    assert _meminfo(str(meminfo)) is None
    assert _meminfo(str(tmp_path / "missing")) is None


def test_cpu_target_maps_cpuinfo_flags_to_the_engines_names(tmp_path: Path) -> None:
    from qmgui.hw.host import cpu_target, read_cpu_flags

    xeon = "processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512_vnni amx_tile amx_int8\n"
    epyc = "processor\t: 0\nflags\t\t: fpu avx avx2 fma f16c bmi2\n"
    (tmp_path / "xeon").write_text(xeon)
    (tmp_path / "epyc").write_text(epyc)
    if platform.system() == "Linux":
        x = cpu_target(flags=read_cpu_flags(str(tmp_path / "xeon")))
        assert x is not None and x.amx and "AVX512" in x.features
        e = cpu_target(11434, flags=read_cpu_flags(str(tmp_path / "epyc")))
        assert e is not None and not e.amx and "AVX2" in e.features and e.build == 11434
        assert e.source == "host" and e.repack_compiled
    assert cpu_target(flags=frozenset()) is None  # Windows, macOS: flags not read
