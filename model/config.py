"""Model hyper-parameters: one frozen dataclass next to the model it configures.

Only architecture lives here (width, depth, heads, dropout, feed-forward ratio). Anything
that does not change the parameter shapes or the math (packing, compilation, batch size,
precision, the optimizer) is a runtime setting of the model or the harness, so one config
can be benchmarked under many execution choices.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    dropout: float = 0.0
    ffn_mult: int = 4

    def __post_init__(self) -> None:
        if self.d_model <= 0 or self.layers <= 0 or self.heads <= 0 or self.ffn_mult <= 0:
            raise ValueError(
                f"ModelConfig sizes must be positive, got {self}; set d_model, layers, heads "
                "and ffn_mult to integers >= 1"
            )
        if self.d_model % self.heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by heads={self.heads}; choose heads "
                "that divide d_model (e.g. heads=4 for d_model=64)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)
