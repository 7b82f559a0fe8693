"""The two small models the trainer offers: an MLP and a CNN over [C, H, W] inputs."""

from __future__ import annotations

import math

from torch import nn


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, width: int,
                dropout: float) -> nn.Module:
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(input_shape), width), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(width, num_classes),
        )
    if name == "cnn":
        c, h, w = input_shape
        # No pooling: the dataset's labels depend on every pixel, so keep the spatial layout.
        return nn.Sequential(
            nn.Conv2d(c, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Dropout(dropout),
            nn.Linear(width * h * w, num_classes),
        )
    raise ValueError(f"unknown model {name!r}")
