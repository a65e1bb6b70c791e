# examples/train_hf.py: the Hugging Face Trainer
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from packtool.loader import HFCollator, IsolationCheck, PackedIterableDataset

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=131_072, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2))
# accelerate's default for an IterableDataset (dispatch_batches) would cut each batch's
# document boundaries (cu_seq_lens_q) to its rows: the dataset refuses it, so turn it off
args = TrainingArguments(output_dir="hf-run", max_steps=2, per_device_train_batch_size=2,
                         accelerator_config={"dispatch_batches": False})
# the Trainer batches the rows itself and runs len(DataLoader) steps an epoch: with DataLoader
# workers (dataloader_num_workers), dataloader_batch_size cuts each worker's rows into whole
# batches, so no worker's partial batch falls past that length and out of training; on several
# processes (torchrun) accelerate hands each its share of the rows, so every process builds
# the whole epoch: rank=0, world_size=1 (not RANK / WORLD_SIZE, which would share it twice)
ds = PackedIterableDataset("packed/", labels="unshifted", rank=0, world_size=1,
                           dataloader_batch_size=args.per_device_train_batch_size)
# the model shifts labels itself: HFCollator always hands it unshifted labels; IsolationCheck
# runs the model on a small packed batch of the collator's when training begins, and stops it
# if a document's logits differ from that document run alone
trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=HFCollator(),
                  callbacks=[IsolationCheck()])
trainer.train()
