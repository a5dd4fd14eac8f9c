"""ImageNet under the original protocol: the DALI preprocessing against the original's own
pipeline (DALI's mxnet reader on val.rec, the same resize/crop/normalise), the count of zero rows
the original's launch leaves (against DALI's iterator), and a whole evaluation that adds them."""

import math

import numpy as np
import pytest
import torch
from nvidia.dali import Pipeline, fn, types
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

from src.evaluation.dali_val import dali_val_batches, resize_shorter
from src.evaluation.paper_datasets import find_paper_dataset, read_paper_dataset
from src.evaluation.protocol import original_padding_rows
from src.evaluation.run import evaluate_classification
from src.evaluation.specs import DatasetSpec
from src.open_alip.constants import CLIP_MEAN, CLIP_STD
from src.open_alip.zero_shot import prediction_metrics, top_predictions
from src.recordio import read_record_at, unpack
from tests._eval_layouts import micro_model, write_imagenet_rec

SIZE = 32  # RWKV_CLIP_tiny's input size


def _original_pipeline(rec, batch: int, shard_id: int = 0, num_shards: int = 1) -> Pipeline:
    """The original's validation pipeline (its dataloaders/imagenet.py, is_training=False), on CPU."""
    pipe = Pipeline(batch_size=batch, num_threads=1, device_id=None)
    with pipe:
        jpegs, labels = fn.readers.mxnet(
            path=str(rec),
            index_path=str(rec.with_suffix(".idx")),
            shard_id=shard_id,
            num_shards=num_shards,
            random_shuffle=False,
            pad_last_batch=False,
            name="loader_test",
        )
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(
            images, size=int(256 / 224 * SIZE), mode="not_smaller", interp_type=types.INTERP_TRIANGULAR
        )
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            crop=(SIZE, SIZE),
            mean=[m * 255 for m in CLIP_MEAN],
            std=[s * 255 for s in CLIP_STD],
            mirror=False,
        )
        pipe.set_outputs(images, labels)
    pipe.build()
    return pipe


def test_dali_preprocessing_equals_the_originals_pipeline(tmp_path):
    labels = [3, 1, 4, 1, 5, 9, 2]
    rec = write_imagenet_rec(tmp_path, labels)
    data, _ = read_paper_dataset(find_paper_dataset("imagenet"), rec)
    ours = [
        (b.images, b.labels)
        for b in dali_val_batches(data.images, data.labels, SIZE, batch_size=3, device="cpu", workers=2)
    ]
    reference = DALIClassificationIterator(
        _original_pipeline(rec, 3),
        reader_name="loader_test",
        last_batch_policy=LastBatchPolicy.PARTIAL,
        last_batch_padded=False,
    )
    expected = [(b[0]["data"], b[0]["label"][:, 0].long()) for b in reference]
    assert [x.shape[0] for x, _ in ours] == [3, 3, 1] == [x.shape[0] for x, _ in expected]
    for (x, y), (ex, ey) in zip(ours, expected):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    assert torch.cat([y for _, y in ours]).tolist() == labels
    assert resize_shorter(224) == 256
    # the val folder (1000 synset folders) goes through the same pipeline, labels from the folders
    val = tmp_path / "val"
    for i in range(1000):
        (val / f"n{i:08d}").mkdir(parents=True)
    with open(rec, "rb") as f:
        for i, image in enumerate(data.images):
            _, payload = unpack(read_record_at(f, image.offset, str(rec)))
            (val / f"n{labels[i]:08d}" / f"ILSVRC2012_val_{i:08d}.JPEG").write_bytes(payload)
    folder, _ = read_paper_dataset(find_paper_dataset("imagenet"), val)
    assert sorted(folder.labels) == sorted(labels)
    from_files = torch.cat(
        [b.images for b in dali_val_batches(folder.images, folder.labels, SIZE, 4, "cpu", 1)]
    )
    by_label = {y: x for (x, y) in zip(torch.cat([x for x, _ in ours]), labels) if labels.count(y) == 1}
    for x, y in zip(from_files, folder.labels):
        if y in by_label:
            assert torch.equal(x, by_label[y])


@pytest.mark.parametrize("count,ranks,batch", [(37, 3, 5), (50, 4, 6), (12, 1, 4)])
def test_padding_rows_are_what_the_originals_iterator_allocates(tmp_path, count, ranks, batch):
    rec = write_imagenet_rec(tmp_path, [i % 7 for i in range(count)])
    allocated = 0
    for rank in range(ranks):  # each rank allocates len(loader) * batch rows
        iterator = DALIClassificationIterator(
            _original_pipeline(rec, batch, rank, ranks),
            reader_name="loader_test",
            last_batch_policy=LastBatchPolicy.PARTIAL,
            last_batch_padded=False,
        )
        allocated += len(iterator) * batch
        assert sum(b[0]["data"].shape[0] for b in iterator) <= len(iterator) * batch
    assert original_padding_rows(count, (ranks, batch)) == allocated - count
    assert original_padding_rows(50000, (8, 120)) == 880  # the paper's run: 8 GPUs x batch 120


def test_imagenet_original_protocol_counts_the_zero_rows(tmp_path):
    labels = [0, 5, 999, 0, 12]
    rec = write_imagenet_rec(tmp_path, labels)
    (tmp_path / "one.txt").write_text("a photo of a {}.\n")  # 1000 prompts, not 80,000
    spec = DatasetSpec("imagenet", rec, templates=tmp_path / "one.txt")
    model = micro_model()
    original = evaluate_classification(
        model, spec, SIZE, "cpu", batch_size=2, protocol="original", return_predictions=True
    )
    padding = 8 * 120 - len(labels)
    assert original["padded_rows"] == padding == original_padding_rows(len(labels), (8, 120))
    assert original["num_images"] == 5 and original["metric"] == "top1"
    assert original["preprocessing"].startswith("DALI, cpu decoder: triangular resize")
    # the zero rows rank like any int64 row and count with target 0
    pad1, padk = top_predictions(torch.zeros(1, 1000, dtype=torch.long))
    top1 = torch.tensor(original["predictions"])
    unpadded = original["metrics_without_padding"]
    hits = (top1 == torch.tensor(labels)).sum().item() + padding * int(pad1.item() == 0)
    assert original["metrics"]["top1"] == pytest.approx(100 * hits / (len(labels) + padding))
    assert unpadded["top1"] == pytest.approx(100 * (top1 == torch.tensor(labels)).float().mean().item())
    assert original["score"] == original["metrics"]["top1"]
    standard = evaluate_classification(model, spec, SIZE, "cpu", batch_size=2, protocol="standard")
    assert "padded_rows" not in standard and standard["num_images"] == 5
    assert set(standard["metrics"]) == set(unpadded) == {"top1", "top5", "mean_per_class_recall"}
    assert not math.isnan(prediction_metrics(top1, top1[:, None], torch.tensor(labels), 1000)["top1"])


def test_unreadable_images_are_skipped_on_the_dali_path(tmp_path):
    # DALI fails a whole batch for one bad image; the original protocol's ImageNet once stopped there.
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"{i}.JPEG")
        Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(paths[-1], quality=90)
    whole = paths[2].read_bytes()
    paths[2].write_bytes(whole[: len(whole) // 2])  # cut short: found before decoding
    paths[4].write_bytes(b"\x00" * 300)  # not an image at all: DALI's decoder refuses it
    batches = list(dali_val_batches(paths, list(range(6)), SIZE, batch_size=4, device="cpu", workers=1))
    assert [b.positions for b in batches] == [[0, 1, 3], [5]]
    assert [b.labels.tolist() for b in batches] == [[0, 1, 3], [5]]
    assert [b.images.shape[0] for b in batches] == [3, 1]
    failed = dict(f for b in batches for f in b.failed)
    assert (
        sorted(failed) == [2, 4] and "not a whole JPEG" in failed[2] and "DALI could not decode" in failed[4]
    )
    # the good images come out as they do in a batch without the bad ones
    alone = next(iter(dali_val_batches([paths[0], paths[1], paths[3]], [0, 1, 3], SIZE, 4, "cpu", 1)))
    assert torch.equal(alone.images, batches[0].images)
