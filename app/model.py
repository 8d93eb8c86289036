"""SimpleNet: the small convolutional classifier the project trains on 28x28 grey images."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SimpleNet(nn.Module):
    """Two conv/pool stages and a linear classifier, returning log-probabilities over 10 classes.

    A single 5x5 conv and one 2x2 pool leave 10x12x12 features on a 28x28 image, so a 160-wide linear layer
    after one stage cannot take them; a second stage brings the map to 20x4x4 = 320 features.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = torch.flatten(x, 1)
        return F.log_softmax(self.fc1(x), dim=1)
