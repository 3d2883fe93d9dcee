"""A dataset split across clients, as tensors on one device (`FedData`, built by `federation.build.build_data`), and the
normalisation of a set's images."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from .datasets import DatasetSpec


@dataclass
class FedData:
    """One dataset split across clients, as tensors on one device.

    `x`/`y` hold the images of the pool (train, or train+test when pooled) that the run's clients use, in pool
    order; `x_test`/`y_test` the global test set. `train[k]`, `test[k]`, `val[k]` are index tensors into `x` (or
    into `x_test` when `local_test_from_global`), not into the whole pool (the partition's indices:
    `federation.build.build_partition`)."""
    spec: DatasetSpec
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    train: list
    test: list
    val: list
    local_test_from_global: bool
    source: str
    x_local_test: torch.Tensor | None = None   # the set local tests index when `local_test_from_global` and the
    y_local_test: torch.Tensor | None = None   # GM's `x_test` is a subsample of it (None: `x_test` itself)
    x_public: torch.Tensor | None = None       # unlabeled public set (`cfg.public`: PerFed-CKT, FedDF), normalised
    test_offsets: list | None = None           # when `x_test` IS the clients' local tests, client after client (the
    #                                            pooled train+test of pFedSD and DC-PFL): client k's are rows
    #                                            test_offsets[k]:test_offsets[k + 1] (`pooled_tests`); else None

    @property
    def n_clients(self) -> int:
        return len(self.train)

    def client_train(self, k: int):
        i = self.train[k]
        return self.x[i], self.y[i]

    def client_test(self, k: int):
        i = self.test[k]
        if self.local_test_from_global:
            if self.x_local_test is not None:
                return self.x_local_test[i], self.y_local_test[i]
            return self.x_test[i], self.y_test[i]
        return self.x[i], self.y[i]

    def pooled_tests(self) -> "FedData":
        """This data with `test_offsets` set when the global test set is every client's local test set, in client
        order, image for image (checked here): evaluation then scores the global model on them once."""
        n = [len(i) for i in self.test]
        if self.local_test_from_global or sum(n) != len(self.y_test):
            return self
        idx = torch.cat(list(self.test)) if self.test else torch.empty(0, dtype=torch.long)
        if not (torch.equal(self.y[idx], self.y_test) and torch.equal(self.x[idx], self.x_test)):
            return self
        return dataclasses.replace(self, test_offsets=[0, *np.cumsum(n).tolist()])

    def client_val(self, k: int):
        i = self.val[k]
        return self.x[i], self.y[i]

    def n_train(self) -> torch.Tensor:
        return torch.tensor([len(i) for i in self.train], dtype=torch.float64)


def normalise(x_uint8: torch.Tensor, spec: DatasetSpec, device) -> torch.Tensor:
    mean = torch.tensor(spec.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    std = torch.tensor(spec.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    return (x_uint8.to(device).float().div_(255.0) - mean) / std
