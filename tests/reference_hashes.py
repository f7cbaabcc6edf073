"""Hash finalisers written out over Python ints, independently of the numpy code under test
(tasks/stages/split.py, tasks/stages/encode.py), for tests that check a definition."""

from __future__ import annotations

M64 = 2**64


def splitmix64(z: int) -> int:
    """splitmix64's finaliser."""
    z = (z + 0x9E3779B97F4A7C15) % M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M64
    return z ^ (z >> 31)
