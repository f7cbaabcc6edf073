"""compute.compile_cache_hits / misses: what a compile took from the compiler's on-disk caches.

Named ``test_compute_compile_cache.py`` (tests/README.md): test_compute.py holds the compute stage's
own tests; this file is one aspect (compile caches)."""

from __future__ import annotations

import pytest
import torch

from tasks.stages.compute import compile_cache_counts


@pytest.mark.slow
def test_compile_cache_counts_a_recompile_served_from_the_on_disk_cache(tmp_path, monkeypatch):
    """The same graph compiled twice (Dynamo's in-memory cache reset between): the first is
    built (misses, no hits), the second comes from Inductor's and AOTAutograd's caches."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x = torch.randn(8, 8)

    def f(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(t) * 3 + 1

    torch._dynamo.reset()
    h0, m0 = compile_cache_counts()
    torch.compile(f)(x)
    h1, m1 = compile_cache_counts()
    torch._dynamo.reset()
    torch.compile(f)(x)
    h2, m2 = compile_cache_counts()
    assert (h1 - h0, m1 - m0) == (0, 2)  # FX graph and AOTAutograd: one miss each
    assert (h2 - h1, m2 - m1) == (2, 0)  # and one hit each
