"""DDP and FSDP2 over a model holding a FusedMLP and a GatedMLP, two processes on the CPU
(gloo on 127.0.0.1): after 10 SGD steps the ranks hold the same parameters, and those
match one process trained on the whole batch."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import fusedmlp_xpu as fm

WORLD = 2
STEPS = 10
ROWS = 16  # the whole batch; each rank trains on ROWS // WORLD of it
LR = 0.5


class Net(nn.Module):
    """A FusedMLP feeding a GatedMLP, float32, small."""

    def __init__(self):
        super().__init__()
        self.mlp = fm.FusedMLP(8, 12, 16, 2, activation="tanh", bias=True)
        self.ffn = fm.GatedMLP(12, 24, activation="silu")

    def forward(self, x):
        return self.ffn(self.mlp(x))


def _model_and_data():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(ROWS, 8)
    target = torch.randn(ROWS, 12)
    return model, x, target


def _train(model, x, target):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        # the mean over the rows: DDP and FSDP average gradients over ranks, so equal
        # shards give the gradient of the whole batch's mean
        loss = ((model(x) - target) ** 2).mean()
        loss.backward()
        opt.step()


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two processes on a 2-core runner
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        shard = slice(rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD)
        results = {}

        from torch.nn.parallel import DistributedDataParallel as DDP

        model, x, target = _model_and_data()
        ddp = DDP(model)
        _train(ddp, x[shard], target[shard])
        mine = _flat(model.parameters())
        gathered = [torch.empty_like(mine) for _ in range(WORLD)]
        dist.all_gather(gathered, mine)
        results["ddp"] = mine
        results["ddp_ranks_equal"] = all(torch.equal(g, gathered[0]) for g in gathered)

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model, x, target = _model_and_data()
        # a CPU mesh: left out, fully_shard takes CUDA wherever it is present (GPU hosts)
        mesh = init_device_mesh("cpu", (WORLD,))
        fully_shard(model.mlp, mesh=mesh)
        fully_shard(model.ffn, mesh=mesh)
        fully_shard(model, mesh=mesh)
        _train(model, x[shard], target[shard])
        full = [p.full_tensor() for p in model.parameters()]  # DTensor shards -> whole
        mine = _flat(full)
        gathered = [torch.empty_like(mine) for _ in range(WORLD)]
        dist.all_gather(gathered, mine)
        results["fsdp"] = mine
        results["fsdp_ranks_equal"] = all(torch.equal(g, gathered[0]) for g in gathered)
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with the gloo backend is not available in this build")
def test_ddp_and_fsdp2_match_one_process(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    model, x, target = _model_and_data()
    _train(model, x, target)
    want = _flat(model.parameters())
    start = _flat(_model_and_data()[0].parameters())
    moved = (want - start).norm()
    assert moved > 1e-3 * start.norm()  # the steps moved the parameters
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for kind in ("ddp", "fsdp"):
            assert got[f"{kind}_ranks_equal"], f"{kind}: ranks diverged"
            err = ((got[kind] - want).norm() / want.norm()).item()
            assert err < 1e-5, f"{kind} rank {rank}: relative error {err:.2e} vs one process"
            # and small against the update itself, so a wrong gradient cannot hide in it
            off = ((got[kind] - want).norm() / moved).item()
            assert off < 1e-3, f"{kind} rank {rank}: {off:.2e} of the update vs one process"
