"""What the engine reads off the machine: CPU flags and the cache folder."""

from __future__ import annotations

from pathlib import Path

from bargein.engine.host import cache_root, cpu_flags


def test_cpu_flags_reads_cpuinfo(tmp_path: Path) -> None:
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(f)) == frozenset({"fpu", "avx2", "avx512_vnni"})
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_cache_root_is_the_flag_else_the_users_cache(tmp_path: Path) -> None:
    assert cache_root(str(tmp_path)) == tmp_path
    assert cache_root(None) == Path.home() / ".cache" / "bargein"
