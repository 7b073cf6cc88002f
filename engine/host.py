"""What the engine reads off the machine it runs on: the CPU's feature flags
and bargein's cache folder.

Both the model (which linear format this CPU runs best, where a converted
GGUF is kept) and the kernels (whether the block kernels build, where their
library goes) ask; here, below both, neither has to import the other.
"""

from __future__ import annotations

from pathlib import Path


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's feature flags (x86 ``flags``, Arm ``Features``); empty if unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cache_root(cache_dir: str | None) -> Path:
    """bargein's cache folder: ``cache_dir``, else ``~/.cache/bargein``."""
    return Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "bargein"
