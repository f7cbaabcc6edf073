"""Coordinate encoder: turns one node's rows into tokens (one token per cell).

A row of node N becomes ``T = C + K + X + Kc`` tokens, in this order: its C continuous
columns, its K categorical columns, its X text columns (``NodeDef`` order within each kind)
and one token per child branch (that branch's pooled vector for this row). A token is

    value embedding + column-identity embedding (+ row-position embedding in branches)

Design choices:
- Continuous value: a per-column affine map ``v * w_c + b_c`` (a Linear(1, D) per column).
- Category value: one concatenated table with per-column offsets; slot 0 of each column's
  slice is that column's learned NULL vector (index 0 = null in the batch contract).
- Null continuous cells use a learned per-column NULL vector. Nulls are *present* inputs.
- Text value: the application's encoder (outside the model) gives each cell an E-wide
  vector; a per-column ``Linear(E, D)`` maps it to a token. Null text cells use a learned
  per-column NULL vector; empty strings are whatever vector the encoder gives them.
- The target column's cells are learned-mask coordinates: whatever placeholder the
  tensorizer wrote there is zeroed before it touches any weight (a NaN placeholder could
  otherwise poison gradients) and the value embedding is replaced by a learned mask vector.
- Row position embeddings exist only for branches (rows are ordered, e.g. newest first).
- The encoder works on any leading shape ``[..., L]`` of rows, so the padded path embeds all
  reserved rows and the packed path embeds only the present rows it gathered.
"""

from __future__ import annotations

import torch
from torch import nn

from .schema import NodeDef


class CoordinateEncoder(nn.Module):
    category_offset_K: torch.Tensor  # buffers, registered in __init__
    category_cardinality_K: torch.Tensor

    def __init__(self, node: NodeDef, d_model: int, target_column: str | None) -> None:
        super().__init__()
        self.node_name = node.name
        continuous, categorical = node.continuous, node.categorical
        self.num_continuous = len(continuous)
        self.num_categorical = len(categorical)
        text = node.text
        self.num_text = len(text)
        self.num_children = len(node.children)
        self.tokens_per_row = self.num_continuous + self.num_categorical + self.num_text + self.num_children
        if self.tokens_per_row == 0:
            raise ValueError(
                f"node {node.name!r} has no columns and no child branches, so its rows have no "
                "tokens; give it at least one column or drop it from the schema"
            )
        for col in categorical:
            if col.cardinality < 1:
                raise ValueError(
                    f"category column {node.name}.{col.name} has cardinality "
                    f"{col.cardinality}; set it to the vocabulary size + 2 reserved slots"
                )
        ordered = [c.name for c in (*continuous, *categorical)]
        self.target_index: int | None = None
        if target_column is not None:
            if target_column not in ordered:
                raise ValueError(
                    f"target column {target_column!r} is not a column of node {node.name!r} "
                    f"(columns: {ordered}); fix schema.target"
                )
            self.target_index = ordered.index(target_column)

        C, K = self.num_continuous, self.num_categorical
        self.continuous_weight_CD = nn.Parameter(torch.randn(C, d_model) * 0.02)
        self.continuous_bias_CD = nn.Parameter(torch.zeros(C, d_model))
        self.continuous_null_CD = nn.Parameter(torch.randn(C, d_model) * 0.02)
        cards = [c.cardinality for c in categorical]
        self.category_table = nn.Embedding(max(sum(cards), 1), d_model)
        nn.init.normal_(self.category_table.weight, std=0.02)
        offsets = torch.tensor([sum(cards[:i]) for i in range(K)], dtype=torch.long)
        self.register_buffer("category_offset_K", offsets, persistent=False)
        self.register_buffer("category_cardinality_K", torch.tensor(cards, dtype=torch.long), persistent=False)
        widths = {c.width for c in text}
        if text and (len(widths) != 1 or min(widths) < 1):
            raise ValueError(
                f"text columns of node {node.name!r} have widths {sorted(widths)}; every text "
                "column of a node needs the same positive width (the encoder's dimension)"
            )
        E, X = (widths.pop() if text else 0), len(text)
        self.text_width = E
        # only nodes with text columns get text weights, so older checkpoints still load
        self.text_weight_XED = nn.Parameter(torch.randn(X, E, d_model) * (1.0 / E) ** 0.5) if X else None
        self.text_bias_XD = nn.Parameter(torch.zeros(X, d_model)) if X else None
        self.text_null_XD = nn.Parameter(torch.randn(X, d_model) * 0.02) if X else None
        self.column_identity_TD = nn.Parameter(torch.randn(self.tokens_per_row, d_model) * 0.02)
        self.row_position = nn.Embedding(node.max_length, d_model) if node.max_length > 1 else None
        if self.row_position is not None:
            nn.init.normal_(self.row_position.weight, std=0.02)
        self.mask_value_D = nn.Parameter(torch.randn(d_model) * 0.02) if self.target_index is not None else None

    def check(self, categorical_RK: torch.Tensor) -> None:
        """Category indices must fit their column's table (else they read a neighbour's)."""
        if self.num_categorical == 0 or categorical_RK.device.type == "meta":
            return
        index = categorical_RK
        if self.target_index is not None and self.target_index >= self.num_continuous:
            index = index.clone()
            index[..., self.target_index - self.num_continuous] = 0
        if bool(((index < 0) | (index >= self.category_cardinality_K)).any()):
            raise ValueError(
                f"node {self.node_name!r}: a category index is outside [0, cardinality); "
                "encode the batch with the same fitted vocabularies the schema was built from"
            )

    def forward(
        self,
        continuous_RC: torch.Tensor,
        continuous_null_RC: torch.Tensor,
        categorical_RK: torch.Tensor,
        children_RKcD: torch.Tensor | None,
        position_L: torch.Tensor | None,
        text_RXE: torch.Tensor | None = None,
        text_null_RX: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows ``[..., L, *]`` -> tokens ``[..., L, T, D]`` (``position_L``: row positions)."""
        parts = []
        target = self.target_index
        if self.num_continuous:
            zero_RC = continuous_null_RC
            if target is not None and target < self.num_continuous:
                is_target_C = torch.zeros(self.num_continuous, dtype=torch.bool, device=continuous_RC.device)
                is_target_C[target] = True
                zero_RC = zero_RC | is_target_C
            value_RC = torch.where(zero_RC, torch.zeros_like(continuous_RC), continuous_RC)
            value_RCD = value_RC.unsqueeze(-1) * self.continuous_weight_CD + self.continuous_bias_CD
            parts.append(torch.where(continuous_null_RC.unsqueeze(-1), self.continuous_null_CD, value_RCD))
        if self.num_categorical:
            index_RK = categorical_RK
            if target is not None and target >= self.num_continuous:
                keep_K = torch.ones(self.num_categorical, dtype=torch.long, device=index_RK.device)
                keep_K[target - self.num_continuous] = 0
                index_RK = index_RK * keep_K
            parts.append(self.category_table(index_RK + self.category_offset_K))
        if self.num_text:
            if text_RXE is None or text_null_RX is None:
                raise ValueError(
                    f"node {self.node_name!r} has {self.num_text} text column(s) but the batch "
                    "carries no text vectors; run the application's text encoder (encode step) first"
                )
            assert self.text_bias_XD is not None and self.text_null_XD is not None  # built when num_text
            clean_RXE = torch.where(text_null_RX.unsqueeze(-1), torch.zeros_like(text_RXE), text_RXE)
            value_RXD = torch.einsum("...xe,xed->...xd", clean_RXE, self.text_weight_XED) + self.text_bias_XD
            parts.append(torch.where(text_null_RX.unsqueeze(-1), self.text_null_XD, value_RXD))
        if self.num_children:
            assert children_RKcD is not None
            parts.append(children_RKcD)
        x_RTD = torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]
        if target is not None:
            is_target_T1 = torch.zeros(self.tokens_per_row, 1, dtype=torch.bool, device=x_RTD.device)
            is_target_T1[target] = True
            assert self.mask_value_D is not None  # created whenever there is a target column
            x_RTD = torch.where(is_target_T1, self.mask_value_D, x_RTD)
        x_RTD = x_RTD + self.column_identity_TD
        if self.row_position is not None and position_L is not None:
            x_RTD = x_RTD + self.row_position(position_L).unsqueeze(-2)
        return x_RTD
