# examples/train.py: a plain torch loop with gradient accumulation
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from packtool.loader import PackedIterableDataset

if "RANK" in os.environ:                       # started by torchrun
    dist.init_process_group("gloo")            # "nccl" on GPUs
world = dist.get_world_size() if dist.is_initialized() else 1
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=131_072, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2))
if dist.is_initialized():
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

# labels="shifted": labels[i] is the token after i (whatever --labels the pack used), so the
# loss pairs logits[i] with labels[i] and shifts nothing
# a directory or a store URI (PACKED=s3://bucket/packed/); rank and world from torchrun
# batch_size on the dataset: whole batches built from the decoded row groups (collate by
# default), each worker's crossing through shared memory; batch_size=None on the DataLoader
ds = PackedIterableDataset(os.environ.get("PACKED", "packed/"), seed=0, labels="shifted",
                           batch_size=1)
loader = DataLoader(ds, batch_size=None, num_workers=2)
accum, max_steps = 2, 2
for epoch in range(1):
    ds.set_epoch(epoch)                        # a new seeded order every epoch
    batches = iter(loader)
    for step in range(max_steps):
        micro = [next(batches) for _ in range(accum)]
        mine = sum(b["num_targets"] for b in micro)   # this rank's effective targets
        targets = torch.tensor(mine)
        if dist.is_initialized():
            dist.all_reduce(targets)           # effective targets of the step on all ranks
        targets = targets.clamp(min=1)         # a step of no targets: loss 0, gradients 0
        total = 0.0
        for b in micro:
            assert b["labels_convention"] == "shifted"  # what the dataset was asked for
            logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"],
                           use_cache=False).logits
            loss_sum = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(),
                                       reduction="sum")
            (loss_sum * world / targets).backward()  # DDP averages gradients over ranks
            total += loss_sum.item()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: {total / max(mine, 1):.3f} per target on this rank")
    del batches                                # stopped early: its workers end now, not at exit
if dist.is_initialized():
    dist.destroy_process_group()
