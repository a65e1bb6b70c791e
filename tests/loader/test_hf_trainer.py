"""Hugging Face Trainer with default TrainingArguments trains on the packed output with
documents isolated: no key stripped, use_cache=False reaches the model, packed per-document
logits equal unpacked ones."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from packtool.loader import (HFCollator, PackedDataset, PackedIterableDataset,  # noqa: E402
                             collate, collate_flat)

from loader_helpers import (emulate_flash_attention_2, pack, random_docs,  # noqa: E402
                            write_input)
import loader_helpers  # noqa: E402

VOCAB = 64


def tiny_llama(seed=0):
    return loader_helpers.tiny_llama(VOCAB, seed)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    docs = [[t % (VOCAB - 1) + 1 for t in doc] for doc in random_docs(60, 20, seed=5)]
    return pack(write_input(d / "in", docs), d / "out", 32, "--rows-per-shard", "8")


def per_document_logits_match(model, batch):
    """max |packed - alone| over every real token of every segment in the batch."""
    model.eval()
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       use_cache=False).logits.reshape(-1, VOCAB)
        pos = batch["position_ids"].reshape(-1)
        ids = batch["input_ids"].reshape(-1)
        starts = torch.nonzero(pos == 0).reshape(-1).tolist() + [len(ids)]
        worst, moved = 0.0, 0.0
        for a, e in zip(starts[:-1], starts[1:]):
            if batch["labels"].reshape(-1)[a + 1:e].eq(-100).all():
                continue  # the padding tail (no targets)
            alone = model(input_ids=ids[a:e][None], use_cache=False).logits[0]
            worst = max(worst, float((packed[a:e] - alone).abs().max()))
        # the control: the default use_cache=True lets documents see each other
        leaky = model(input_ids=batch["input_ids"],
                      position_ids=batch["position_ids"], use_cache=True).logits.reshape(-1, VOCAB)
        moved = float((leaky - packed).abs().max())
    return worst, moved


#: what an IterableDataset of packed batches needs under Trainer (accelerate's default dispatch
#: slices every tensor to the batch's rows, cutting the documents' boundaries short)
NO_DISPATCH = {"accelerator_config": {"dispatch_batches": False}}


class _Recorder(HFCollator):
    """HFCollator that keeps every batch it built."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.made = []

    def __call__(self, batch):
        out = super().__call__(batch)
        self.made.append(dict(out))
        return out


@pytest.mark.parametrize("flatten", [False, True])
def test_trainer_with_default_arguments_trains_with_isolation(packed, tmp_path, flatten):
    """Trainer(model, TrainingArguments(output_dir, no dispatching), train_dataset,
    data_collator): a few steps on CPU; every forward got use_cache=False and the batch the
    collator built, boundaries and all, unchanged; the loss is finite and the weights moved;
    afterwards packed logits equal per-document ones."""
    model = tiny_llama()
    seen = []

    def spy(module, args, kwargs):
        seen.append(dict(kwargs))

    model.register_forward_pre_hook(spy, with_kwargs=True)
    before = [p.detach().clone() for p in model.parameters()]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), **NO_DISPATCH)
    ds = PackedIterableDataset(packed, seed=0, labels="unshifted")
    collator = _Recorder(flatten=flatten)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds,
                                   data_collator=collator)
    result = trainer.train()
    steps = -(-len(ds) // args.per_device_train_batch_size) * int(args.num_train_epochs)
    assert result.global_step == steps and np.isfinite(result.training_loss)
    assert seen and all(s.get("use_cache") is False for s in seen)
    assert len(seen) == len(collator.made)
    for got, made in zip(seen, collator.made):
        for k in ("input_ids", "position_ids", "labels", "cu_seq_lens_q", "cu_seq_lens_k",
                  "max_length_q", "max_length_k"):
            a, b = got[k], made[k]
            assert (torch.equal(a, b) if torch.is_tensor(a) else a == b), k
    assert all("attention_mask" not in s or s["attention_mask"] is None for s in seen)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

    items = [PackedDataset(packed)[i] for i in range(4)]
    batch = HFCollator(flatten=flatten)(items)
    worst, moved = per_document_logits_match(model, batch)
    assert worst < 1e-5, worst
    assert moved > 1e-3, moved  # the check can fail: use_cache=True leaks across documents


def test_collator_output_survives_remove_unused_columns(packed, tmp_path):
    """Trainer's default column removal filters the items, never the batch the collator returns:
    every key reaches the model (``seq_idx`` and the flash keywords through its
    ``TransformersKwargs``)."""
    model = tiny_llama()
    trainer = transformers.Trainer(model=model,
                                   args=transformers.TrainingArguments(output_dir=str(tmp_path)),
                                   train_dataset=PackedDataset(packed),
                                   data_collator=HFCollator())
    assert trainer.args.remove_unused_columns is True
    batch = next(iter(trainer.get_train_dataloader()))
    flash = {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
    assert set(batch) == {"input_ids", "position_ids", "labels", "use_cache", "seq_idx"} | flash
    assert batch["use_cache"] is False
    assert batch["seq_idx"].dtype == torch.int32 and batch["cu_seq_lens_q"].dtype == torch.int32
    annotated = set(transformers.utils.generic.TransformersKwargs.__annotations__)
    for name in ("FlashAttentionKwargs",):
        annotated |= set(getattr(transformers.modeling_flash_attention_utils, name)
                         .__annotations__)
    assert {"seq_idx"} | flash <= annotated


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex_attention", "flash_attention_2"])
@pytest.mark.parametrize("flatten", [False, True])
def test_the_default_collator_isolates_a_batch_of_rows_in_every_attention(packed, monkeypatch,
                                                                        impl, flatten):
    """HFCollator() batches of 3 rows fed whole to the model (model(**batch), as Trainer does):
    per-document logits equal each document alone in every attention implementation. Hugging
    Face's flash_attention_2 reads boundaries from position_ids for one row only, so [B, C]
    needs the cu_seq_lens keywords; without them (the control) documents leak."""
    if impl == "flash_attention_2":
        emulate_flash_attention_2(monkeypatch)
    model = tiny_llama().eval()
    model.config._attn_implementation = impl
    items = [PackedDataset(packed)[i] for i in range(3)]

    def worst(collator):
        batch = collator(items)
        with torch.no_grad():
            got = model(**{k: v for k, v in batch.items() if k not in ("labels", "seq_idx")}
                        ).logits.reshape(3, 32, VOCAB)
            model.config._attn_implementation = "eager"
            w = 0.0
            for r, it in enumerate(items):
                cu = it["cu_seqlens"].tolist()
                for a, e in zip(cu[:-1], cu[1:]):
                    if it["labels"][a + 1:e].tolist() == [-100] * (e - a - 1):
                        continue  # the padding tail
                    alone = model(input_ids=torch.as_tensor(it["input_ids"][a:e]).long()[None],
                                  use_cache=False).logits[0]
                    w = max(w, float((got[r, a:e] - alone).abs().max()))
            model.config._attn_implementation = impl
        return w

    assert worst(HFCollator(flatten=flatten)) < 1e-5
    if impl == "flash_attention_2" and not flatten:
        assert worst(HFCollator(flash_attn_kwargs=False)) > 1e-3  # the control


def test_trainer_loss_denominator_is_effective_targets(packed, tmp_path):
    """The loss Trainer computes on a batch is the token loss summed over labels != -100 divided
    by their count (B19/B20): recomputed by hand from the logits."""
    model = tiny_llama()
    items = [PackedDataset(packed)[i] for i in range(3)]
    batch = HFCollator()(items)
    with torch.no_grad():
        out = model(**batch)
        logits = out.logits[:, :-1].reshape(-1, VOCAB)
        target = batch["labels"][:, 1:].reshape(-1)
        s = torch.nn.functional.cross_entropy(logits, target, ignore_index=-100,
                                              reduction="sum")
    n = int((batch["labels"] != -100).sum())
    assert n == sum(int(it["num_targets"]) for it in items)
    assert abs(float(out.loss) - float(s) / n) < 1e-5


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("dataset, make", [("packtool", HFCollator), ("list", HFCollator),
                                           ("list", lambda: collate),
                                           ("list", lambda: collate_flat)])
def test_accelerate_dispatching_that_would_cut_the_boundaries_is_refused(packed, tmp_path,
                                                                       dataset, make, world):
    """accelerate's default for an IterableDataset (dispatch_batches) slices every tensor of a
    batch to its rows: cu_seq_lens_q [0, 7, 8, 14, 16] arrived as [0, 7] (FlashAttention varlen
    on wrong boundaries), cu_seqlens of collate likewise. The dataset refuses it when the epoch
    begins, and HFCollator (its flash keywords) under Trainer, collate and collate_flat in an
    accelerate loop of one's own, for any IterableDataset, naming dispatch_batches=False."""
    import datasets

    model = tiny_llama()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=1,
                                          report_to=[], use_cpu=True)
    if dataset == "packtool":
        ds = PackedIterableDataset(packed, labels="unshifted", rank=0, world_size=world)
    else:
        items = [PackedDataset(packed)[i] for i in range(4)]
        ds = datasets.Dataset.from_list([{k: items[i][k] for k in ("input_ids", "position_ids",
                                                                   "labels")}
                                         for i in range(4)]).to_iterable_dataset()
    fix = r"dispatch_batches=False" + (r".*rank=0, world_size=1" if dataset == "packtool"
                                       and world > 1 else "")
    if make is HFCollator:
        trainer = transformers.Trainer(model=model, args=args, train_dataset=ds,
                                       data_collator=make())
        with pytest.raises(ValueError, match=fix):
            trainer.train()
        return
    # collate and collate_flat are for a loop of one's own (refused as Trainer's collator)
    import accelerate

    loader = accelerate.Accelerator(cpu=True).prepare(
        torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=make()))
    with pytest.raises(ValueError, match=fix):
        next(iter(loader))


def test_a_rank_share_under_accelerates_iterable_shard_is_refused_and_one_stream_is_split(
        packed):
    """With dispatch_batches=False on several processes accelerate wraps the dataset in
    IterableDatasetShard, which keeps each process's share of the items: a dataset that is one
    rank's share already would lose the other ranks' rows (refused when the epoch begins);
    built as rank 0 of 1, the processes together read every row once."""
    from accelerate.data_loader import IterableDatasetShard

    for rank in (0, 1):
        shard = IterableDatasetShard(PackedIterableDataset(packed, rank=rank, world_size=2),
                                     batch_size=2, num_processes=2, process_index=rank)
        with pytest.raises(ValueError, match=r"rank .* of 2 already.*rank=0, world_size=1"):
            shard.set_epoch(0)
    whole = PackedIterableDataset(packed, rank=0, world_size=1, seed=3)
    seen = []
    for p in (0, 1):
        shard = IterableDatasetShard(PackedIterableDataset(packed, rank=0, world_size=1, seed=3),
                                     batch_size=2, num_processes=2, process_index=p,
                                     drop_last=True)
        shard.set_epoch(0)
        seen += [(it["shard"], int(it["row"])) for it in shard]
    everything = [(it["shard"], int(it["row"])) for it in whole]
    full = len(everything) // 4 * 4  # drop_last: whole steps of 2 rows on 2 processes
    assert sorted(seen) == sorted(everything[:full])


class _Wrapped(torch.utils.data.IterableDataset):
    """A user's wrapper around the dataset: forwards set_epoch (or not) and iteration."""

    def __init__(self, inner, forward_epoch):
        self.inner, self.forward_epoch = inner, forward_epoch

    def set_epoch(self, epoch):
        if self.forward_epoch:
            self.inner.set_epoch(epoch)

    def __iter__(self):
        yield from self.inner


@pytest.mark.parametrize("forward_epoch", [True, False])
def test_a_rank_share_inside_a_users_wrapper_is_refused_too(packed, forward_epoch):
    """The wrapper between accelerate's IterableDatasetShard and the dataset hid it (8 of 19
    rows never trained on 2 ranks): the stack is walked, in set_epoch and when iterating."""
    from accelerate.data_loader import IterableDatasetShard

    inner = PackedIterableDataset(packed, rank=1, world_size=2)
    shard = IterableDatasetShard(_Wrapped(inner, forward_epoch), batch_size=2,
                                 num_processes=2, process_index=1)
    with pytest.raises(ValueError, match=r"rank 1 of 2 already"):
        shard.set_epoch(0)
        next(iter(shard))


def test_accelerates_iterable_shard_in_several_workers_is_refused(packed):
    """IterableDatasetShard runs in each DataLoader worker and pads each worker's part on its
    own (rows skipped and repeated on 2 ranks); one worker is fine."""
    from accelerate.data_loader import IterableDatasetShard

    def loader(workers):
        shard = IterableDatasetShard(PackedIterableDataset(packed, rank=0, world_size=1),
                                     batch_size=2, num_processes=2, process_index=0)
        return torch.utils.data.DataLoader(shard, batch_size=2, num_workers=workers,
                                           collate_fn=list)

    with pytest.raises(Exception, match=r"runs in each of the 2 DataLoader workers"):
        list(loader(2))
    assert sum(len(b) for b in loader(1)) == sum(len(b) for b in loader(0)) > 0


def test_a_model_without_position_ids_is_refused_naming_the_cause(packed, tmp_path):
    """BLOOM's forward takes no position_ids, so Trainer's column removal drops them from the
    items: the collator's refusal says so and that the model cannot keep packed documents
    apart (it named segment_ids and advised remove_unused_columns=False alone, which then
    trained BLOOM with documents attending to each other)."""
    cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=2)
    trainer = transformers.Trainer(model=transformers.BloomForCausalLM(cfg),
                                   args=transformers.TrainingArguments(output_dir=str(tmp_path)),
                                   train_dataset=PackedDataset(packed),
                                   data_collator=HFCollator())
    with pytest.raises(ValueError) as exc:
        next(iter(trainer.get_train_dataloader()))
    msg = str(exc.value)
    assert msg.startswith("a batch needs position_ids beside input_ids and labels"), msg
    assert "takes no position_ids" in msg and "cannot keep the documents" in msg


@pytest.mark.parametrize("make, dataset, workers, remove", [
    (collate, "map", 0, True), (collate_flat, "map", 0, True),  # RemoveColumnsCollator calls it
    (collate, "map", 0, False),  # the DataLoader calls it, Trainer's loop up the stack
    (collate_flat, "map", 1, True),  # RemoveColumnsCollator in a worker
    (collate_flat, "iterable", 0, False),
    (collate, "iterable", 1, False)])  # unseen in the worker: the dataset's set_epoch
def test_collate_under_trainer_is_refused_naming_hfcollator(packed, tmp_path, make, dataset,
                                                            workers, remove):
    """Trainer hands every key of the batch to the model's forward: collate's and collate_flat's
    provenance key ``source`` met the loss function's own ``source`` argument
    (``TypeError: fixed_cross_entropy() got multiple values for argument 'source'``), the other
    keys were ignored and no use_cache=False reached the model (documents attending to each
    other). Refused before the first step in one line naming HFCollator, with or without
    Trainer's column removal and DataLoader workers."""
    model = tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=1, per_device_train_batch_size=2,
        report_to=[], save_strategy="no", use_cpu=True, remove_unused_columns=remove,
        dataloader_num_workers=workers, **NO_DISPATCH)
    ds = PackedDataset(packed) if dataset == "map" else PackedIterableDataset(packed, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds, data_collator=make)
    with pytest.raises(ValueError) as exc:
        trainer.train()
    msg = str(exc.value).strip().splitlines()[-1]
    assert make.__name__ in msg and "HFCollator(" in msg and "Trainer" in msg, msg
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_collate_in_a_loop_of_ones_own_and_hfcollator_under_trainer_still_work(packed,
                                                                              tmp_path):
    """The refusal is for Trainer's DataLoader only: collate in a plain DataLoader (transformers
    imported, a Trainer built) and HFCollator under Trainer go on working."""
    model = tiny_llama()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=1,
                                          per_device_train_batch_size=2, report_to=[],
                                          save_strategy="no", use_cpu=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=PackedDataset(packed),
                                   data_collator=HFCollator())
    for make in (collate, collate_flat):
        b = next(iter(torch.utils.data.DataLoader(PackedDataset(packed), batch_size=2,
                                                  collate_fn=make)))
        assert "source" in b and b["input_ids"].numel() == 64
    assert trainer.train().global_step == 1
