"""The base class that implements the model contract for a flax module, and the registry.

The contract -- what the trainer, the translator, the objectives, the evaluation and the
launch scripts call on a model, split by capability -- is :mod:`docnmt_jax.models.contract`
(its :class:`~docnmt_jax.models.contract.Model` protocol, :class:`BatchLayout` and
:class:`Metric` are re-exported here). Every model we ship (one module per paper) is a
:class:`BaseModel` subclass registered with :func:`register`; a model may also implement
only the capabilities it needs without this base class.

``data_spec()`` declares a model's data needs once (:class:`~docnmt_jax.data.spec.DataSpec`:
rows, context, window, packing, limits), which the data builder (:mod:`docnmt_jax.data.builder`)
turns into pipeline configs; ``context_sentences``, ``whole_documents``, ``uses_context``,
``packing()`` and ``check_data(config)`` read it.

:class:`BaseModel` provides ``init``, the train/eval flax modules (``deterministic`` False /
True), the forward pass, ``loss``, ``token_scores`` and ``score`` through one hook,
:meth:`BaseModel.rows`: the module's ``(src, src_mask, tgt, tgt_mask)`` inputs built from a
pipeline batch, whose targets are the loss targets. Subclasses add ``translate`` (or, slot by
slot, the hooks ``search_inputs``/``search_slot`` of :mod:`docnmt_jax.decoding.search`) and
override what their paper changes: ``context_sentences``/``whole_documents`` (data needs),
``packing``, ``check_data``, ``with_random_context``, ``transformer_rules``.

``sentence_attention(params, batch) -> [B, S, S]`` is the sentence-to-sentence attention of
Zheng et al. (2020), Fig. 4, ``alpha^kappa_k = 1/|x_k| sum_i sum_j alpha^{kappa,j}_{k,i}`` of
the model's attention across sentences (heads averaged): row ``k`` (attending sentence) over
columns ``kappa`` (attended sentences of the chunk), 0 on padding sentences. Models without
attention across sentences raise :class:`ModelError` (the default);
:func:`captured_attention` and :func:`sentence_pair_attention` implement it for a model from
its token-level weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax.data.spec import DataSpec
from docnmt_jax.errors import CapabilityError
from docnmt_jax.errors import ModelError as ModelError
from docnmt_jax.flops import BatchShape, Terms
from docnmt_jax.models import losses
from docnmt_jax.models.context_rotation import random_context_batch
from docnmt_jax.models.contract import BatchLayout as BatchLayout
from docnmt_jax.models.contract import Metric as Metric
from docnmt_jax.models.contract import Metrics as Metrics
from docnmt_jax.models.contract import Model as Model
from docnmt_jax.models.contract import reduce_metrics as reduce_metrics

if TYPE_CHECKING:
    from docnmt_jax.data.spec import PackingConfig, PipelineConfig

Array = jax.Array
PyTree = Any
Batch = dict[str, Array]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def token_metrics(logits: Array, targets: Array, mask: Array, smoothing: float) -> Metrics:
    """The label-smoothed loss, NLL, perplexity and token count of a batch as :class:`Metric`."""
    sums = losses.masked_loss_sums(logits, targets, mask, smoothing)
    return sums_as_metrics(sums["loss"], sums["nll"], sums["tokens"])


def sums_as_metrics(loss: Array, nll: Array, tokens: Array) -> Metrics:
    """``loss``, ``nll``, ``ppl`` per token and the ``tokens`` count from their sums."""
    return {
        "loss": Metric(loss, tokens),
        "nll": Metric(nll, tokens),
        "ppl": Metric(nll, tokens, "exp_mean"),
        "tokens": Metric(tokens, jnp.ones(()), "sum"),
    }


def scored_tokens(
    logits: Array, targets: Array, mask: Array, smoothing: float
) -> tuple[Array, Metrics]:
    """``log p(target) * mask`` (shaped like ``targets``) and :func:`token_metrics` of forward
    rows, from one evaluation of the token losses."""
    loss, nll = losses.token_losses(logits, targets, smoothing)
    weights = mask.astype(jnp.float32)
    metrics = sums_as_metrics(jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(weights))
    return -nll * mask, metrics


class BaseModel:
    """Implements :class:`Model` for a flax module ``module_class(config)`` whose
    ``__call__(src, src_mask, tgt, tgt_mask)`` returns logits ``[..., T, V]`` for the targets
    of :meth:`rows`. Subclasses set ``module_class`` and ``layout`` and implement
    ``translate`` (or the slot-search hooks); :func:`register` sets ``name`` and
    ``config_class``."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type] = object
    layout: ClassVar[BatchLayout] = BatchLayout.SENTENCES
    module_class: ClassVar[type[nn.Module]]

    def __init__(self, config: Any, label_smoothing: float = 0.0):
        self.config = config
        self.label_smoothing = label_smoothing
        self.train_module = self.module_class(dataclasses.replace(config, deterministic=False))
        self.eval_module = self.module_class(dataclasses.replace(config, deterministic=True))

    # Hook --------------------------------------------------------------------------------

    def rows(self, batch: Batch) -> Batch:
        """The module's inputs ``src, src_mask, tgt, tgt_mask`` from a pipeline batch
        ``[B, S, T]``; default: the batch as it is (document models). A model that trains on
        packed rows (:meth:`packing`) also returns ``segments``, a dict of the packed row
        features its module takes as ``segments=``; any key beyond the four is passed to
        the module as a keyword input (:func:`module_options`)."""
        return {key: batch[key] for key in ("src", "src_mask", "tgt", "tgt_mask")}

    def data_spec(self) -> DataSpec:
        """The model's data needs (:class:`~docnmt_jax.data.spec.DataSpec`); default: rows as
        :attr:`layout` says, each sentence alone (sentence rows) or reading its chunk, the
        ``[B, S, T]`` grid only, no limits."""
        sentences = self.layout.sentence_level
        return DataSpec(rows=self.layout.value, context="none" if sentences else "chunk")

    def packing(self) -> PackingConfig | None:
        """How the trainer packs this model's training and dev batches
        (:class:`~docnmt_jax.data.spec.PackingConfig`, :meth:`data_spec`), or None for the
        ``[B, S, T]`` grid. Decoding, :meth:`score` and :meth:`with_random_context` use the
        grid."""
        return self.data_spec().packing

    # Pretrain-then-finetune (:mod:`docnmt_jax.training.param_mapping`) -------------------

    #: Parameters of the source side (embeddings and encoder), a regular expression matched
    #: against the whole parameter path: what ``init_from_rules = "source"`` fills.
    source_parameters: ClassVar[str] = r"embed/.*|encoder.*"

    def transformer_rules(self) -> list[tuple[str, str]]:
        """How a sentence-Transformer checkpoint of the same sizes fills this model, for the
        ``init_from_rules`` presets ``all`` and ``source``: ordered ``(regular expression over
        this model's parameter paths, checkpoint path template with groups \\1 ... | "skip")``,
        the first full match wins; every rule must match some parameter. Default: every
        parameter from the same path (models named like the Transformer)."""
        return [(r"(.*)", r"\1")]

    @property
    def context_sentences(self) -> int:
        """How many source sentences before every chunk (same document) the pipeline must add
        as ``context_src`` (``PipelineConfig.context_sentences``, :meth:`data_spec`)."""
        return self.data_spec().context_sentences

    @property
    def whole_documents(self) -> bool:
        """Whether every chunk must be a whole document (``PipelineConfig.whole_documents``,
        :meth:`data_spec`); False: chunks of at most ``data.max_sentences`` sentences."""
        return self.data_spec().whole_documents

    @property
    def uses_context(self) -> bool:
        """Whether a sentence's translation reads anything but the sentence (:meth:`data_spec`):
        False for a sentence model."""
        return self.data_spec().uses_context

    def check_data(self, config: PipelineConfig) -> None:
        """Raises :class:`ModelError` (naming the config keys) when batches of the pipeline
        ``config`` break a limit of :meth:`data_spec`."""
        problem = self.data_spec().limits.violation(config)
        if problem is not None:
            raise ModelError(problem)

    def max_source_len(self, sentences_per_chunk: int) -> int | None:
        """The longest source sentence (tokens, EOS included) the model can translate in
        chunks of up to ``sentences_per_chunk`` sentences, or None: no limit (the default;
        positions are sinusoidal, computed on the fly). The translator grows its source
        length buckets up to this (:mod:`docnmt_jax.decoding.translator`)."""
        return None

    # Interface ---------------------------------------------------------------------------

    def init(self, rng: Array, batch: Batch) -> PyTree:
        rows = self.rows(batch)
        return self.eval_module.init(rng, *(rows[k] for k in MODULE_INPUTS), **module_options(rows))

    def forward(
        self, params: PyTree, batch: Batch, rng: Array | None, train: bool
    ) -> tuple[Array, Array, Array]:
        """(logits ``[N, T, V]``, targets ``[N, T]``, target mask ``[N, T]``), one row per
        target sequence of :meth:`rows`."""
        rows = self.rows(batch)
        module = self.train_module if train else self.eval_module
        logits = module.apply(
            {"params": params},
            *(rows[k] for k in MODULE_INPUTS),
            rngs={"dropout": rng} if train else {},
            **module_options(rows),
        )
        T = rows["tgt"].shape[-1]
        return (
            logits.reshape((-1, T, logits.shape[-1])),
            rows["tgt"].reshape((-1, T)),
            rows["tgt_mask"].reshape((-1, T)),
        )

    def loss(
        self, params: PyTree, batch: Batch, rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        """Label-smoothed cross-entropy per real target token, and :func:`token_metrics`."""
        logits, targets, mask = self.forward(params, batch, rng, train)
        metrics = token_metrics(logits, targets, mask, self.label_smoothing)
        loss = metrics["loss"].total / jnp.maximum(metrics["loss"].weight, 1.0)
        return loss, metrics

    def token_scores(
        self, params: PyTree, batch: Batch, rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        """``log p(y*_t | y*_<t, x, context) [B, S, T]`` of a grid batch's reference tokens
        (0 on padding) and :func:`token_metrics` of the same forward pass; default: one row
        of :meth:`forward` per sentence (a model whose rows are not must override it)."""
        require_grid(batch, "token_scores")
        logits, targets, mask = self.forward(params, batch, rng, train)
        B, S, T = batch["tgt"].shape
        if targets.shape != (B * S, T):
            raise ModelError(
                f"model {self.name!r}: forward rows {targets.shape} are not one sentence each "
                f"{(B * S, T)}; its class must implement token_scores"
            )
        log_probs, metrics = scored_tokens(logits, targets, mask, self.label_smoothing)
        return log_probs.reshape(B, S, T), metrics

    def score(self, params: PyTree, batch: Batch) -> Array:
        """``log p(y_k | x, context) [B, S]``, summed over each sentence's tokens (0 for
        padding sentences); default: one row of :meth:`forward` per sentence."""
        require_grid(batch, "score")
        logits, targets, mask = self.forward(params, batch, None, False)
        per_row = sequence_log_likelihood(logits, targets, mask)
        return per_row.reshape(batch["src"].shape[:2])

    def with_random_context(self, batch: Batch, rng: Array) -> Batch:
        """Every sentence with its context (its chunk's other sentences and its window) taken
        from other rows (:func:`~.context_rotation.random_context_batch`); a model that reads
        no context raises :class:`ModelError`."""
        require_grid(batch, "with_random_context")
        if not self.uses_context:
            raise ModelError(
                f"model {self.name!r} translates sentences alone: it has no context to replace"
            )
        return random_context_batch(batch, rng)

    def translate(
        self, params: PyTree, batch: Batch, search: Any
    ) -> tuple[Array, dict[str, Array]]:
        """Pure, jit-able search; slot-by-slot models get it from their search hooks."""
        if self.layout.sequential:
            from docnmt_jax.decoding.search import scan_slots

            return scan_slots(self, params, batch, search)
        raise CapabilityError(
            f"model {self.name!r} cannot translate: {type(self).__name__} implements no "
            "translate (the Searchable capability of docnmt_jax.models.contract)"
        )

    def sentence_attention(self, params: PyTree, batch: Batch) -> Array:
        """Sentence-to-sentence attention ``[B, S, S]`` of a grid batch (Zheng et al. 2020,
        Fig. 4; module docstring); default: the model has none (:class:`ModelError`)."""
        raise ModelError(
            f"model {self.name!r} has no attention across sentences (sentence_attention is "
            "defined for final, doc2doc, hmgdc, rnnsearch_hmgdc, doct and jean_cho)"
        )

    @property
    def counts_flops(self) -> bool:
        """Whether a FLOP counter was registered with the model (``register(flops=...)``)."""
        entry = _REGISTRY.get(self.name)
        return entry is not None and entry.flops is not None

    def flop_terms(self, shape: BatchShape) -> Terms:
        """Forward FLOPs per named term of a batch of ``shape``: the registered counter's
        (:mod:`docnmt_jax.flops`); :class:`CapabilityError` when none was registered."""
        if not self.counts_flops:
            raise CapabilityError(f"model {self.name!r} registered no FLOP counter")
        return _REGISTRY[self.name].flops(self.config, shape)


#: The positional inputs of every model's module, in order; :meth:`BaseModel.rows` may add
#: keyword inputs (:func:`module_options`).
MODULE_INPUTS = ("src", "src_mask", "tgt", "tgt_mask")


def module_options(rows: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword inputs of a module in :meth:`BaseModel.rows`: every key beyond
    :data:`MODULE_INPUTS` (packed ``segments``, DocT's ``context`` ...)."""
    return {key: value for key, value in rows.items() if key not in MODULE_INPUTS}


def require_context_somewhere(in_encoder: bool, in_decoder: bool) -> None:
    """Raises ValueError when a document model's context reaches neither the encoder nor the
    decoder (its ``context_in_encoder`` / ``context_in_decoder`` switches)."""
    if not (in_encoder or in_decoder):
        raise ValueError(
            "context_in_encoder and context_in_decoder are both False: that is the "
            "sentence Transformer (model.name = 'transformer')"
        )


def require_grid(batch: Mapping[str, Any], what: str) -> None:
    """Raises :class:`ModelError` when ``batch`` is packed: ``what`` works on the grid."""
    if "src_chunk_ids" in batch:
        raise ModelError(
            f"{what} needs a [B, S, T] grid batch, got packed rows; build the batches with "
            "PipelineConfig(packing=None)"
        )


def captured_attention(run: Callable[[], Any], path: tuple[str, ...]) -> tuple[Any, Array]:
    """``(run(), weights)``: the attention weights ``[B, H, Tq, Tk]`` (before dropout) of the
    one call of :meth:`~docnmt_jax.models.layers.MultiHeadAttention.attend` made by the
    attention module at parameter ``path`` (e.g. ``("encoder_layers_3", "self_attention")``)
    while ``run`` applies a module. The call is intercepted (``flax.linen.intercept_methods``)
    to return its weights too; nothing else changes. Raises RuntimeError unless that module
    attends exactly once."""
    found: list[Array] = []

    def interceptor(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        if context.method_name != "attend" or tuple(context.module.path) != path:
            return next_fun(*args, **kwargs)
        args, kwargs = list(args), dict(kwargs)
        if len(args) > 4:  # attend(q, k, v, mask, return_weights, heads_major)
            asked, args[4] = args[4], True
        else:
            asked, kwargs["return_weights"] = kwargs.get("return_weights", False), True
        out, weights = next_fun(*args, **kwargs)
        found.append(weights)
        return (out, weights) if asked else out

    with nn.intercept_methods(interceptor):
        result = run()
    if len(found) != 1:
        raise RuntimeError(f"attention {'/'.join(path)} attended {len(found)} times, not once")
    return result, found[0]


def sentence_pair_attention(
    weights: Array, query_sentence: Array, key_sentence: Array, num_sentences: int
) -> Array:
    """Zheng et al. (2020), Fig. 4: ``alpha^kappa_k = 1/|x_k| sum_{i in k} sum_{j in kappa}
    alpha_{i,j}`` per row of token weights ``[R, H, Lq, Lk]`` (averaged over the heads H).
    ``query_sentence [R, Lq]`` / ``key_sentence [R, Lk]``: each token's sentence in ``0 ..
    S-1``, -1 for tokens left out (padding queries; keys outside the matrix). Returns ``[R, S,
    S]``; a sentence's row sums to its queries' mean weight on the keys kept (1 when every
    real key is kept), 0 for a sentence without queries."""
    w = jnp.mean(weights.astype(jnp.float32), axis=1)
    query = jax.nn.one_hot(query_sentence, num_sentences, dtype=jnp.float32)  # -1: zeros
    key = jax.nn.one_hot(key_sentence, num_sentences, dtype=jnp.float32)
    per_key_sentence = jnp.einsum("rqk,rkc->rqc", w, key)
    total = jnp.einsum("rqs,rqc->rsc", query, per_key_sentence)
    count = jnp.sum(query, axis=1)  # |x_k|
    return total / jnp.maximum(count, 1.0)[..., None]


def sequence_log_likelihood(logits: Array, targets: Array, mask: Array) -> Array:
    """``sum_t mask * log softmax(logits)[target]`` per row of ``logits [N, T, V]``."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(token * mask, axis=-1)


# ------------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class Registration:
    """A registered model: its class (a :class:`BaseModel` subclass, or any class with the
    capabilities of :mod:`docnmt_jax.models.contract` it needs), its config dataclass and its
    FLOP counter (``flops(config, shape) -> {term: FLOPs}`` of one forward pass, defined
    beside the model from the layer costs of :mod:`docnmt_jax.flops`)."""

    name: str
    model_class: type
    config_class: type
    flops: Callable[[Any, BatchShape], Terms] | None


_REGISTRY: dict[str, Registration] = {}
ModelClass = TypeVar("ModelClass", bound=type)


def register(
    name: str, *, config: type, flops: Callable[[Any, BatchShape], Terms] | None = None
) -> Callable[[ModelClass], ModelClass]:
    """Class decorator: makes the model buildable as ``config.model.name = name``
    (:func:`build_model` calls ``cls(config, label_smoothing=...)``); sets ``cls.name`` and
    ``cls.config_class``."""

    def decorate(cls: ModelClass) -> ModelClass:
        old = _REGISTRY.get(name)
        if old is not None and old.model_class.__qualname__ != cls.__qualname__:
            raise ValueError(f"model name {name!r} is already registered by {old.model_class}")
        cls.name = name
        cls.config_class = config
        _REGISTRY[name] = Registration(name, cls, config, flops)
        return cls

    return decorate


def registered() -> dict[str, Registration]:
    """Every registered model by name (importing :mod:`docnmt_jax.models` registers ours)."""
    return dict(_REGISTRY)


def registration(name: str) -> Registration:
    if name not in _REGISTRY:
        raise ModelError(
            f"config.model.name: unknown model {name!r}; registered: {sorted(_REGISTRY)}"
        )
    return _REGISTRY[name]


def dataclass_from_mapping(cls: type, values: Mapping[str, Any], where: str) -> Any:
    """Builds frozen config ``cls`` from ``values``, naming unknown keys and dtype strings."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields - {"name"})
    if unknown:
        raise ModelError(
            f"{where}: unknown keys {unknown} for {cls.__name__}; known: {sorted(fields)}"
        )
    kwargs = {k: v for k, v in values.items() if k in fields}
    for key in ("dtype", "param_dtype"):
        if isinstance(kwargs.get(key), str):
            if kwargs[key] not in DTYPES:
                raise ModelError(f"{where}.{key}: {kwargs[key]!r} is not one of {sorted(DTYPES)}")
            kwargs[key] = DTYPES[kwargs[key]]
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ModelError(f"{where}: {e}") from None


def build_model(
    model_config: Mapping[str, Any], vocab_size: int, label_smoothing: float = 0.0
) -> Model:
    """The model ``model_config['name']`` (default ``transformer``) with the tokenizer's
    vocabulary size; ``label_smoothing`` is its loss's epsilon. Every model we ship has every
    capability of :class:`Model`; a registered model with fewer is refused where a missing
    one is needed (:func:`~docnmt_jax.models.contract.require`)."""
    values = dict(model_config)
    entry = registration(values.get("name", "transformer"))
    values["vocab_size"] = vocab_size
    config = dataclass_from_mapping(entry.config_class, values, "config.model")
    return entry.model_class(config, label_smoothing=label_smoothing)
