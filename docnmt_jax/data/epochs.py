"""What every batch plan shares (:mod:`~docnmt_jax.data.batch_plan`,
:mod:`~docnmt_jax.data.packed_plan`, :mod:`~docnmt_jax.data.grouped_plan`): the batches of one
epoch (:class:`EpochPlan`) and the walk over epochs from any step (:class:`EpochIteration`)."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator

import numpy as np

from docnmt_jax.data import schema
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.data.tokenized import TokenizedCorpus

Batch = schema.Batch


def segments(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``flat[starts[i] : starts[i] + lengths[i]]`` over ``i`` (vectorised)."""
    out_starts = np.cumsum(lengths) - lengths
    return flat[np.repeat(starts - out_starts, lengths) + np.arange(int(lengths.sum()))]


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """Batches of one epoch in order: batch ``b`` is the chunk ids ``ids[starts[b]:][:sizes[b]]``
    (-1 = padding row) in shape ``[sizes[b], s[b], t[b]]``."""

    ids: np.ndarray  # int32 [sum(sizes)]
    sizes: np.ndarray  # int32 [batches]
    s: np.ndarray  # int32 [batches]
    t: np.ndarray  # int32 [batches]

    def __len__(self) -> int:
        return int(self.sizes.size)

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.sizes, dtype=np.int64) - self.sizes

    def batch(self, b: int) -> np.ndarray:
        start = int(self.starts[b])
        return self.ids[start : start + int(self.sizes[b])]

    def local(self, process_index: int, process_count: int) -> EpochPlan:
        """The rows ``[i*B/P, (i+1)*B/P)`` of every batch, for process ``i`` of ``P``."""
        sizes = self.sizes // process_count
        ids = segments(self.ids, self.starts + process_index * sizes, sizes)
        return EpochPlan(ids, sizes, self.s, self.t)

    def slice(self, start: int) -> EpochPlan:
        """Batches ``start`` and later."""
        first = int(self.sizes[:start].sum())
        return EpochPlan(self.ids[first:], self.sizes[start:], self.s[start:], self.t[start:])


def check_corpus_config(corpus: TokenizedCorpus, config: PipelineConfig) -> None:
    """Raises ValueError unless ``corpus`` was truncated to ``config``'s max lengths."""
    if (corpus.src.max_len, corpus.tgt.max_len) != (config.max_src_len, config.max_tgt_len):
        raise ValueError(
            f"corpus was truncated to max lengths ({corpus.src.max_len}, "
            f"{corpus.tgt.max_len}) but the config asks for ({config.max_src_len}, "
            f"{config.max_tgt_len}); re-run tokenize_corpus with this config"
        )


class EpochIteration(abc.ABC):
    """Steps over epochs for a plan that defines ``config`` (a :class:`PipelineConfig`),
    ``batches_per_epoch`` (the same in every epoch) and ``epoch(e) -> EpochPlan``: step ``n``
    is batch ``n mod batches_per_epoch`` of epoch ``n // batches_per_epoch`` (:meth:`locate`;
    a plan whose epochs differ in length overrides it and :attr:`num_batches`)."""

    config: PipelineConfig
    batches_per_epoch: int

    @abc.abstractmethod
    def epoch(self, e: int) -> EpochPlan:
        """The global batches of epoch ``e``."""

    @property
    def num_batches(self) -> int | None:
        """Total global batches, or None when repeating forever."""
        e = self.config.num_epochs
        return None if e is None else e * self.batches_per_epoch

    def locate(self, step: int) -> tuple[int, int]:
        """``(epoch, batch)`` of global step ``step`` (0-based)."""
        return divmod(step, self.batches_per_epoch)

    def epochs_from(self, start_step: int = 0) -> Iterator[EpochPlan]:
        """Global epoch plans from step ``start_step`` on (the first one sliced to start there)."""
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        if self.batches_per_epoch == 0:
            if self.config.num_epochs is None:
                raise ValueError("the plan has no batch per epoch: the corpus is too small")
            return
        e, i = self.locate(start_step)
        while self.config.num_epochs is None or e < self.config.num_epochs:
            yield self.epoch(e).slice(i)
            e, i = e + 1, 0

    def local_epochs_from(self, start_step: int = 0) -> Iterator[EpochPlan]:
        """Like :meth:`epochs_from`, restricted to this process's rows."""
        cfg = self.config
        for plan in self.epochs_from(start_step):
            yield plan.local(cfg.process_index, cfg.process_count)
