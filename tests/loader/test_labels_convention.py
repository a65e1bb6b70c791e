"""One labels convention from loader to model, whatever ``--labels`` the pack used (B05).

The training examples run as shipped against outputs packed with ``--labels none``,
``unshifted`` and ``shifted``, and every (logit, target) pair their loss scores is checked: the
logits at position i are scored against token i + 1 of the same row, never i + 2 (labels
shifted twice) and never i (not shifted at all). The loader and every collate name the
convention they hand out, and a collator that cannot tell it from the items refuses labels
that contradict it instead of shifting them again.
"""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from packtool.loader import (HFCollator, PackedDataset, PackedIterableDataset,  # noqa: E402
                             collate, collate_flat)

from loader_helpers import pack, write_input  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["none", "unshifted", "shifted"]


def _docs(n=60, seed=0):
    """Documents of 5..40 distinct-looking ids inside the examples' 131,072-token vocabulary."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 131_000, int(k)).tolist() for k in rng.integers(5, 41, n)]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    src = write_input(root / "in", _docs())
    return {m: pack(src, root / m, 64, "--labels", m) for m in LABELS}


class _ScoredPairs:
    """Records what the model saw (input_ids, logits) and what each cross_entropy scored, then
    maps every scored logit row back to its (row, position) to check the target."""

    def __init__(self, monkeypatch):
        self.forwards, self.calls = [], []
        orig_forward = transformers.LlamaForCausalLM.forward
        orig_ce = torch.nn.functional.cross_entropy

        @functools.wraps(orig_forward)  # Trainer keeps the item keys this signature names
        def forward(model, *args, **kwargs):
            out = orig_forward(model, *args, **kwargs)
            self.forwards.append((kwargs["input_ids"].detach().clone(),
                                  out.logits.detach().float().clone()))
            return out

        def cross_entropy(inp, target, *args, **kwargs):
            self.calls.append((inp.detach().float().clone(), target.detach().clone()))
            return orig_ce(inp, target, *args, **kwargs)

        monkeypatch.setattr(transformers.LlamaForCausalLM, "forward", forward)
        monkeypatch.setattr(torch.nn.functional, "cross_entropy", cross_entropy)

    def check(self) -> int:
        """Assert every scored target is the next token after its logit row; return how many
        targets were scored."""
        where: dict[bytes, list] = {}
        for ids, logits in self.forwards:
            for b in range(ids.shape[0]):
                for i in range(ids.shape[1]):
                    where.setdefault(logits[b, i, :32].numpy().tobytes(), []).append((ids, b, i))
        scored = 0
        assert self.calls, "the example computed no loss"
        for inp, target in self.calls:
            inp = inp.reshape(-1, inp.shape[-1])
            for j in torch.nonzero(target.reshape(-1) != -100).reshape(-1).tolist():
                t = int(target.reshape(-1)[j])
                found = where.get(inp[j, :32].numpy().tobytes())
                assert found, "a scored logit row that no forward produced"
                nxt = [int(ids[b, i + 1]) for ids, b, i in found if i + 1 < ids.shape[1]]
                after = [int(ids[b, i + 2]) for ids, b, i in found if i + 2 < ids.shape[1]]
                assert t in nxt, (f"logits scored against {t}, not the next token {nxt}"
                                  + (" (the one after it: labels shifted twice)"
                                     if t in after else ""))
                scored += 1
        return scored


@pytest.mark.parametrize("labels", LABELS)
def test_train_example_scores_the_next_token_with_every_labels_option(outputs, labels,
                                                                      tmp_path, monkeypatch,
                                                                      capsys):
    """examples/train.py, as shipped, on an output packed with --labels LABELS."""
    (tmp_path / "packed").symlink_to(outputs[labels])
    monkeypatch.chdir(tmp_path)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    spy = _ScoredPairs(monkeypatch)
    runpy.run_path(str(ROOT / "examples" / "train.py"), run_name="__main__")
    assert capsys.readouterr().out.count("per target") == 2
    assert spy.check() > 50


@pytest.mark.parametrize("labels", LABELS)
def test_train_hf_example_scores_the_next_token_with_every_labels_option(outputs, labels,
                                                                         tmp_path,
                                                                         monkeypatch):
    """examples/train_hf.py (Trainer + HFCollator; the model shifts) on each output."""
    (tmp_path / "packed").symlink_to(outputs[labels])
    monkeypatch.chdir(tmp_path)
    spy = _ScoredPairs(monkeypatch)
    runpy.run_path(str(ROOT / "examples" / "train_hf.py"), run_name="__main__")
    assert spy.check() > 20


def test_loader_hands_out_unshifted_labels_unless_asked_and_says_so(outputs):
    """Whatever the output stores, the default is the Hugging Face convention; every dataset,
    item and batch names the convention it holds."""
    ref = PackedDataset(outputs["none"], labels="unshifted")
    for m in LABELS:
        ds = PackedDataset(outputs[m])
        assert ds.labels_convention == "unshifted"
        assert ds[0]["labels"].tolist() == ref[0]["labels"].tolist()
        it = PackedIterableDataset(outputs[m], shuffle=False)
        assert it.labels_convention == "unshifted"
        shifted = PackedDataset(outputs[m], labels="shifted")
        items = [shifted[i] for i in range(2)]
        batch = collate(items)
        assert batch["labels_convention"] == "shifted"
        flat = collate_flat(items)
        assert flat["labels_convention"] == "unshifted"
        assert flat["labels"].reshape(2, -1).tolist() == collate(
            [ref[i] for i in range(2)])["labels"].tolist()
    assert HFCollator.labels_convention == "unshifted"


@pytest.mark.parametrize("make", [HFCollator(), HFCollator(flatten=True), collate_flat, collate])
def test_items_that_lost_their_convention_are_never_shifted_twice(outputs, make):
    """Trainer strips every key its model does not take, the convention key included: shifted
    labels handed to a collator that assumes unshifted are refused, naming the fixes that
    collator has (collate and collate_flat take no option: the items say it; HFCollator its
    labels_mode), each of which then works."""
    ds = PackedDataset(outputs["shifted"], labels="shifted")
    stripped = [{k: ds[i][k] for k in ("input_ids", "position_ids", "labels")}
                for i in range(3)]
    with pytest.raises(ValueError, match=r"labels='unshifted'.*shifted twice") as err:
        make(stripped)
    if isinstance(make, HFCollator):
        assert "say what they are: HFCollator(labels_mode='shifted')" in str(err.value)
        said = HFCollator(flatten=make.flatten, labels_mode="shifted")(stripped)
    else:
        assert "keep each item's 'labels_mode' key (or give it 'labels_convention': " \
               "'shifted')" in str(err.value), err.value
        assert "HFCollator" not in str(err.value), err.value  # no option collate takes
        said = make([{**item, "labels_convention": "shifted"} for item in stripped])
        assert make([{**item, "labels_mode": ds[i]["labels_mode"]}
                     for i, item in enumerate(stripped)])["labels"].equal(said["labels"])
    ok = PackedDataset(outputs["shifted"])  # unshifted by default
    good = [{k: ok[i][k] for k in ("input_ids", "position_ids", "labels")} for i in range(3)]
    assert make(good)["labels"].numel() == 3 * 64
    want = make(good)["labels"] if make is not collate else torch.from_numpy(
        np.stack([item["labels"] for item in stripped])).long()  # collate keeps them shifted
    assert said["labels"].equal(want)  # each fix hands out the items' labels, shifted once


@pytest.mark.parametrize("make", [HFCollator(), HFCollator(flatten=True), collate_flat, collate])
def test_shifted_labels_over_repeated_tokens_are_still_refused(tmp_path, make):
    """Over runs of one token, shifted labels equal the tokens everywhere but at the segment
    boundaries ([7, 7, 7, -100] for [7, 7, 7, 7]): the check finds them there (the first token
    of a segment is never an unshifted target), so they are not shifted twice (which would
    score 7 -> 9 across the boundary and drop a real 7 -> 7)."""
    out = pack(write_input(tmp_path / "in", [[7, 7, 7, 7], [9, 9, 9]]), tmp_path / "out", 8,
               "--labels", "shifted", "--no-shuffle", "--strategy", "ordered")
    ds = PackedDataset(out, labels="shifted")
    stripped = [{k: ds[0][k] for k in ("input_ids", "position_ids", "labels")}]
    assert stripped[0]["labels"].tolist() == [7, 7, 7, -100, 9, 9, -100, -100]
    with pytest.raises(ValueError, match=r"position 0: .*labels='unshifted'.*shifted twice"):
        make(stripped)
    ok = PackedDataset(out)
    batch = make([{k: ok[0][k] for k in ("input_ids", "position_ids", "labels")}])
    assert batch["labels"].reshape(-1).tolist() == [-100, 7, 7, 7, -100, 9, 9, -100]


@pytest.mark.parametrize("make", [HFCollator(), HFCollator(flatten=True), collate_flat, collate])
@pytest.mark.parametrize("key", ["labels_convention", "labels_mode"])
def test_one_batch_of_items_in_two_conventions_is_refused(outputs, make, key):
    """Items of two datasets read with labels=None (each its output's own convention), mixed
    in one batch (a ConcatDataset): the first item's convention must not be applied to the
    other (shifted twice, or named wrongly), in either order; an item that does not say is no
    match for one that does."""
    def said(item):  # the convention under ``key`` (items say labels_mode; both are read)
        item = dict(item)
        item[key] = item.pop("labels_mode")
        return item

    shifted = PackedDataset(outputs["shifted"], labels=None)
    plain = PackedDataset(outputs["unshifted"], labels=None)
    a, b = said(shifted[0]), said(plain[1])
    assert {a[key], b[key]} == {"shifted", "unshifted"}
    for items in ([a, b], [b, a], [a, a, b], [b, {k: v for k, v in a.items()
                                                 if k not in ("labels_convention",
                                                              "labels_mode")}]):
        with pytest.raises(ValueError, match="different labels conventions"):
            make(items)
    none = said(PackedDataset(outputs["none"], labels=None)[2])  # derived: unshifted
    assert make([b, none])["labels"].numel() == 2 * 64
    assert make([a, said(shifted[1])])["labels"].numel() == 2 * 64


@pytest.mark.parametrize("make", [HFCollator, functools.partial(HFCollator, flatten=True)])
def test_a_refused_label_says_the_rule_it_breaks_and_the_token_that_shows_the_shift(make):
    """Shifted labels over a repeated token were refused with ``label 7 is not unshifted
    (token there: 7)``, which reads as a contradiction. The message now says which rule the
    label breaks and what it had to be there (-100 at a document's first token for unshifted
    labels, at its last for shifted ones; else the token itself / the next token), and names
    the neighbouring token that shows the other convention."""
    def item(ids, pos, lab):
        return {"input_ids": np.array(ids, np.int32), "position_ids": np.array(pos, np.int32),
                "labels": np.array(lab, np.int64)}

    cases = [
        ({}, item([7, 7, 7, 7, 9, 9, 9], [0, 1, 2, 3, 0, 1, 2], [7, 7, 7, -100, 9, 9, -100]),
         "position 0: label 7 is not unshifted: position 0 is the first token of its document "
         "(segment 1), whose unshifted label must be -100 (no token before it predicts it); 7 "
         "is the next token, input_ids[1] = 7: a shifted label; "),
        ({}, item([3, 4, 5, 6], [0, 1, 2, 3], [-100, 5, 6, -100]),
         "position 1: label 5 is not unshifted: an unshifted label is the token at its own "
         "position or -100, so labels[1] must be input_ids[1] = 4 or -100; 5 is the next "
         "token, input_ids[2] = 5: a shifted label; "),
        ({"labels_mode": "shifted"}, item([7, 7, 7, 7], [0, 1, 2, 3], [-100, 7, 7, 7]),
         "position 3: label 7 is not shifted: position 3 is the last token of its document "
         "(segment 1), whose shifted label must be -100 (no next token in its document); 7 is "
         "the token at that position, input_ids[3] = 7: an unshifted label; "),
        ({"labels_mode": "shifted"}, item([3, 4, 5, 6], [0, 1, 2, 3], [-100, 4, 5, 6]),
         "position 1: label 4 is not shifted: a shifted label is the next token of its document "
         "or -100, so labels[1] must be input_ids[2] = 5 or -100; 4 is the token at that "
         "position, input_ids[1] = 4: an unshifted label; "),
    ]
    for kw, bad, words in cases:
        with pytest.raises(ValueError) as err:
            make(**kw)([bad])
        msg = str(err.value)
        assert f"batch row 0, {words}these items carry " in msg, msg
        assert "token there" not in msg and "\n" not in msg
