"""Horovod with PyTorch, a whole script: a small network learns scikit-learn's handwritten digits (1,797 8x8 images
that ship with the library: no download), on one GPU per rank where the ranks see GPUs, on CPUs elsewhere.

    horovodrun -np 2 -H localhost:2 python pytorch_digits.py --epochs 5

Through compose, `launcher start --workdir` or the smoke role: README.md, "Your own script". Rank 0 prints each
epoch's validation accuracy (over every rank's share) and saves a checkpoint; at the end every rank prints a digest
of its parameters, the same on every rank.
"""

import argparse
import hashlib
import os
import socket
import tempfile

import horovod.torch as hvd
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# Checkpoints go to /shared, on every worker of the stack; where that cannot be written (a smoke run), to /tmp.
SHARED = "/shared" if os.access("/shared", os.W_OK) else tempfile.gettempdir()
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.1, help="for one rank; scaled by the number of ranks")
parser.add_argument("--checkpoint-dir", default=os.path.join(SHARED, "checkpoints"))
args = parser.parse_args()

hvd.init()
if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank())
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)

digits = load_digits()
x, y = torch.tensor(digits.data / 16, dtype=torch.float32), torch.tensor(digits.target)
order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # the same split on every rank
train, val = order[:1440], order[1440:]
dataset = TensorDataset(x[train], y[train])
sampler: DistributedSampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
mine = val[hvd.rank() :: hvd.size()]  # each rank scores its share of the validation set
val_x, val_y = x[mine].to(device), y[mine].to(device)

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

for epoch in range(1, args.epochs + 1):
    model.train()
    sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    for features, labels in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(features.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        right = (model(val_x).argmax(dim=1) == val_y).sum().item()
    right, seen = hvd.allreduce(torch.tensor([right, len(val_y)], dtype=torch.float64), op=hvd.Sum).tolist()
    if hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        state = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, os.path.join(args.checkpoint_dir, "pytorch_digits.pt"))
        print(f"epoch {epoch}/{args.epochs}: val accuracy {right / seen:.4f}", flush=True)

digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
print(f"rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()}: parameters sha256 {digest[:16]}", flush=True)
