# examples/train_mixture.py: two packed outputs mixed by weight, the loss logged per source
#   packtool pack --capacity 256 --overwrite sample_data/part-00000.parquet mix/code/
#   packtool pack --capacity 256 --overwrite sample_data/part-00002.parquet mix/mixed/
#   python examples/train_mixture.py
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from packtool.loader import PackedIterableDataset

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=131_072, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

# sample_data/part-00000 holds standard-library code, part-00002 code and pydoc topics.
# every epoch: 70 % of its rows from mix/code, 30 % from mix/mixed, interleaved; the weights can
# change between runs without repacking. labels="shifted": labels[i] is the token after i, so
# logits[i] pairs with labels[i]. batch_size: the dataset yields whole batches.
ds = PackedIterableDataset({"code": "mix/code/", "mixed": "mix/mixed/"},
                           weights={"code": 0.7, "mixed": 0.3}, seed=0, labels="shifted",
                           batch_size=4)
loader = DataLoader(ds, batch_size=None, num_workers=2)
print("rows per epoch:", ds.source_shares)
for step, b in zip(range(3), loader):
    logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"],
                   use_cache=False).logits
    token_loss = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(),
                                 reduction="none").view(b["labels"].shape)  # 0 where -100
    targets = b["labels"] != -100
    (token_loss.sum() / targets.sum().clamp(min=1)).backward()  # no targets: gradients 0
    opt.step()
    opt.zero_grad()
    # per source: the summed loss of its rows over their effective targets
    row_loss, row_targets = token_loss.detach().sum(1), targets.sum(1)
    parts = []
    for name in ds.sources:
        mine = torch.tensor([s == name for s in b["source"]])
        n = int(row_targets[mine].sum())
        loss = f"{row_loss[mine].sum().item() / n:.4f}" if n else "-"
        parts.append(f"{name} {loss} ({n} targets)")
    print(f"step {step}: {row_loss.sum().item() / max(int(targets.sum()), 1):.4f} per target; "
          + ", ".join(parts))
