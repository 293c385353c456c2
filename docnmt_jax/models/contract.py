"""The model contract: every method and attribute that code outside :mod:`docnmt_jax.models`
uses on a model, split by capability, so that a new model implements the capabilities it
needs and nothing else.

* :class:`Core` -- ``name``, ``config``, ``layout``, ``context_sentences``,
  ``whole_documents``: every caller below.
* :class:`Trainable` -- ``label_smoothing``, ``check_data``, ``init``, ``loss``: the trainer
  and its data set-up, the default objective, dev loss, checkpoint restore.
* :class:`PackedTraining` -- ``packing``: the trainer's packed batches (without it: the
  ``[B, S, T]`` grid).
* :class:`Scoring` -- ``rows``, ``forward``, ``token_scores``, ``score``: the context
  objectives (Jean & Cho 2019, Eq. 3), contrastive and source-use evaluation.
* :class:`RandomContext` -- ``with_random_context``: random-context objectives and
  context-usage evaluation.
* :class:`Searchable` -- ``max_source_len``, ``translate``: the Translator (``translate.py``,
  dev BLEU, evaluation).
* :class:`SlotSearch` -- ``search_inputs``, ``search_slot``: slot-by-slot search
  (:func:`~docnmt_jax.decoding.search.scan_slots`); :class:`OneCallSearch` --
  ``searches_in_one_call``: a ``translate`` that searches every slot in one compiled loop.
* :class:`PretrainMapping` -- ``source_parameters``, ``transformer_rules``: ``init_from``
  with the presets ``all``/``source`` (:mod:`~docnmt_jax.training.param_mapping`).
* :class:`SentenceAttention` -- ``sentence_attention``: the attention analysis (Zheng et al.
  2020, Fig. 4).
* :class:`FlopCounting` -- ``counts_flops``, ``flop_terms``: :mod:`docnmt_jax.flops`, the
  benchmark (MFU).

:class:`Model` is all of them but slot search: what
:class:`~docnmt_jax.models.base.BaseModel` implements for a flax module (a slot-by-slot model
adds :class:`SlotSearch`). Sharding needs no method: the parameters ``init`` returns are boxed
with logical axis names (:func:`~docnmt_jax.models.layers.partitioned`), which the mesh maps to
its axes (:meth:`~docnmt_jax.parallel.Layout.param_shardings`; unnamed parameters are
replicated). A model is made buildable by name with
:func:`~docnmt_jax.models.base.register`: its class is called as ``cls(config,
label_smoothing=...)`` with ``config`` a frozen dataclass holding ``vocab_size`` (and
``d_model``, which the learning-rate schedule reads from ``config.model``).

Callers check a capability they cannot do without through :func:`require`, which raises a
one-line :class:`~docnmt_jax.errors.CapabilityError` naming the model, what was asked and the
members it lacks.

Batches are dicts of arrays (:mod:`docnmt_jax.data.schema`): the ``[B, S, T]`` grid of ``B``
chunks of up to ``S`` sentences of ``T`` tokens, or the packed rows ``[B, L]`` of a model
with packed training. Metrics are :class:`Metric` sums.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import struct

from docnmt_jax.errors import CapabilityError

if TYPE_CHECKING:
    from docnmt_jax.data.spec import DataSpec, PackingConfig, PipelineConfig
    from docnmt_jax.decoding.beam_search import BeamResult
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.flops import BatchShape, Terms

Array = jax.Array
PyTree = Any
Batch = dict[str, Array]


class BatchLayout(enum.Enum):
    """How a model's batch rows are built and decoded."""

    SENTENCES = "sentences"  # one sentence per row (pipeline chunks of one sentence)
    CHUNKS = "chunks"  # chunks of up to S sentences; all sentences translated at once
    SEQUENTIAL_CHUNKS = "sequential_chunks"  # chunks; translated slot by slot with a memory

    @property
    def sentence_level(self) -> bool:
        """Whether the pipeline cuts documents into one-sentence chunks."""
        return self is BatchLayout.SENTENCES

    @property
    def sequential(self) -> bool:
        """Whether a chunk's sentences are searched one after another (the translation budget
        then counts one sentence per chunk, :class:`~docnmt_jax.data.pipeline.PipelineConfig`)."""
        return self is BatchLayout.SEQUENTIAL_CHUNKS


@struct.dataclass
class Metric:
    """A metric as sums: ``total`` and ``weight`` add up over steps, batches and devices.

    Reported as ``total / weight`` (``reduce="mean"``), ``exp(total / weight)`` (``"exp_mean"``,
    e.g. perplexity from the NLL sum) or ``total`` (``"sum"``, e.g. token counts).
    """

    total: Array
    weight: Array
    reduce: str = struct.field(pytree_node=False, default="mean")

    def __add__(self, other: Metric) -> Metric:
        return Metric(self.total + other.total, self.weight + other.weight, self.reduce)

    def value(self) -> float:
        total, weight = float(self.total), max(float(self.weight), 1e-12)
        if self.reduce == "sum":
            return total
        if self.reduce == "exp_mean":
            return float(jnp.exp(min(total / weight, 50.0)))
        return total / weight


Metrics = dict[str, Metric]


def reduce_metrics(metrics: Mapping[str, Metric]) -> dict[str, float]:
    """Host values of accumulated metrics (:meth:`Metric.value`)."""
    return {name: metric.value() for name, metric in jax.device_get(dict(metrics)).items()}


# ------------------------------------------------------------------------------ capabilities


@runtime_checkable
class Core(Protocol):
    """What every model declares: its registered name, its config, how its batches are laid
    out and what the pipeline must put in them."""

    #: The registered name (``config.model.name``), set by ``register``.
    name: ClassVar[str]
    #: The model's hyper-parameters, a frozen dataclass with ``vocab_size``.
    config: Any
    #: How batch rows are built and decoded (:class:`BatchLayout`); it drives the pipeline's
    #: ``sentence_level`` and the translator.
    layout: BatchLayout

    @property
    def context_sentences(self) -> int:
        """How many source sentences before every chunk (same document) the pipeline adds as
        ``context_src [B, K, T]`` (``PipelineConfig.context_sentences``; 0: none)."""
        ...

    @property
    def whole_documents(self) -> bool:
        """Whether every pipeline chunk must be a whole document, however long
        (``PipelineConfig.whole_documents``)."""
        ...

    @property
    def uses_context(self) -> bool:
        """Whether the model reads anything beyond the sentence it translates (False: a
        sentence model; random context and Delta_BLEU do not apply)."""
        ...

    def data_spec(self) -> DataSpec:
        """The model's data needs, declared once (rows, context, window, packing, limits);
        :func:`docnmt_jax.data.builder` turns it with the config into pipeline configs."""
        ...


@runtime_checkable
class Trainable(Core, Protocol):
    """Training: what the trainer, its data set-up, the maximum-likelihood objective, dev
    evaluation and checkpoint restore call."""

    #: Epsilon of the label-smoothed loss (Szegedy et al. 2016), given to the constructor.
    label_smoothing: float

    def check_data(self, config: PipelineConfig) -> None:
        """Raises :class:`~docnmt_jax.errors.ModelError` (naming the config keys) when batches
        of the pipeline ``config`` would break an assumption of the model."""
        ...

    def init(self, rng: Array, batch: Batch) -> PyTree:
        """Initial variables ``{"params": ...}`` for batches shaped like ``batch`` (the
        parameters must not depend on its size), parameters boxed with logical axis names
        (the sharding rules; unboxed ones are replicated)."""
        ...

    def loss(
        self, params: PyTree, batch: Batch, rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        """``(loss, metrics)``: the scalar the trainer differentiates (with dropout from
        ``rng`` when ``train``) and :class:`Metric` sums it accumulates, logs and evaluates on
        the dev set without knowing their names (``loss``, ``nll``, ``ppl``, ``tokens``, ...)."""
        ...


@runtime_checkable
class PackedTraining(Protocol):
    """Packed training: the model's ``loss`` also takes packed rows ``[B, L]`` (several whole
    sentences or chunks a row, :data:`~docnmt_jax.data.schema.PACKED_FEATURES`)."""

    def packing(self) -> PackingConfig | None:
        """How the trainer packs training and dev batches
        (:class:`~docnmt_jax.data.tokenized.PackingConfig`), or None: the grid."""
        ...


@runtime_checkable
class Scoring(Core, Protocol):
    """Teacher-forced scores of reference translations in context, on grid batches."""

    def rows(self, batch: Batch) -> Batch:
        """The module's inputs ``src, src_mask, tgt, tgt_mask`` (and keyword inputs such as a
        context window) built from a pipeline batch; their targets are the loss targets."""
        ...

    def forward(
        self, params: PyTree, batch: Batch, rng: Array | None, train: bool
    ) -> tuple[Array, Array, Array]:
        """``(logits [N, T, V], targets [N, T], target mask [N, T])``, one row per target
        sequence of :meth:`rows` (a sentence, or a packed chunk)."""
        ...

    def token_scores(
        self, params: PyTree, batch: Batch, rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        """``log p(y*_t | y*_<t, x, context)`` of every reference token on the batch's grid
        ``[B, S, T]`` (0 on padding), whatever rows the model computes them in, and the token
        metrics of the same forward pass (``loss``: label-smoothed with
        :attr:`Trainable.label_smoothing`; ``nll``, ``ppl``, ``tokens``). What the context
        margin of Jean & Cho (2019, Sec. 4.1, ``s_tok``) is built from."""
        ...

    def score(self, params: PyTree, batch: Batch) -> Array:
        """``log p(y_k | x, context) [B, S]``: every target sentence's log-likelihood summed
        over its tokens (0 for padding sentences), for forced choice."""
        ...


@runtime_checkable
class RandomContext(Core, Protocol):
    """Random contexts (Jean & Cho 2019, Sec. 4.3)."""

    def with_random_context(self, batch: Batch, rng: Array) -> Batch:
        """The grid ``batch`` with every sentence's context taken from other rows and
        ``origin_row [B, S]``; a model without context raises
        :class:`~docnmt_jax.errors.ModelError`."""
        ...


@runtime_checkable
class Searchable(Core, Protocol):
    """Translation: what the Translator calls (``translate.py``, dev BLEU, evaluation)."""

    def max_source_len(self, sentences_per_chunk: int) -> int | None:
        """The longest source sentence (tokens, EOS included) the model can translate in
        chunks of up to ``sentences_per_chunk`` sentences, or None: no limit."""
        ...

    def translate(
        self, params: PyTree, batch: Batch, search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Pure, jit-able search of a grid batch: ``(ids [B, S, L], aux)``, every real
        sentence EOS-terminated then PAD, padding sentences PAD; ``aux`` may hold
        ``sentence_counts [B]`` and ``output_capped [B]`` (translation statistics)."""
        ...


@runtime_checkable
class SlotSearch(Searchable, Protocol):
    """Slot-by-slot search (layout ``SEQUENTIAL_CHUNKS``): the sentences of a chunk searched
    in order, each with a memory of the translation chosen for the one before
    (:func:`~docnmt_jax.decoding.search.scan_slots`)."""

    def search_inputs(
        self, params: PyTree, batch: Batch, search: SearchConfig
    ) -> tuple[PyTree, PyTree]:
        """``(slots, memory)``: per-slot search inputs, leaves ``[S, B, ...]``, and the
        memory of the first sentence (the layout of a search cache)."""
        ...

    def search_slot(
        self, params: PyTree, memory: PyTree, slot: PyTree, search: SearchConfig
    ) -> BeamResult:
        """Beam search of one sentence per row from its ``slot`` inputs and the previous
        sentence's ``memory``, keeping the chosen hypothesis's cache."""
        ...


@runtime_checkable
class OneCallSearch(SlotSearch, Protocol):
    """A slot-by-slot model whose ``translate`` searches every slot of a batch in one compiled
    loop (FINAL's continuous search, :mod:`~docnmt_jax.decoding.continuous`): the compiled
    search then jits ``translate`` instead of dispatching one search per slot."""

    def searches_in_one_call(self, search: SearchConfig) -> bool:
        """Whether ``translate`` does so under ``search`` (else: the slot loop)."""
        ...


@runtime_checkable
class CarriedState(SlotSearch, Protocol):
    """Context across chunks (``carries_state``): trained on document streams
    (``DataSpec.streams``; one a grid row, or several a packed row) with a fixed-size state
    each stream's chunk leaves for the next (``carry`` in the train state, one row per
    stream), searched chunk after chunk the same way
    (:func:`~docnmt_jax.decoding.search.stream_translate`)."""

    carries_state: bool

    def initial_carry(self, rows: int) -> PyTree:
        """The training state before a document's first chunk, ``rows`` streams."""
        ...

    def loss_with_carry(
        self, params: PyTree, batch: Batch, carry: PyTree, rng: Array | None, train: bool
    ) -> tuple[Array, Metrics, PyTree]:
        """``loss`` of stream chunks (grid or packed stream rows) read with ``carry`` where
        they continue their document, and the state they leave (stop-gradient)."""
        ...

    def initial_decode_carry(self, rows: int) -> PyTree:
        """The decoding state before a document's first chunk."""
        ...

    def carried_search_inputs(
        self, params: PyTree, batch: Batch, carry: PyTree, search: SearchConfig
    ) -> tuple[PyTree, PyTree, PyTree]:
        """``(slots, first memory, what the chunks leave of the source side)``."""
        ...


@runtime_checkable
class PretrainMapping(Protocol):
    """Initialisation from a sentence Transformer's checkpoint (``init_from_rules`` presets
    ``all`` and ``source``; Zheng et al. 2020, Table 4)."""

    #: Regular expression (matched against whole parameter paths) of the source side:
    #: embeddings and encoder, what the ``source`` preset fills.
    source_parameters: ClassVar[str]

    def transformer_rules(self) -> list[tuple[str, str]]:
        """Ordered ``(regular expression over this model's parameter paths, checkpoint path
        template with groups | "skip")``; the first full match wins; every rule must match
        some parameter."""
        ...


@runtime_checkable
class SentenceAttention(Protocol):
    """Sentence-to-sentence attention (Zheng et al. 2020, Fig. 4)."""

    def sentence_attention(self, params: PyTree, batch: Batch) -> Array:
        """``alpha^kappa_k [B, S, S]`` of a grid batch: row ``k`` (attending sentence) over
        the chunk's sentences, heads averaged, 0 on padding sentences; a model without
        attention across sentences raises :class:`~docnmt_jax.errors.ModelError`."""
        ...


@runtime_checkable
class FlopCounting(Protocol):
    """An analytic FLOP count of the forward pass (:mod:`docnmt_jax.flops`)."""

    @property
    def counts_flops(self) -> bool:
        """Whether :meth:`flop_terms` has a count (a counter was registered)."""
        ...

    def flop_terms(self, shape: BatchShape) -> Terms:
        """Forward FLOPs of the matrix multiplies of one batch of ``shape``, per named term."""
        ...


@runtime_checkable
class Model(
    Trainable,
    PackedTraining,
    Scoring,
    RandomContext,
    Searchable,
    PretrainMapping,
    SentenceAttention,
    FlopCounting,
    Protocol,
):
    """Every capability but slot search: what :class:`~docnmt_jax.models.base.BaseModel`
    implements, and what code that uses several of them takes."""


def members(capability: type) -> tuple[str, ...]:
    """The names a model must have to hold ``capability`` (a protocol of this module), its
    bases' included."""
    names: set[str] = set()
    for cls in capability.__mro__:
        if cls in (Protocol, object) or not getattr(cls, "_is_protocol", False):
            continue
        names |= {name for name in vars(cls) if not name.startswith("_")}
        names |= {name for name in getattr(cls, "__annotations__", {}) if not name.startswith("_")}
    return tuple(sorted(names))


def missing(model: Any, capability: type) -> list[str]:
    """The members of ``capability`` that ``model`` lacks (none: it holds the capability)."""
    return [name for name in members(capability) if not hasattr(model, name)]


def carries_state(model: Any) -> bool:
    """Whether ``model`` holds :class:`CarriedState` and reads context across chunks (its
    ``carries_state`` switch on): trained on document streams, searched chunk after chunk."""
    return not missing(model, CarriedState) and bool(model.carries_state)


def searches_in_one_call(model: Any, search: SearchConfig) -> bool:
    """Whether slot-by-slot ``model`` holds :class:`OneCallSearch` and its ``translate``
    searches every slot in one compiled loop under ``search``."""
    return not missing(model, OneCallSearch) and bool(model.searches_in_one_call(search))


def require(model: Any, capability: type, action: str) -> None:
    """Raises :class:`~docnmt_jax.errors.CapabilityError` (one line naming the model, the
    ``action`` asked for and the missing members) unless ``model`` holds ``capability``."""
    lacking = missing(model, capability)
    if lacking:
        name = getattr(model, "name", "") or type(model).__name__
        raise CapabilityError(
            f"model {name!r} cannot {action}: it lacks the {capability.__name__} capability "
            f"of docnmt_jax.models.contract ({', '.join(lacking)})"
        )
