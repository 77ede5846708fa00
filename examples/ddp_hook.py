"""DDP with gradzip's communication hook: `torchrun --nproc_per_node 2 examples/ddp_hook.py`."""

import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gradzip
from gradzip.integrations.ddp import register_gradzip_hook
from gradzip.schemes import AllGatherDecode

dist.init_process_group("gloo")  # env:// from torchrun: RANK, WORLD_SIZE, MASTER_ADDR, ...
rank = dist.get_rank()
torch.manual_seed(0)  # the same initial weights on every rank
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
)
# each bucket as a 2-level dithered (DQSG) payload, all-gathered and decoded on every rank
state = register_gradzip_hook(model, AllGatherDecode(gradzip.create("dqsg", M=2), run_seed=7))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
for step in range(5):
    x = torch.randn(64, 32, generator=data)
    y = torch.randint(0, 4, (64,), generator=data)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()  # the hook encodes, exchanges and averages the gradients
    opt.step()
    if rank == 0:  # one printer: the ranks' lines would interleave
        print(f"step {step} loss {loss.item():.4f}")
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, flat)
if rank == 0:
    print(f"parameters agree on every rank: {all(torch.equal(g, flat) for g in gathered)}")
state.close()
del model, opt  # DDP released before its process group: torch 2.13 can abort at exit otherwise
gc.collect()
dist.destroy_process_group()
