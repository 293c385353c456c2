"""Pins of the batch plans: the epochs and first batches of the layouts the models train and
translate on, as SHA-256 fingerprints recorded from the planners, so that a change to the
planners or to how a model's data needs become a pipeline config is seen at once."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
from test_pipeline import encode, make_docs

from docnmt_jax.data.pipeline import PackingConfig, PipelineConfig, plan_batches

#: The trainer's settings for a small data section (``max_sentences 5``, lengths 24 / 20,
#: budgets 96 / 80, seed 3, rows a multiple of 2): the base of every pinned layout.
TRAIN = PipelineConfig(
    max_sentences=5,
    max_src_len=24,
    max_tgt_len=20,
    batch_src_tokens=96,
    batch_tgt_tokens=80,
    seed=3,
    batch_multiple=2,
)
#: The trainer's dev settings: one padded, unshuffled pass with the evaluation budget.
DEV = dataclasses.replace(
    TRAIN, batch_src_tokens=200, batch_tgt_tokens=200, shuffle=False, num_epochs=1, pad_batch=True
)
#: The translator's settings (``batch_tokens 300``, ``max_src_len 24``, target length 1).
TRANSLATE = PipelineConfig(
    max_sentences=5,
    max_src_len=24,
    max_tgt_len=1,
    batch_src_tokens=300,
    batch_tgt_tokens=300,
    shuffle=False,
    num_epochs=1,
    pad_batch=True,
)

SENTENCES = PackingConfig(unit="sentence", row_tokens=32)
CHUNKS = PackingConfig(unit="chunk", row_tokens=32)
DRIFT = PackingConfig(unit="chunk", row_tokens=32, drift=16)
GROUPED = PackingConfig(unit="grouped", row_tokens=32, max_row_sentences=16)

#: name -> (config, batches per epoch, fingerprint of :func:`fingerprint`).
PINS: dict[str, tuple[PipelineConfig, int, str]] = {
    "sentences packed": (
        dataclasses.replace(TRAIN, sentence_level=True, packing=SENTENCES),
        48,
        "eee9edbe154a0681",
    ),
    "sentences grid": (dataclasses.replace(TRAIN, sentence_level=True), 84, "dffce3f633f69b0b"),
    "sentences dev packed": (
        dataclasses.replace(DEV, sentence_level=True, packing=SENTENCES),
        16,
        "2c9c7290dfe4fbac",
    ),
    "sentences dev grid": (dataclasses.replace(DEV, sentence_level=True), 26, "ba48250f8e5fabc2"),
    "sentences translate": (
        dataclasses.replace(TRANSLATE, sentence_level=True),
        15,
        "f78e381f0537e304",
    ),
    "chunks packed": (dataclasses.replace(TRAIN, packing=CHUNKS), 31, "ed76c56fbe7d9c9a"),
    "chunks grid": (TRAIN, 35, "a2b3bf90b9a66d2c"),
    "chunks dev packed": (dataclasses.replace(DEV, packing=CHUNKS), 28, "f7c1f89c3b895485"),
    "chunks dev grid": (DEV, 34, "8e0681a6593ddc8b"),
    "chunks translate": (TRANSLATE, 28, "558777b213b2bd47"),
    "drift packed": (dataclasses.replace(TRAIN, packing=DRIFT), 34, "329ad856a41338d5"),
    "packed streams": (
        dataclasses.replace(TRAIN, packing=DRIFT, streams=True),
        18,
        "7c04cc791b93852b",
    ),
    "packed stream windows": (
        dataclasses.replace(TRAIN, packing=DRIFT, streams=True, stream_window=2),
        9,
        "29db5a062b7fa4d9",
    ),
    "packed streams dev": (
        dataclasses.replace(DEV, packing=DRIFT, streams=True),
        16,
        "7baad16eb6f23135",
    ),
    "sequential translate": (
        dataclasses.replace(TRANSLATE, sequential_sentences=True),
        11,
        "f48a657209a65626",
    ),
    "grouped documents": (
        dataclasses.replace(TRAIN, packing=GROUPED, whole_documents=True),
        28,
        "ef8730d8c6f202c1",
    ),
    "documents grid": (dataclasses.replace(TRAIN, whole_documents=True), 16, "267f25281d0dd0b4"),
    "documents translate": (
        dataclasses.replace(TRANSLATE, whole_documents=True),
        30,
        "18ac579ae63279cc",
    ),
    "grouped chunks": (dataclasses.replace(TRAIN, packing=GROUPED), 58, "fd69653ed88ba515"),
    "window chunks": (dataclasses.replace(TRAIN, context_sentences=2), 35, "8ab69a9ba5bb8371"),
    "window sentences": (
        dataclasses.replace(TRAIN, sentence_level=True, context_sentences=3),
        104,
        "063bb57fc65b6551",
    ),
    "window sentences translate": (
        dataclasses.replace(TRANSLATE, sentence_level=True, context_sentences=3),
        19,
        "e99cdef27151c638",
    ),
}


def fingerprint(config: PipelineConfig) -> tuple[int, str]:
    """Batches per epoch and the first 16 hex digits of a SHA-256 over epochs 0 and 1 (ids,
    sizes, S, T) and every feature of epoch 0's first three batches, of the plan of
    ``make_docs(40)``."""
    plan = plan_batches(make_docs(40), encode, dataclasses.replace(config, num_epochs=None))
    digest = hashlib.sha256()
    for e in range(2):
        ep = plan.epoch(e)
        for array in (ep.ids, ep.sizes, ep.s, ep.t):
            digest.update(np.ascontiguousarray(array, np.int64).tobytes())
    ep = plan.epoch(0)
    for b in range(min(3, len(ep))):
        batch = plan.materialize(ep.batch(b), int(ep.s[b]), int(ep.t[b]))
        for key in sorted(batch):
            digest.update(key.encode())
            digest.update(np.ascontiguousarray(batch[key], np.int64).tobytes())
    return plan.batches_per_epoch, digest.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(PINS))
def test_plan_is_the_pinned_one(name):
    config, batches, digest = PINS[name]
    assert fingerprint(config) == (batches, digest)
