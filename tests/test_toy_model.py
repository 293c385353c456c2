"""A model written against the contract alone: a toy defined here, no ``BaseModel``, with the
training and search capabilities of :mod:`docnmt_jax.models.contract` and nothing else,
registered in this process through the public registry, is trained, evaluated and translated
by the functions the commands call (``launch/train.py``: ``train_and_evaluate`` with the
dev-BLEU hook; ``launch/translate.py``: ``load_translator`` and ``translate_stream``;
``launch/evaluate.py``: ``evaluate_files``). A second toy without search is refused with one
line naming it and the capability when asked to translate."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import pytest
from conftest import ROOT, tiny_config

from docnmt_jax.data import readers
from docnmt_jax.data.spec import DataSpec, PipelineConfig
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.search import SearchConfig, search_rows, sentence_limits
from docnmt_jax.errors import CapabilityError, ModelError
from docnmt_jax.evaluation.metrics import evaluate_files
from docnmt_jax.models import (
    BatchLayout,
    Model,
    PackedTraining,
    Scoring,
    Searchable,
    Trainable,
    layers,
    register,
)
from docnmt_jax.models.base import token_metrics
from docnmt_jax.models.transformer import sentence_rows
from docnmt_jax.training import dev_eval, restore, trainer

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class BagConfig:
    """``logits_t = E^T tanh(W (E[y_{t-1}] + mean_j E[x_j]))``; ``d_model`` also sets the
    learning-rate schedule (``config.model.d_model``)."""

    vocab_size: int = 300
    d_model: int = 16


class BagOfWords(nn.Module):
    """A bag-of-source-words decoder with the search hooks of :func:`search_rows`."""

    config: BagConfig

    def setup(self) -> None:
        self.embed = layers.SharedEmbedding(self.config.vocab_size, self.config.d_model)
        self.mix = nn.Dense(self.config.d_model)

    def encode(self, src: Array, src_mask: Array) -> Array:
        weights = src_mask[..., None].astype(jnp.float32)
        total = jnp.sum(self.embed(src) * weights, axis=1, keepdims=True)
        return total / jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), 1.0)  # [N, 1, D]

    def _logits(self, previous: Array, context: Array) -> Array:
        return self.embed.attend(jnp.tanh(self.mix(self.embed(previous) + context)))

    def __call__(self, src: Array, src_mask: Array, tgt: Array) -> Array:
        return self._logits(layers.shift_right(tgt, BOS_ID), self.encode(src, src_mask))

    def init_cache(self, batch: int, max_len: int) -> dict[str, Array]:
        return {"steps": jnp.zeros((batch,), jnp.int32)}  # no state but each row's steps

    def decode_inputs(self, encoded: Array, src_mask: Array) -> dict[str, Array]:
        return {"src_mask": src_mask, "context": encoded}

    def decode_step(
        self, cache: dict[str, Array], token: Array, extra: dict[str, Array]
    ) -> tuple[Array, dict[str, Array]]:
        context = jnp.repeat(extra["context"], token.shape[0] // extra["context"].shape[0], 0)
        return self._logits(token[:, None], context)[:, 0], {"steps": cache["steps"] + 1}


@register("test_toy_train_only", config=BagConfig)
class TrainOnlyToy:
    """The training capability alone (:class:`~docnmt_jax.models.contract.Trainable`): one
    sentence per row, the ``[B, S, T]`` grid (no packed training), no context."""

    name: ClassVar[str]
    layout = BatchLayout.SENTENCES

    def __init__(self, config: BagConfig, label_smoothing: float = 0.0):
        self.config = config
        self.label_smoothing = label_smoothing
        self.module = BagOfWords(config)

    @property
    def context_sentences(self) -> int:
        return 0

    @property
    def whole_documents(self) -> bool:
        return False

    @property
    def uses_context(self) -> bool:
        return False

    def data_spec(self) -> DataSpec:
        """One sentence a row, no context, the ``[B, S, T]`` grid only (no packed rows)."""
        return DataSpec()

    def check_data(self, config: PipelineConfig) -> None:
        """The toy reads the grid only."""
        if config.packing is not None:
            raise ModelError(f"model {self.name!r} trains on the [B, S, T] grid only")

    def init(self, rng: Array, batch: dict[str, Array]) -> Any:
        rows = sentence_rows(batch)
        return self.module.init(rng, rows["src"], rows["src_mask"], rows["tgt"])

    def loss(
        self, params: Any, batch: dict[str, Array], rng: Array | None, train: bool
    ) -> tuple[Array, dict]:
        rows = sentence_rows(batch)
        logits = self.module.apply({"params": params}, rows["src"], rows["src_mask"], rows["tgt"])
        metrics = token_metrics(logits, rows["tgt"], rows["tgt_mask"], self.label_smoothing)
        return metrics["loss"].total / jnp.maximum(metrics["loss"].weight, 1.0), metrics


@register("test_toy_train_and_search", config=BagConfig)
class SearchToy(TrainOnlyToy):
    """Training and search (:class:`~docnmt_jax.models.contract.Searchable`), nothing else."""

    def max_source_len(self, sentences_per_chunk: int) -> int | None:
        return None  # the source is a mean of embeddings: any length

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        rows = sentence_rows(batch)
        max_len, limits = sentence_limits(rows["src_mask"], search)
        result = search_rows(
            self.module, params, rows["src"], rows["src_mask"], search, max_len, limits
        )
        return result.sequences[:, 0].reshape(batch["src"].shape[:2] + (max_len,)), {}


def _config(data_dir: str, name: str, **train: Any) -> ml_collections.ConfigDict:
    config = tiny_config(data_dir, **train)
    config.model = ml_collections.ConfigDict({"name": name, "d_model": 16})
    return config


def test_the_toys_hold_exactly_their_capabilities():
    toy, untranslatable = SearchToy(BagConfig()), TrainOnlyToy(BagConfig())
    assert isinstance(toy, Trainable) and isinstance(toy, Searchable)
    assert isinstance(untranslatable, Trainable) and not isinstance(untranslatable, Searchable)
    for model in (toy, untranslatable):
        assert not isinstance(model, (PackedTraining, Scoring, Model))


def test_a_toy_with_training_and_search_trains_translates_and_is_evaluated(synthetic_dir, tmp_path):
    workdir = str(tmp_path / "toy")
    config = _config(synthetic_dir, "test_toy_train_and_search", num_steps=20)
    config.train.dev_bleu = True  # dev BLEU translates with the Translator during training
    result = trainer.train_and_evaluate(
        config, workdir, record_losses=True, dev_hook=dev_eval.dev_bleu_hook(config)
    )
    assert result.step == 20 and result.losses[-1] < result.losses[0]
    assert {"dev_loss", "dev_nll", "dev_ppl", "dev_bleu", "dev_dbleu"} <= set(result.dev_metrics)
    log = open(os.path.join(workdir, "train.log"), encoding="utf-8").read()
    assert "model test_toy_train_and_search" in log and "[B, S, T] grid" in log
    # launch/translate.py's path, then launch/evaluate.py's scoring of its output.
    source = os.path.join(synthetic_dir, "dev.tsv")
    translator, step = restore.load_translator(workdir, "best", SearchConfig(beam_size=2))
    documents = ((doc_id, s) for doc_id, s, _ in readers.iter_source_documents(source))
    hyp = tmp_path / "hyp.tsv"
    with open(hyp, "w", encoding="utf-8") as out:
        out.write("doc_id\thyp\n")
        for doc_id, hyps in translator.translate_stream(documents, block_documents=4):
            out.writelines(f"{doc_id}\t{h}\n" for h in hyps)
    scores = evaluate_files(str(hyp), source)
    assert step == 20 and 0.0 <= scores["s_bleu"]["score"] <= 100.0
    lines = hyp.read_text(encoding="utf-8").splitlines()
    assert len(lines) - 1 == sum(len(d.src) for d in readers.read_tsv(source))


def test_a_toy_without_search_is_refused_with_one_line(synthetic_dir, tmp_path):
    workdir = str(tmp_path / "untranslatable")
    trainer.train_and_evaluate(_config(synthetic_dir, "test_toy_train_only", num_steps=2), workdir)
    with pytest.raises(CapabilityError) as refused:
        restore.load_translator(workdir, "latest", SearchConfig(beam_size=1))
    message = str(refused.value)
    assert "\n" not in message
    assert "'test_toy_train_only' cannot translate" in message and "Searchable" in message
    # The command line prints that line and exits 2, without a traceback.
    source = os.path.join(synthetic_dir, "dev.tsv")
    argv = [f"--workdir={workdir}", f"--input={source}", f"--output={tmp_path / 'hyp.tsv'}"]
    code = (
        "import runpy, sys; sys.path.insert(0, 'tests'); import test_toy_model; "
        f"sys.argv = ['translate.py'] + {argv!r}; "
        "runpy.run_path('launch/translate.py', run_name='__main__')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == f"translate.py: error: {message}"
