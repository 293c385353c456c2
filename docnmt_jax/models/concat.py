"""Doc2Doc: the concatenation baseline of Zheng et al. (2020), Sec. 5 and Table 3.

"Whole chunk in, whole chunk out": the sentence Transformer (:mod:`.transformer`, unchanged and
with the same parameters) reads the chunk's source sentences as one sequence and writes the
chunk's target sentences as one sequence.

* Source: the real tokens of ``src [B, S, T]`` (each sentence EOS-terminated) moved to the
  front of a ``[B, S*T]`` row, padding after (:func:`pack_tokens`); positions continue across
  the chunk (the Transformer numbers its input ``0 .. S*T-1``).
* Target: the target sentences packed the same way, the EOS of every sentence but the chunk's
  last replaced by the separator :data:`SEP_ID` (= BOS, which never occurs inside a target;
  the decoder's start token is also BOS) (:func:`pack_target`). The loss is over the packed
  target rows, separators and the final EOS included.
* Translation: beam search over the whole packed chunk (BOS allowed, it is the separator),
  then the best hypothesis is cut at separators into one row per source sentence
  (:func:`split_sentences`), so :class:`~docnmt_jax.decoding.translator.Translator` works
  unchanged. Nothing is dropped: sentences beyond the source's count are appended to its last
  sentence (their separators removed), missing sentences are empty (EOS only); the predicted
  sentence count is returned for the translator's mismatch statistics.
* Scoring (:meth:`Doc2DocModel.score`): a sentence's log-likelihood is the sum over its packed
  target tokens, its separator (or the chunk's final EOS) included.
* Sentence-to-sentence attention (:meth:`Doc2DocModel.sentence_attention`, Zheng et al.'s
  Fig. 4 for the baseline): the last encoder layer's self-attention over the packed chunk,
  heads averaged, summed over the key sentence's tokens and averaged over the query
  sentence's tokens.

Decisions beyond the paper: a chunk's output budget is the sum of the budgets its sentences
would get one by one (:func:`chunk_output_limits`), separators included; real sentences are
the rows of ``src_mask`` with a token, the k-th output sentence goes to the k-th of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from docnmt_jax import flops
from docnmt_jax.data.schema import is_packed
from docnmt_jax.data.spec import Bound, DataLimits, DataSpec, PackingConfig
from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from docnmt_jax.decoding.search import SearchConfig, search_rows, source_length_limits
from docnmt_jax.models.base import (
    BaseModel,
    BatchLayout,
    Metrics,
    ModelError,
    captured_attention,
    register,
    require_grid,
    scored_tokens,
    sentence_pair_attention,
)
from docnmt_jax.models.transformer import (
    Transformer,
    TransformerConfig,
    packed_rows,
    transformer_terms,
)

Array = jax.Array

SEP_ID = BOS_ID  # sentence separator inside a packed target


@dataclasses.dataclass(frozen=True)
class Doc2DocConfig(TransformerConfig):
    """The sentence Transformer's hyper-parameters plus ``max_len``: the longest packed
    sequence (source ``S*T`` slots, or decoded tokens) accepted. Positions are sinusoidal and
    computed on the fly, so this is a guard against silently running far beyond the lengths
    seen in training, not a table size."""

    max_len: int = 4096

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1: {self.max_len}")


def pack_tokens(ids: Array, mask: Array) -> tuple[Array, Array]:
    """``ids, mask [B, S, T]`` -> (``packed [B, S*T]``, ``packed_mask [B, S*T]``).

    The tokens where ``mask > 0`` keep their order and move to the front of their row (a
    scatter to ``cumsum(mask) - 1``); the rest of the row is PAD with mask 0.
    """
    B, S, T = ids.shape
    flat = ids.reshape(B, S * T)
    real = mask.reshape(B, S * T) > 0
    dest = jnp.where(real, jnp.cumsum(real, axis=1) - 1, S * T)  # S*T: out of range, dropped
    rows = jnp.arange(B)[:, None]
    packed = jnp.full_like(flat, PAD_ID).at[rows, dest].set(flat, mode="drop")
    length = jnp.sum(real, axis=1, keepdims=True)
    packed_mask = (jnp.arange(S * T)[None] < length).astype(mask.dtype)
    return packed, packed_mask


def mark_separators(tgt: Array, tgt_mask: Array, separator: int = SEP_ID) -> Array:
    """``tgt [B, S, T]`` with the last token (EOS) of every real sentence except the chunk's
    last real one replaced by ``separator``."""
    S, T = tgt.shape[-2:]
    lengths = jnp.sum(tgt_mask > 0, axis=-1)  # [B, S]
    index = jnp.arange(S)
    last_real = jnp.max(jnp.where(lengths > 0, index, -1), axis=-1, keepdims=True)
    boundary = (lengths > 0) & (index < last_real)  # [B, S]: sentences followed by another
    at_end = jnp.arange(T) == (lengths - 1)[..., None]
    return jnp.where(boundary[..., None] & at_end, separator, tgt)


def mark_separators_packed(
    tgt: Array, tgt_mask: Array, sentence_index: Array, chunk_ids: Array, separator: int = SEP_ID
) -> Array:
    """:func:`mark_separators` on packed rows ``[B, L]``: the last token of every target
    sentence followed by another sentence of its chunk becomes ``separator``.

    Tokens are keyed ``chunk * L + sentence index``, non-decreasing along a row's real tokens
    (chunks and their sentences are laid in order); the key of the next real token says
    whether a token ends its sentence and whether its chunk goes on, gaps notwithstanding.
    """
    L = tgt.shape[-1]
    real = tgt_mask > 0
    beyond = jnp.int32(2**30)  # a key after every real one, in no chunk
    key = jnp.where(real, chunk_ids * L + sentence_index, beyond)
    after = jax.lax.cummin(key, axis=1, reverse=True)  # smallest key at positions >= p
    nxt = jnp.concatenate([after[:, 1:], jnp.full_like(after[:, :1], beyond)], axis=1)
    boundary = real & (nxt != key) & (nxt // L == chunk_ids)
    return jnp.where(boundary, separator, tgt)


def pack_target(tgt: Array, tgt_mask: Array) -> tuple[Array, Array]:
    """The chunk's target sentences as one sequence ``[B, S*T]``: separators between sentences,
    EOS at the end, PAD after (and its mask)."""
    return pack_tokens(mark_separators(tgt, tgt_mask), tgt_mask)


def split_sentences(
    seq: Array, real: Array, separator: int = SEP_ID, eos: int = EOS_ID
) -> tuple[Array, Array]:
    """Cuts packed hypotheses ``seq [B, L]`` at separators into rows ``[B, S, L]``.

    ``real [B, S]`` marks the source's real sentences (``n`` per chunk). The output sentence
    ``k`` (tokens up to the first EOS) goes to the ``k``-th real row, its separator becoming
    its EOS. Sentences beyond the ``n``-th are appended to the ``n``-th (their separators
    removed, their tokens kept, the final EOS last); real rows without an output sentence are
    ``[EOS]``; other rows are PAD. Returns (ids ``[B, S, L]``, predicted sentence count
    ``[B]``: separators + 1, 0 for chunks without a real sentence).
    """
    B, L = seq.shape
    S = real.shape[-1]
    real = real > 0
    n = jnp.sum(real, axis=-1)  # [B]
    last = jnp.maximum(n - 1, 0)[:, None]
    is_eos = seq == eos
    valid = (jnp.cumsum(is_eos, axis=1) - is_eos) == 0  # up to and including the first EOS
    is_sep = (seq == separator) & valid
    seps_before = jnp.cumsum(is_sep, axis=1) - is_sep
    counts = jnp.where(n > 0, jnp.sum(is_sep, axis=1) + 1, 0).astype(jnp.int32)

    row = jnp.minimum(seps_before, last)  # [B, L]: output rank of each token
    keep = valid & ~(is_sep & (seps_before >= last))  # separators inside the overflow vanish
    token = jnp.where(is_sep, eos, seq)
    b = jnp.arange(B)[:, None]
    per_row = jnp.zeros((B, S), jnp.int32).at[b, row].add(keep.astype(jnp.int32))
    starts = jnp.cumsum(per_row, axis=1) - per_row
    col = jnp.cumsum(keep, axis=1) - 1 - jnp.take_along_axis(starts, row, axis=1)
    col = jnp.where(keep, col, L)  # L: out of range, dropped
    ranked = jnp.full((B, S, L), PAD_ID, seq.dtype).at[b, row, col].set(token, mode="drop")

    rank = jnp.arange(S)[None]
    missing = (rank < n[:, None]) & (per_row == 0)
    ranked = ranked.at[:, :, 0].set(jnp.where(missing, eos, ranked[:, :, 0]))
    ranked = jnp.where((rank < n[:, None])[..., None], ranked, PAD_ID)
    # The k-th ranked row goes to the k-th real sentence (real rows first, stable order).
    slots = jnp.argsort((~real).astype(jnp.int32), axis=-1, stable=True)
    ids = jnp.zeros_like(ranked).at[b, slots].set(ranked)
    return ids, counts


def chunk_output_limits(src_mask: Array, search: SearchConfig, cap: int) -> tuple[int, Array]:
    """(static output length, per-chunk limits ``[B]``) of the packed chunks of ``src_mask``.

    Every real sentence of ``T`` slots contributes what a sentence model would get for it:
    ``search.output_len(T)`` to the static length, ``source_length_limits`` (``len_a *
    tokens + len_b``) to its chunk's limit; one EOS or separator per sentence is part of it.
    Both are capped at ``cap``.
    """
    B, S, T = src_mask.shape
    per_sentence = search.output_len(T)
    max_len = min(S * per_sentence, cap)
    limits = source_length_limits(
        src_mask.reshape(B * S, T), search.len_a, search.len_b, per_sentence
    ).reshape(B, S)
    real = jnp.any(src_mask > 0, axis=-1)
    total = jnp.sum(jnp.where(real, limits, 0), axis=-1)
    return max_len, jnp.clip(total, 1, max_len).astype(jnp.int32)


def doc2doc_terms(config: Doc2DocConfig, shape: flops.BatchShape) -> flops.Terms:
    """Forward FLOPs of Doc2Doc: the sentence Transformer on ``B`` rows of ``S·Ts`` source
    and ``S·Tt`` target tokens (each chunk packed into one sequence), so its attention terms
    grow with ``(S·T)²``."""
    B, S = shape.chunks, shape.sentences
    return transformer_terms(config, flops.BatchShape(B, 1, S * shape.src_len, S * shape.tgt_len))


@register("doc2doc", config=Doc2DocConfig, flops=doc2doc_terms)
class Doc2DocModel(BaseModel):
    """The sentence Transformer over packed chunks (Zheng et al. 2020, Table 3, Doc2Doc)."""

    module_class = Transformer
    layout = BatchLayout.CHUNKS

    def _check_length(self, length: int) -> None:
        if length > self.config.max_len:
            raise ModelError(
                f"a packed chunk of {length} slots > max_len={self.config.max_len}; raise "
                "config.model.max_len or lower data.max_sentences / max_src_len / max_tgt_len"
            )

    def data_spec(self) -> DataSpec:
        """Chunks, each concatenated into one sequence; packed: whole chunks laid end to end
        in rows of 1,024 slots (2,048 for the longest), each at most ``max_len`` slots per side
        (``max_sentences * max_len`` of the data; the grid checks each batch's ``S * T``)."""
        return DataSpec(
            rows=self.layout.value,
            context="concatenated",
            packing=PackingConfig(unit="chunk", row_tokens=1024),
            limits=DataLimits(packed_chunk_tokens=Bound(self.config.max_len, "max_len")),
        )

    def max_source_len(self, sentences_per_chunk: int) -> int:
        """A grid chunk of ``S`` sentences of ``T`` slots is packed into ``S * T`` positions,
        which must fit ``max_len``: ``T`` at most ``max_len // sentences_per_chunk``."""
        return max(1, self.config.max_len // sentences_per_chunk)

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        """Packed ``src``/``tgt`` rows ``[B, S*T]`` and their masks; a packed batch keeps
        its rows, each chunk one segment (separators marked, positions inside the chunk)."""
        if is_packed(batch):  # chunk lengths are data: check_data bounds them
            rows = packed_rows(batch, unit="chunk")
            rows["tgt"] = mark_separators_packed(
                batch["tgt"], batch["tgt_mask"], batch["tgt_sentence_index"], batch["tgt_chunk_ids"]
            )
            return rows
        self._check_length(batch["src"].shape[1] * batch["src"].shape[2])
        self._check_length(batch["tgt"].shape[1] * batch["tgt"].shape[2])
        src, src_mask = pack_tokens(batch["src"], batch["src_mask"])
        tgt, tgt_mask = pack_target(batch["tgt"], batch["tgt_mask"])
        return {"src": src, "src_mask": src_mask, "tgt": tgt, "tgt_mask": tgt_mask}

    def score(self, params: Any, batch: dict[str, Array]) -> Array:
        """``log p [B, S]`` of every target sentence inside its packed chunk: the packed
        row's token log-probabilities summed per sentence (its separator or final EOS
        included)."""
        require_grid(batch, "score")
        logits, targets, mask = self.forward(params, batch, None, False)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        token = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0] * mask
        B, S, T = batch["tgt"].shape
        sentence = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32)[None, :, None], (B, S, T))
        packed_sentence, _ = pack_tokens(sentence, batch["tgt_mask"])  # [B, S*T]
        onehot = jax.nn.one_hot(packed_sentence, S, dtype=jnp.float32)
        return jnp.einsum("bl,bls->bs", token, onehot)

    def token_scores(
        self, params: Any, batch: dict[str, Array], rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        """The packed rows' token log-probabilities scattered back to their grid tokens
        ``[B, S, T]`` (a sentence's separator or the chunk's final EOS at its EOS slot), and
        the packed rows' token metrics."""
        require_grid(batch, "token_scores")
        logits, targets, mask = self.forward(params, batch, rng, train)
        log_probs, metrics = scored_tokens(logits, targets, mask, self.label_smoothing)
        grid_mask = batch["tgt_mask"]
        B, S, T = grid_mask.shape
        index = jnp.broadcast_to(jnp.arange(S * T, dtype=jnp.int32).reshape(1, S, T), (B, S, T))
        where, packed_mask = pack_tokens(index, grid_mask)
        grid = jnp.zeros((B, S * T), log_probs.dtype)
        grid = grid.at[jnp.arange(B)[:, None], where].add(log_probs * packed_mask)
        return grid.reshape(B, S, T), metrics

    def sentence_attention(self, params: Any, batch: dict[str, Array]) -> Array:
        """Sentence-to-sentence attention ``[B, S, S]`` (Zheng et al. 2020, Fig. 4) of the
        last encoder layer's self-attention over the packed chunk, heads averaged:
        ``alpha^kappa_k`` = the mean over sentence ``k``'s real tokens of their summed weights
        on sentence ``kappa``'s tokens (EOS included). Rows of real sentences sum to 1;
        padding sentences give 0."""
        require_grid(batch, "sentence_attention")
        B, S, T = batch["src"].shape
        self._check_length(S * T)
        src, packed_mask = pack_tokens(batch["src"], batch["src_mask"])
        number = jnp.broadcast_to(jnp.arange(1, S + 1, dtype=jnp.int32)[None, :, None], (B, S, T))
        sentence = pack_tokens(number, batch["src_mask"])[0] - 1  # [B, S*T]; padding -1
        module = self.eval_module
        path = (f"encoder_layers_{self.config.num_encoder_layers - 1}", "self_attention")
        _, weights = captured_attention(
            lambda: module.apply({"params": params}, src, packed_mask, method=module.encode), path
        )
        return sentence_pair_attention(weights, sentence, sentence, S)

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search of every packed chunk, cut into sentences.

        Returns ids ``[B, S, L]`` (``L`` = the static output length of the chunk; every real
        sentence EOS-terminated, PAD after; padding sentences PAD) and
        ``{"sentence_counts": [B], "output_capped": [B]}``: the number of sentences of each
        chunk's translation, and whether it stopped at a cap (``search.max_len`` per sentence
        or ``max_len`` per chunk) below its ``len_a * tokens + len_b`` budget.
        """
        src_mask = batch["src_mask"]
        B, S, T = batch["src"].shape
        self._check_length(S * T)
        src, packed_mask = pack_tokens(batch["src"], src_mask)
        max_len, limits = chunk_output_limits(src_mask, search, self.config.max_len)
        result = search_rows(
            self.eval_module, params, src, packed_mask, search, max_len, limits, allow_bos=True
        )  # BOS is the sentence separator
        real = jnp.any(src_mask > 0, axis=-1)
        ids, counts = split_sentences(result.sequences[:, 0], real)
        wanted = source_length_limits(
            src_mask.reshape(B * S, T), search.len_a, search.len_b, 2**30
        ).reshape(B, S)
        wanted = jnp.sum(jnp.where(real, wanted, 0), axis=-1)  # the budget without caps
        capped = (result.lengths[:, 0] >= limits) & (wanted > limits)
        return ids, {"sentence_counts": counts, "output_capped": capped}
