"""What a model needs of its data and how the pipeline delivers it: the one place both live.

:class:`DataSpec` is a model's declaration (:meth:`~docnmt_jax.models.base.BaseModel.data_spec`):
how its batch rows are laid (``rows``: single sentences, chunks, or chunks searched slot by
slot), what context a sentence reads (``context``), the source window before every chunk
(``context_sentences``), its packed rows (``packing``) and the bounds it puts on the data
(``limits``). :class:`PipelineConfig` is what the planners
(:mod:`~docnmt_jax.data.batch_plan`, :mod:`~docnmt_jax.data.packed_plan`,
:mod:`~docnmt_jax.data.grouped_plan`) take; :func:`docnmt_jax.data.builder.pipeline_config`
turns a run's settings and a spec into one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from docnmt_jax.errors import ConfigError

PACKING_UNITS: tuple[str, ...] = ("sentence", "chunk", "grouped")

#: What :func:`~docnmt_jax.data.tokenized.tokenize_corpus` does with a sentence longer than the
#: limit (described there).
ON_LONG: tuple[str, ...] = ("error", "skip", "truncate")


def check_on_long(value: str, key: str = "config.data.on_long") -> str:
    """``value`` if it is one of :data:`ON_LONG`, else a one-line :class:`ConfigError`."""
    if value not in ON_LONG:
        raise ConfigError(f"{key} must be one of {', '.join(ON_LONG)}; got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class PackingConfig:
    """Packed rows (docs/design/packing_plan.md §2.1): the items are sentences or chunks
    (``unit``), packed into rows of ``row_tokens * 2**i`` slots for ``i < max_shapes``;
    ``drift`` None keeps each side contiguous over the row, an int aligns each chunk's start on
    both sides and keeps a sentence's source and target offsets within ``drift`` slots.

    ``unit="grouped"`` (:class:`~docnmt_jax.data.packed_plan.GroupedPackedPlan`): sentences in
    rows of ``row_tokens`` slots, each chunk (a whole document with
    ``PipelineConfig.whole_documents``) whole within one batch of ``B * 2**i`` rows, so that a
    model can attend across the rows of a batch to its document's other sentences; a row
    holds at most ``max_row_sentences`` sentences (the model's static sentence slots).

    ``block_tokens`` (``unit="chunk"``, ``drift=None``): aligned rows of blocks of
    ``block_tokens`` slots, every sentence inside one block at the same block on both sides
    (:class:`~docnmt_jax.data.two_layout_plan.TwoLayoutPlan`, FINAL's two-layout step);
    ``chunk_spans`` (with ``block_tokens``): the row's chunks also fit, source side, in that
    many spans of ``L / chunk_spans`` slots, laid next-fit in the row's chunk order (the chunk
    layout of :func:`~docnmt_jax.models.final_two_layout.chunk_layout`)."""

    unit: str = "sentence"
    row_tokens: int = 128
    drift: int | None = None
    max_shapes: int = 4
    max_row_sentences: int | None = None
    block_tokens: int | None = None
    chunk_spans: int = 1

    def __post_init__(self) -> None:
        if self.unit not in PACKING_UNITS:
            raise ValueError(f"PackingConfig.unit must be in {PACKING_UNITS}, got {self.unit!r}")
        if self.row_tokens < 1:
            raise ValueError(f"PackingConfig.row_tokens must be >= 1, got {self.row_tokens}")
        if self.drift is not None and self.drift < 0:
            raise ValueError(f"PackingConfig.drift must be >= 0 or None, got {self.drift}")
        if self.max_shapes < 1:
            raise ValueError(f"PackingConfig.max_shapes must be >= 1, got {self.max_shapes}")
        if self.max_row_sentences is not None and self.max_row_sentences < 1:
            raise ValueError(
                "PackingConfig.max_row_sentences must be >= 1 or None, got "
                f"{self.max_row_sentences}"
            )
        if self.unit == "grouped" and self.drift is not None:
            raise ValueError("PackingConfig(unit='grouped') keeps each side contiguous: drift=None")
        if self.block_tokens is not None and (
            self.unit != "chunk"
            or self.drift is not None
            or self.block_tokens < 1
            or self.row_tokens % self.block_tokens
        ):
            raise ValueError(
                "PackingConfig.block_tokens needs unit='chunk', drift=None and row_tokens a "
                f"multiple of it, got {self.block_tokens} (row_tokens {self.row_tokens})"
            )

        if self.chunk_spans < 1 or (self.chunk_spans > 1 and self.block_tokens is None):
            raise ValueError(
                "PackingConfig.chunk_spans must be 1, or >= 1 with block_tokens: "
                f"{self.chunk_spans}"
            )
        if self.row_tokens % self.chunk_spans:
            raise ValueError(
                f"PackingConfig.row_tokens {self.row_tokens} is not a multiple of chunk_spans "
                f"{self.chunk_spans}"
            )

    @property
    def row_lengths(self) -> tuple[int, ...]:
        """Row lengths ``L_i = row_tokens * 2**i``, ``i < max_shapes``."""
        return tuple(self.row_tokens * 2**i for i in range(self.max_shapes))


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Chunking, bucketing, batching and ordering of the document pipeline, and the optional
    source context window of grid batches (``context_sentences``).

    ``whole_documents``: every chunk is a whole document, however long (models whose context
    is the whole document, HM-GDC); the sentence buckets then continue above
    ``max_sentences`` by factors of about 1.5 up to the corpus's longest document
    (:meth:`s_buckets_for`)."""

    max_sentences: int = 20
    max_src_len: int = 128
    max_tgt_len: int = 128
    batch_src_tokens: int = 2048
    batch_tgt_tokens: int = 2048
    sentence_level: bool = False
    length_buckets: tuple[int, ...] = (8, 16, 32, 64, 128)
    sentence_buckets: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 20)
    shuffle: bool = True
    seed: int = 0
    num_epochs: int | None = None
    process_index: int = 0
    process_count: int = 1
    pad_batch: bool = False
    batch_multiple: int = 1
    # The consumer works on one sentence of every chunk at a time (FINAL's decoding, sentence
    # after sentence): the token budget counts one sentence per chunk, ``B = budget // t``.
    sequential_sentences: bool = False
    # Packed rows instead of the [B, S, T] grid (None: the grid).
    packing: PackingConfig | None = None
    # K: grid batches also carry the K source sentences before each chunk (``context_src``,
    # ``context_src_mask`` [B, K, T], schema.CONTEXT_FEATURE_AXES) and T covers them too;
    # packed sentences carry each sentence's window in context rows (window_plan.py).
    context_sentences: int = 0
    # Chunks are whole documents (the grid, or packing unit "grouped"; not sentence_level).
    whole_documents: bool = False
    # A sentence longer than max_src_len/max_tgt_len: error | skip | truncate (tokenized.py).
    on_long: str = "truncate"
    # Document streams: each row continues its document from step to step, one chunk a step
    # (stream_plan.py; a model that carries state across chunks); rows: ``stream_rows`` (0:
    # from the token budget).
    streams: bool = False
    stream_rows: int = 0
    # Chunks of each stream a batch holds, consecutive (back-propagation through them: a
    # batch of ``stream_window * B`` rows, stream ``b``'s chunks at rows ``b*k .. b*k+k-1``).
    stream_window: int = 1

    def __post_init__(self) -> None:
        for name in (
            "max_sentences",
            "max_src_len",
            "max_tgt_len",
            "process_count",
            "batch_multiple",
            "stream_window",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"PipelineConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("batch_src_tokens", "batch_tgt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"PipelineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(f"process_index {self.process_index} not in [0, {self.process_count})")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.num_epochs is not None and self.num_epochs < 0:
            raise ValueError(f"num_epochs must be >= 0 or None, got {self.num_epochs}")
        if any(b < 1 for b in self.length_buckets + self.sentence_buckets):
            raise ValueError("bucket boundaries must be >= 1")
        if self.context_sentences < 0:
            raise ValueError(
                f"PipelineConfig.context_sentences must be >= 0, got {self.context_sentences}"
            )
        check_on_long(self.on_long, "PipelineConfig.on_long")
        windows = self.packing is not None and self.packing.unit == "sentence"
        if self.context_sentences and self.packing is not None and not windows:
            raise ValueError(
                "PipelineConfig.context_sentences needs the [B, S, T] grid or packed sentences "
                "(their windows in context rows): set packing=None or unit='sentence'"
            )
        grouped = self.packing is not None and self.packing.unit == "grouped"
        if self.whole_documents and (
            (self.packing is not None and not grouped) or self.sentence_level
        ):
            raise ValueError(
                "PipelineConfig.whole_documents needs document chunks on the [B, S, T] grid or "
                "in grouped packing: set packing=None or PackingConfig(unit='grouped'), and "
                "sentence_level=False"
            )

    @property
    def sentences_per_chunk(self) -> int:
        """``S`` of the largest chunk: 1 in sentence-level mode."""
        return 1 if self.sentence_level else self.max_sentences

    @property
    def s_buckets(self) -> tuple[int, ...]:
        """Sentence buckets clipped to (and always including) ``sentences_per_chunk``."""
        return _clip_buckets(self.sentence_buckets, self.sentences_per_chunk)

    def s_buckets_for(self, longest_document: int) -> tuple[int, ...]:
        """The sentence buckets of a corpus whose longest document has ``longest_document``
        sentences: :attr:`s_buckets`, or with ``whole_documents`` those continued above
        ``max_sentences`` by steps of about 1.5x (multiples of 4) up to the longest document,
        itself always a bucket."""
        if not self.whole_documents:
            return self.s_buckets
        buckets = list(self.s_buckets)
        while buckets[-1] < longest_document:
            buckets.append(min(4 * math.ceil(1.5 * buckets[-1] / 4), longest_document))
        return tuple(buckets)

    @property
    def t_buckets(self) -> tuple[int, ...]:
        """Length buckets clipped to (and always including) the larger max length."""
        return _clip_buckets(self.length_buckets, max(self.max_src_len, self.max_tgt_len))

    def batch_size(self, s: int, t: int) -> int:
        """Global rows ``B`` of a batch of bucket ``(s, t)``."""
        slots = t if self.sequential_sentences else s * t
        b = max(1, min(self.batch_src_tokens, self.batch_tgt_tokens) // slots)
        p = math.lcm(self.process_count, self.batch_multiple)
        return max(p, b // p * p)


def _clip_buckets(buckets: Sequence[int], maximum: int) -> tuple[int, ...]:
    return tuple(sorted({min(int(b), maximum) for b in buckets} | {maximum}))


# ---------------------------------------------------------------------------------------------
# A model's data needs.


#: How a model's batch rows are built (the values of
#: :class:`~docnmt_jax.models.base.BatchLayout`): one sentence per row, chunks translated at
#: once, or chunks translated slot by slot with a target memory.
ROWS: tuple[str, ...] = ("sentences", "chunks", "sequential_chunks")

#: What a sentence reads besides itself: nothing; the ``context_sentences`` source sentences
#: before it (a window, also across chunks); the other sentences of its chunk; of its whole
#: document; its chunk concatenated into one sequence (translated whole).
CONTEXTS: tuple[str, ...] = ("none", "window", "chunk", "document", "concatenated")


class DataLimitError(ConfigError):
    """The data settings break a bound the model puts on its data (one line naming the keys)."""


@dataclasses.dataclass(frozen=True)
class Bound:
    """An upper bound on the data and the model config key that sets it."""

    value: int
    key: str


@dataclasses.dataclass(frozen=True)
class DataLimits:
    """Bounds a model puts on its training data, each checked against the pipeline settings by
    :meth:`violation`: the slots of a packed chunk on either side (``max_sentences x
    max_src_len/max_tgt_len``), the tokens of a sentence in packed rows or document streams,
    and the sentences of a chunk (any layout)."""

    packed_chunk_tokens: Bound | None = None
    packed_sentence_tokens: Bound | None = None
    chunk_sentences: Bound | None = None

    def violation(self, config: PipelineConfig) -> str | None:
        """The one-line reason ``config`` breaks a bound (naming the keys to change), or None."""
        longest = max(config.max_src_len, config.max_tgt_len)
        chunk = self.packed_chunk_tokens
        if config.packing is not None and chunk is not None:
            slots = config.sentences_per_chunk * longest
            if slots > chunk.value:
                return (
                    f"a chunk of up to {slots} tokens (config.data.max_sentences x "
                    f"max_src_len/max_tgt_len) > config.model.{chunk.key}={chunk.value}; "
                    f"raise {chunk.key} or lower the data limits"
                )
        sentence = self.packed_sentence_tokens
        bounded = config.packing is not None or config.streams  # windows; carried memory
        if bounded and sentence is not None and longest > sentence.value:
            return (
                f"config.data.max_src_len/max_tgt_len ({longest}) > "
                f"config.model.{sentence.key} ({sentence.value}): raise {sentence.key} "
                "(wider attention windows, a longer carried memory) or lower the data limits"
            )
        count = self.chunk_sentences
        if count is not None and config.sentences_per_chunk > count.value:
            return (
                f"config.data.max_sentences ({config.sentences_per_chunk}) > "
                f"config.model.{count.key} ({count.value}): raise {count.key}"
            )
        return None


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """A model's data needs, declared once (module docstring): ``rows`` (:data:`ROWS`),
    ``context`` (:data:`CONTEXTS`), ``context_sentences`` (``K > 0`` exactly for a window),
    ``packing`` (the packed rows it trains on, None: the ``[B, S, T]`` grid only),
    ``limits`` and ``streams`` (trained on document streams, a state carried across chunks)."""

    rows: str = "sentences"
    context: str = "none"
    context_sentences: int = 0
    packing: PackingConfig | None = None
    limits: DataLimits = DataLimits()
    streams: bool = False  # trained on document streams (stream_plan.py): carries state
    stream_window: int = 1  # consecutive chunks of a stream per batch (streams only)

    def __post_init__(self) -> None:
        if self.rows not in ROWS:
            raise ValueError(f"DataSpec.rows must be one of {ROWS}, got {self.rows!r}")
        if self.context not in CONTEXTS:
            raise ValueError(f"DataSpec.context must be one of {CONTEXTS}, got {self.context!r}")
        if (self.context == "window") != (self.context_sentences > 0):
            raise ValueError(
                "DataSpec: a window context has context_sentences >= 1 and no other context "
                f"has any (context={self.context!r}, context_sentences={self.context_sentences})"
            )
        if self.context == "none" and self.rows != "sentences":
            raise ValueError(f"DataSpec: rows of {self.rows} read each other: context='none'")

    @property
    def sentence_level(self) -> bool:
        """Whether the pipeline cuts documents into one-sentence chunks."""
        return self.rows == "sentences"

    @property
    def sequential(self) -> bool:
        """Whether a chunk's sentences are searched one after another (the translation budget
        then counts one sentence per chunk, ``PipelineConfig.sequential_sentences``)."""
        return self.rows == "sequential_chunks"

    @property
    def whole_documents(self) -> bool:
        """Whether every chunk must be a whole document (``PipelineConfig.whole_documents``)."""
        return self.context == "document"

    @property
    def uses_context(self) -> bool:
        """Whether a sentence's translation reads anything but the sentence itself."""
        return self.context != "none"
