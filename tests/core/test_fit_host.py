"""Host memory is a limit too: what the engine allocates on the host must fit in RAM; weights
of a memory-mapped file are page cache (a warning when they do not fit, not a refusal)."""

from __future__ import annotations

from qmgui.core.fit import Budget, check
from qmgui.core.footprint import CPU
from qmgui.core.launch import LaunchSettings
from qmgui.core.units import GIB
from tests.core.test_footprint import make_meta

HUGE_CTX = 1 << 27  # 134M tokens: within the contexts qmgui plans (2^28)


def test_a_cpu_plan_over_ram_does_not_fit() -> None:
    m = make_meta(context_length=HUGE_CTX)
    s = LaunchSettings(parallel=1, ctx_size=HUGE_CTX)
    r = check(m, s, Budget(host_bytes=2 * GIB))
    cpu = r.footprint.device(CPU)
    assert cpu.kv > 2 * GIB  # the KV cache alone is far past RAM
    assert not r.fits
    assert r.reason is not None and "host memory" in r.reason and "resident" in r.reason


def test_unchecked_host_memory_keeps_the_old_answer() -> None:
    m = make_meta(context_length=HUGE_CTX)
    r = check(m, LaunchSettings(parallel=1, ctx_size=HUGE_CTX), Budget())
    assert r.fits


def test_mapped_weights_over_ram_fit_with_a_warning() -> None:
    m = make_meta()
    s = LaunchSettings(parallel=1, ctx_size=256)
    fp = check(m, s, Budget()).footprint.device(CPU)
    # RAM holds everything the engine allocates, not the mapped weights beside it
    ram = fp.total - fp.weights + 1024
    assert fp.weights > 1024
    r = check(m, s, Budget(host_bytes=ram))
    assert r.fits
    assert r.warnings and "mapped" in r.warnings[0]


def test_weights_read_without_mmap_are_resident() -> None:
    m = make_meta()
    s = LaunchSettings(parallel=1, ctx_size=256, mmap=False)
    fp = check(m, s, Budget()).footprint.device(CPU)
    r = check(m, s, Budget(host_bytes=fp.total - 1))
    assert not r.fits
    assert check(m, s, Budget(host_bytes=fp.total)).fits
