"""RNNSearch (Bahdanau et al. 2015, as OpenNMT builds it) and HM-GDC in its encoder: Table 1's
first group of Tan et al. (2019), "Hierarchical Modeling of Global Context for Document-Level
Neural Machine Translation" (``../shared/papers/003_*``).

Paper -> code (Sec. 3.1: "for the RNNSearch network, we borrow the implementation from
OpenNMT ... encoder and decoder layers are all set to 2, the size of the hidden layer is set
to 500"; every reading below is tested in ``tests/test_rnnsearch.py``):

``rnnsearch`` (sentence model, layout ``SENTENCES``):

* Embeddings: separate source and target tables ``[V, embed_dim]`` and a separate output
  layer ``W_o o_t + b_o`` (OpenNMT's defaults: no sharing, no tying; the paper keeps separate
  50K vocabularies, ours are one joint vocabulary indexed by two tables). No scaling; dropout
  on both embeddings (OpenNMT's ``Embeddings(dropout)``).
* Initialisation: every parameter ``U(-0.1, 0.1)`` (OpenNMT-py ``param_init 0.1``), but the
  HM-GDC attentions (Xavier, :class:`~.layers.MultiHeadAttention`).
* GRU: PyTorch's equations (``nn.GRU`` / ``nn.GRUCell`` in OpenNMT), gates ``[r | z | n]``:
  ``r = s(W_ir x + b_ir + W_hr h + b_hr)``, ``z = s(W_iz x + b_iz + W_hz h + b_hz)``,
  ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h' = (1 - z) n + z h``.
* Encoder: ``num_layers`` bidirectional GRU layers; each direction has ``d_model / 2`` units
  and a layer's output is ``[fwd; bwd]`` of width ``d_model`` (OpenNMT ``brnn``); dropout
  between layers (``nn.GRU(dropout)``), none on the output. Padding-aware by masked state
  updates: a padding step keeps the state and outputs zeros, so the backward GRU starts from
  ``h = 0`` at each sentence's last real token and the forward GRU's final state is the one at
  its last real token (as OpenNMT's packed sequences).
* Decoder initial state (OpenNMT, no bridge): layer ``l`` starts from ``[fwd final; bwd
  final]`` of encoder layer ``l`` (hence one ``num_layers`` for both sides); the input feed
  starts at 0.
* Decoder (OpenNMT ``InputFeedRNNDecoder``): ``num_layers`` stacked GRU cells of ``d_model``
  units, dropout between them; input at step ``t`` is ``[emb(y_{t-1}); o_{t-1}]``
  (input feeding). Attention over the encoder states with the *current* top state ``s_t`` as
  query (Luong order, as OpenNMT; Bahdanau's original queries ``s_{t-1}``): additive ("mlp")
  scores ``v^T tanh(W_q s_t + b_q + W_m h_j)`` (no bias on ``W_m`` and ``v``), padding
  masked, ``c_t = sum_j a_tj h_j``; attentional output ``o_t = tanh(W_c [c_t; s_t] + b_c)``
  (Luong's form; OpenNMT-py omits the tanh for "mlp" attention), then dropout; ``o_t`` is
  both fed to the output layer and fed back as the next input.
* Decoding: one cached step (:meth:`RNNSearch.decode_step`) through the shared beam search;
  the cache holds the per-layer states and the input feed (one row per beam). ``init_cache``
  cannot see the encoder, so the initial state rides in ``extra`` (per example) and the step
  with ``cache["index"] == 0`` takes it from there.
* Hidden size: the config field is ``d_model`` (the trainer's learning-rate schedule and the
  benchmarks read ``config.model.d_model``).

``rnnsearch_hmgdc`` (document model, layout ``CHUNKS``: the context is source-only, so every
sentence of a chunk is searched at once). HM-GDC "into the encoder of the RNNSearch model
using the same method in Section 2.2" (Sec. 3.2); the decoder is RNNSearch's, attending over
``h_ctx``:

* Global context = the whole document: with ``document_scope`` (default) the pipeline's
  chunks are whole documents (:attr:`RNNSearchHMGDCModel.whole_documents`, as
  :mod:`.hmgdc`); ``document_scope = False`` cuts it to chunks of ``data.max_sentences``.
* SentEnc (Eq. 1): RNNSearch's bi-GRU encoder over each sentence alone: ``H_i``.
* Sentence summary (Eq. 2-3, as printed): one multi-head self-attention over ``H_i`` (its
  padding masked; no residual, FFN or LayerNorm), then the *sum* over the sentence's real
  words: ``h~_{S_i} [d_model]``.
* DocEnc (Eq. 4): ``num_document_layers`` bi-GRU layers over the chunk's summaries in order,
  padding sentences masked like padding words: ``H_S [S, d_model]``; dropout between its
  layers as in SentEnc, none on the summaries. Sharing (Sec. 2.3, "we
  share the parameters in the hidden layers of Bi-RNNs in the sentence and document
  encoders"): with ``share_encoder`` document layer ``l`` *is* encoder layer ``l`` (one copy
  of the arrays, gradients summed) for ``l < num_layers``; deeper document layers get their
  own cells (``document_layers_l``). Without it every document layer has its own cells.
  Sharing layer 0 needs ``embed_dim == d_model`` (its input kernel reads embeddings in SentEnc
  and summaries in DocEnc; the paper's 500/500).
* Context attention (Eq. 5-6, the workable reading of ``MultiHead-Ctx(h_ij, h_ij, H_Si)``):
  each word state ``h_{i,j}`` is the query, keys and values are ``H_S`` of *all* sentences of
  the chunk (padding sentences masked), multi-head (``num_heads``; 8 does not divide 500).
* Eq. 7: ``h_ctx = h + Dropout(d_ctx, context_dropout_rate = P = 0.1)``, no LayerNorm.
* The decoder's initial state comes from SentEnc's final states (the sentence's own), its
  attention reads ``h_ctx``. A chunk without real sentences attends uniformly over masked
  keys (finite, no NaN); a one-sentence chunk's context is its own sentence.
* Two-step training (Sec. 2.3): ``theta_s`` are the parameters named as in ``rnnsearch``
  (identical paths), ``theta_d`` are :data:`DOCUMENT_PARAMETERS`;
  :meth:`RNNSearchHMGDCModel.transformer_rules` maps an ``rnnsearch`` checkpoint onto
  ``theta_s`` (``init_from_rules = "all"``) and leaves ``theta_d`` fresh. With sharing, the
  DocEnc layers start from the pretrained encoder layers they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax import flops
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.search import (
    SearchConfig,
    pad_empty_sentences,
    search_decoder,
    search_rows,
    sentence_limits,
)
from docnmt_jax.models import layers
from docnmt_jax.models.base import (
    BaseModel,
    BatchLayout,
    captured_attention,
    register,
    require_grid,
)
from docnmt_jax.models.hmgdc import document_state_attention
from docnmt_jax.models.transformer import sentence_rows

Array = jax.Array
Cache = dict[str, Any]
Weights = dict[str, Any]

#: ``theta_d``: the parameters HM-GDC adds to RNNSearch.
DOCUMENT_PARAMETERS = r"sentence_attention/.*|context_attention/.*|document_layers_\d+/.*"
#: The source side (``init_from_rules = "source"``): source embedding and sentence encoder.
SOURCE_PARAMETERS = r"source_embed/.*|encoder_layers_\d+/.*"


def uniform_init(scale: float) -> layers.Initializer:
    """``U(-scale, scale)`` (OpenNMT-py's ``param_init``)."""

    def init(key: Array, shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
        return jax.random.uniform(key, shape, dtype, -scale, scale)

    return init


INIT = uniform_init(0.1)


@dataclasses.dataclass(frozen=True)
class RNNSearchConfig:
    """RNNSearch hyper-parameters (defaults: Tan et al. 2019, Sec. 3.1: 2 layers, 500 units).
    ``d_model`` is the hidden size: decoder GRUs, attention, encoder output (each encoder
    direction ``d_model / 2``)."""

    vocab_size: int = 8000
    embed_dim: int = 500
    d_model: int = 500
    num_layers: int = 2
    dropout_rate: float = 0.1
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    deterministic: bool = False

    def __post_init__(self) -> None:
        if self.d_model % 2:
            raise ValueError(f"d_model must be even (two encoder directions): {self.d_model}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1: {self.num_layers}")


@dataclasses.dataclass(frozen=True)
class RNNSearchHMGDCConfig(RNNSearchConfig):
    """RNNSearch plus HM-GDC in the encoder: heads of the self- and context attention
    (Eq. 2, 5), DocEnc depth (Eq. 4), SentEnc/DocEnc sharing (Sec. 2.3), Eq. 7's ``P``."""

    num_heads: int = 4
    num_document_layers: int = 2
    share_encoder: bool = True
    context_dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    document_scope: bool = True  # chunks are whole documents (as hmgdc.py); False: the chunk

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_document_layers < 1:
            raise ValueError(f"num_document_layers must be >= 1: {self.num_document_layers}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by {self.num_heads} heads")
        if self.share_encoder and self.embed_dim != self.d_model:
            raise ValueError(
                f"share_encoder needs embed_dim == d_model (document layer 0 is encoder layer 0, "
                f"whose input kernel reads embeddings): {self.embed_dim} != {self.d_model}"
            )


# ----------------------------------------------------------------------------- building blocks


class Linear(nn.Module):
    """``x W (+ b)`` with logical axes; :meth:`weights` gives the arrays for use in scans."""

    inputs: int
    features: int
    axes: tuple[str | None, str | None]
    use_bias: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def setup(self) -> None:
        init = layers.partitioned(INIT, self.axes)
        self.kernel = self.param("kernel", init, (self.inputs, self.features), self.param_dtype)
        if self.use_bias:
            bias_init = layers.partitioned(INIT, self.axes[1:])
            self.bias = self.param("bias", bias_init, (self.features,), self.param_dtype)

    def weights(self) -> Weights:
        out = {"kernel": jnp.asarray(self.kernel, self.dtype)}
        if self.use_bias:
            out["bias"] = jnp.asarray(self.bias, self.dtype)
        return out

    def __call__(self, x: Array) -> Array:
        return linear(self.weights(), x)


def linear(w: Weights, x: Array) -> Array:
    """``x W + b`` (``b`` when present)."""
    y = x @ w["kernel"]
    return y + w["bias"] if "bias" in w else y


class GRUCell(nn.Module):
    """One GRU of ``features`` units over ``inputs``-wide inputs (PyTorch's equations, module
    docstring); kernels ``[in, 3h]`` and ``[h, 3h]``, gates ``[r | z | n]``."""

    inputs: int
    features: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def setup(self) -> None:
        h3 = 3 * self.features

        def param(name: str, shape: tuple[int, ...], axes: tuple[str, ...]) -> Array:
            return self.param(name, layers.partitioned(INIT, axes), shape, self.param_dtype)

        self.input_kernel = param("input_kernel", (self.inputs, h3), ("embed", "mlp"))
        self.input_bias = param("input_bias", (h3,), ("mlp",))
        self.recurrent_kernel = param("recurrent_kernel", (self.features, h3), ("embed", "mlp"))
        self.recurrent_bias = param("recurrent_bias", (h3,), ("mlp",))

    def weights(self) -> Weights:
        names = ("input_kernel", "input_bias", "recurrent_kernel", "recurrent_bias")
        return {name: jnp.asarray(getattr(self, name), self.dtype) for name in names}


def gru_inputs(w: Weights, x: Array) -> Array:
    """The input half of the gates, ``W_i x + b_i [..., 3h]`` (for all steps at once)."""
    return x @ w["input_kernel"] + w["input_bias"]


def gru_update(w: Weights, h: Array, x_proj: Array) -> Array:
    """``h' = GRU(h, x)`` given ``x_proj = W_i x + b_i`` (:func:`gru_inputs`)."""
    h_proj = h @ w["recurrent_kernel"] + w["recurrent_bias"]
    xr, xz, xn = jnp.split(x_proj, 3, axis=-1)
    hr, hz, hn = jnp.split(h_proj, 3, axis=-1)
    r = jax.nn.sigmoid(xr + hr)
    z = jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h


def scan_gru(w: Weights, x_proj: Array, mask: Array, reverse: bool) -> tuple[Array, Array]:
    """One direction over ``x_proj [N, T, 3h]`` from ``h = 0``: (states ``[N, T, h]``, zeros
    where ``mask [N, T]`` is 0; final state ``[N, h]``). Padding steps keep the state, so the
    backward direction starts at each row's last real token."""
    real = jnp.swapaxes(mask > 0, 0, 1)[..., None]  # [T, N, 1]
    h0 = jnp.zeros(x_proj.shape[:1] + (x_proj.shape[-1] // 3,), x_proj.dtype)

    def step(h: Array, inputs: tuple[Array, Array]) -> tuple[Array, Array]:
        xp, keep = inputs
        h = jnp.where(keep, gru_update(w, h, xp), h)
        return h, jnp.where(keep, h, 0.0).astype(h.dtype)

    final, states = jax.lax.scan(step, h0, (jnp.swapaxes(x_proj, 0, 1), real), reverse=reverse)
    return jnp.swapaxes(states, 0, 1), final


class BiGRU(nn.Module):
    """One bidirectional layer (OpenNMT ``brnn``): forward and backward GRUs of
    ``d_model / 2`` units; output ``[fwd; bwd]``."""

    inputs: int
    config: RNNSearchConfig

    def setup(self) -> None:
        cfg = self.config
        half = cfg.d_model // 2
        self.forward = GRUCell(self.inputs, half, cfg.dtype, cfg.param_dtype)
        self.backward = GRUCell(self.inputs, half, cfg.dtype, cfg.param_dtype)

    def __call__(self, x: Array, mask: Array) -> tuple[Array, Array]:
        """``x [N, T, in]``, ``mask [N, T]`` -> (states ``[N, T, D]``, final ``[N, D]`` =
        ``[fwd state at the last real token; bwd state at the first]``)."""
        states, finals = [], []
        for cell, reverse in ((self.forward, False), (self.backward, True)):
            w = cell.weights()
            s, f = scan_gru(w, gru_inputs(w, x), mask, reverse)
            states.append(s)
            finals.append(f)
        return jnp.concatenate(states, -1), jnp.concatenate(finals, -1)


class MLPAttention(nn.Module):
    """Additive attention and the attentional output (module docstring): ``query``
    ``W_q s + b_q``, ``memory`` ``W_m h`` (no bias), ``score`` ``v`` (no bias), ``output``
    ``W_c [c; s] + b_c``."""

    config: RNNSearchConfig

    def setup(self) -> None:
        cfg = self.config
        D, dt, pt = cfg.d_model, cfg.dtype, cfg.param_dtype
        self.query = Linear(D, D, ("embed", "mlp"), True, dt, pt)
        self.memory = Linear(D, D, ("embed", "mlp"), False, dt, pt)
        self.score = Linear(D, 1, ("mlp", None), False, dt, pt)
        self.output = Linear(2 * D, D, ("mlp", "embed"), True, dt, pt)

    def weights(self) -> Weights:
        return {name: getattr(self, name).weights() for name in ("query", "score", "output")}


def attentional_output(
    w: Weights, top: Array, memory: Array, memory_proj: Array, src_mask: Array
) -> Array:
    """``o_t = tanh(W_c [c_t; s_t] + b_c)`` for top states ``top [N, D]`` over ``memory
    [B, Ts, D]`` (``memory_proj = W_m memory``), ``N = B * G`` (a search's ``G`` beams per
    example, contiguous, share their example's memory)."""
    B, Ts, D = memory.shape
    groups = top.shape[0] // B
    q = linear(w["query"], top).reshape(B, groups, 1, D)
    energy = jnp.tanh(q + memory_proj[:, None])  # [B, G, Ts, D]
    scores = linear(w["score"], energy)[..., 0].astype(jnp.float32)
    weights = layers.masked_softmax(scores, (src_mask > 0)[:, None, :])
    context = jnp.einsum("bgs,bsd->bgd", weights.astype(memory.dtype), memory)
    combined = jnp.concatenate([context.reshape(top.shape), top], -1)
    return jnp.tanh(linear(w["output"], combined))


def decoder_step(
    w: Weights,
    hidden: Array,
    feed: Array,
    emb_proj: Array,
    memory: Array,
    memory_proj: Array,
    src_mask: Array,
    keep: dict[str, Array] | None = None,
) -> tuple[Array, Array]:
    """One input-feeding step: states ``hidden [N, L, D]``, previous attentional output
    ``feed [N, D]``, ``emb_proj [N, 3D]`` (layer 0's input gates of ``emb(y_{t-1})``) ->
    (new states, ``o_t [N, D]``). ``keep``: scaled dropout masks (``between [L-1, N, D]``,
    ``output [N, D]``), None when deterministic."""
    cells, E = w["layers"], w["embed_dim"]
    x_proj = emb_proj + feed @ cells[0]["input_kernel"][E:]
    states = []
    for i, cell in enumerate(cells):
        if i:
            x = states[-1] if keep is None else states[-1] * keep["between"][i - 1]
            x_proj = gru_inputs(cell, x)
        states.append(gru_update(cell, hidden[:, i], x_proj))
    out = attentional_output(w["attention"], states[-1], memory, memory_proj, src_mask)
    if keep is not None:
        out = out * keep["output"]
    return jnp.stack(states, 1), out


# ---------------------------------------------------------------------------------- RNNSearch


class RNNSearch(nn.Module):
    """RNNSearch over sentence rows: ``src [N, Ts]`` -> logits ``[N, Tt, V]``."""

    config: RNNSearchConfig

    def setup(self) -> None:
        cfg = self.config
        E, D = cfg.embed_dim, cfg.d_model

        def embedding() -> nn.Embed:
            return nn.Embed(
                cfg.vocab_size,
                E,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                embedding_init=layers.partitioned(INIT, ("vocab", "embed")),
            )

        self.source_embed = embedding()
        self.target_embed = embedding()
        self.encoder_layers = [BiGRU(E if i == 0 else D, cfg) for i in range(cfg.num_layers)]
        self.decoder_layers = [
            GRUCell(E + D if i == 0 else D, D, cfg.dtype, cfg.param_dtype)
            for i in range(cfg.num_layers)
        ]
        self.attention = MLPAttention(cfg)
        self.output = Linear(
            D, cfg.vocab_size, ("embed", "vocab"), True, cfg.dtype, cfg.param_dtype
        )
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _drop(self, x: Array) -> Array:
        return self.dropout(x, deterministic=self.config.deterministic)

    def encode_stack(self, stack: Sequence[BiGRU], x: Array, mask: Array) -> tuple[Array, Array]:
        """Stacked bi-GRU layers with dropout between them: (states ``[N, T, D]``, final
        states of every layer ``[N, L, D]``)."""
        finals = []
        for i, layer in enumerate(stack):
            if i:
                x = self._drop(x)
            x, final = layer(x, mask)
            finals.append(final)
        return x, jnp.stack(finals, 1)

    def encode(self, src: Array, src_mask: Array) -> tuple[Array, Array]:
        """(encoder states ``[N, Ts, D]`` (zeros on padding), the decoder's initial states
        ``[N, L, D]``) of ``src [N, Ts]``."""
        return self.encode_stack(self.encoder_layers, self._drop(self.source_embed(src)), src_mask)

    def _decoder_weights(self) -> Weights:
        return {
            "layers": [cell.weights() for cell in self.decoder_layers],
            "attention": self.attention.weights(),
            "embed_dim": self.config.embed_dim,
        }

    def _embed_target(self, w: Weights, ids: Array) -> Array:
        """Layer 0's input gates of ``emb(y)`` (the embedding part of ``[emb; feed]``)."""
        cell, E = w["layers"][0], self.config.embed_dim
        emb = self._drop(self.target_embed(ids))
        return emb @ cell["input_kernel"][:E] + cell["input_bias"]

    def _keep_masks(self, steps: int, rows: int) -> dict[str, Array] | None:
        """Scaled dropout masks of every decoder step (drawn outside the scan), or None."""
        cfg = self.config
        rate = cfg.dropout_rate
        if cfg.deterministic or rate == 0.0:
            return None
        shape = (steps, cfg.num_layers, rows, cfg.d_model)
        keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - rate, shape)
        keep = keep.astype(cfg.dtype) / (1.0 - rate)
        return {"between": keep[:, :-1], "output": keep[:, -1]}

    def decode(
        self, encoded: tuple[Array, Array], src_mask: Array, tgt_in: Array, tgt_mask: Array
    ) -> Array:
        """Teacher-forced decoder (``lax.scan`` over target time): ``tgt_in [N, Tt]``
        (shifted right) -> logits ``[N, Tt, V]`` (float32)."""
        del tgt_mask  # padded target steps run on; their logits carry no loss
        memory, initial = encoded
        w = self._decoder_weights()
        memory_proj = self.attention.memory(memory)
        emb_proj = jnp.swapaxes(self._embed_target(w, tgt_in), 0, 1)  # [Tt, N, 3D]
        keep = self._keep_masks(tgt_in.shape[1], tgt_in.shape[0])

        def step(carry: tuple[Array, Array], xs: Any) -> tuple[tuple[Array, Array], Array]:
            x_t, keep_t = xs
            hidden, out = decoder_step(w, *carry, x_t, memory, memory_proj, src_mask, keep_t)
            return (hidden, out), out

        feed = jnp.zeros(memory.shape[:1] + (self.config.d_model,), memory.dtype)
        _, outputs = jax.lax.scan(step, (initial.astype(memory.dtype), feed), (emb_proj, keep))
        return self.output(jnp.swapaxes(outputs, 0, 1)).astype(jnp.float32)

    def __call__(self, src: Array, src_mask: Array, tgt: Array, tgt_mask: Array) -> Array:
        """Logits ``[N, Tt, V]`` for targets ``tgt`` (not yet shifted; EOS-terminated)."""
        encoded = self.encode(src, src_mask)
        return self.decode(encoded, src_mask, layers.shift_right(tgt, BOS_ID), tgt_mask)

    def init_cache(self, batch: int, max_len: int) -> Cache:
        """An empty decoding cache (``max_len`` unused: an RNN's state has no length):
        ``hidden [batch, L, D]``, input feed ``feed [batch, D]``, step ``index``."""
        del max_len
        cfg = self.config
        return {
            "index": jnp.zeros((), jnp.int32),
            "hidden": jnp.zeros((batch, cfg.num_layers, cfg.d_model), cfg.dtype),
            "feed": jnp.zeros((batch, cfg.d_model), cfg.dtype),
        }

    def decode_inputs(self, encoded: tuple[Array, Array], src_mask: Array) -> dict[str, Any]:
        """Per-example inputs of :meth:`decode_step`: source mask, encoder states, their
        attention projection ``W_m h`` (once per source) and the initial decoder states."""
        memory, initial = encoded
        return {
            "src_mask": src_mask,
            "memory": memory,
            "memory_proj": self.attention.memory(memory),
            "initial": initial,
        }

    def decode_step(self, cache: Cache, token: Array, extra: dict[str, Any]) -> tuple[Array, Cache]:
        """One step: ``token [N]`` -> logits ``[N, V]``; ``extra`` (:meth:`decode_inputs`) has
        one row per example, ``N`` a multiple of it with each example's beams contiguous. At
        ``cache['index'] == 0`` the states start from ``extra['initial']``."""
        w = self._decoder_weights()
        groups = token.shape[0] // extra["src_mask"].shape[0]
        initial = jnp.repeat(extra["initial"], groups, axis=0).astype(cache["hidden"].dtype)
        hidden = jnp.where(cache["index"] == 0, initial, cache["hidden"])
        hidden, out = decoder_step(
            w,
            hidden,
            cache["feed"],
            self._embed_target(w, token),
            extra["memory"],
            extra["memory_proj"],
            extra["src_mask"],
        )
        logits = self.output(out).astype(jnp.float32)
        return logits, {"index": cache["index"] + 1, "hidden": hidden, "feed": out}


@register("rnnsearch", config=RNNSearchConfig, flops=flops.rnnsearch_terms)
class RNNSearchModel(BaseModel):
    """RNNSearch: every sentence translated on its own (one sentence per batch row)."""

    module_class = RNNSearch
    layout = BatchLayout.SENTENCES
    source_parameters = SOURCE_PARAMETERS

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        require_grid(batch, "RNNSearch")
        return sentence_rows(batch)

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search over every sentence of ``batch``: ids ``[B, S, L]`` (EOS, then PAD)."""
        rows = self.rows(batch)
        max_len, limits = sentence_limits(rows["src_mask"], search)
        result = search_rows(
            self.eval_module, params, rows["src"], rows["src_mask"], search, max_len, limits
        )
        ids = result.sequences[:, 0].reshape(batch["src"].shape[:2] + (max_len,))
        return pad_empty_sentences(ids, batch["src_mask"]), {}


# ------------------------------------------------------------------------------------- HM-GDC


class RNNSearchHMGDC(RNNSearch):
    """RNNSearch with HM-GDC in the encoder over chunks: ``src [B, S, Ts]`` -> logits
    ``[B, S, Tt, V]``. RNNSearch's parameter names for ``theta_s``."""

    config: RNNSearchHMGDCConfig

    def setup(self) -> None:
        super().setup()
        cfg = self.config

        def attention() -> layers.MultiHeadAttention:
            return layers.MultiHeadAttention(
                cfg.num_heads, cfg.d_model, cfg.attention_dropout_rate, cfg.deterministic, cfg.dtype
            )

        self.sentence_attention = attention()
        self.context_attention = attention()
        first = cfg.num_layers if cfg.share_encoder else 0
        self.document_layers = {
            i: BiGRU(cfg.d_model, cfg) for i in range(first, cfg.num_document_layers)
        }
        self.context_dropout = nn.Dropout(cfg.context_dropout_rate)

    def document_stack(self) -> list[BiGRU]:
        """DocEnc's layers: encoder layer ``l`` itself where shared, else its own cells."""
        cfg = self.config
        return [
            self.encoder_layers[i]
            if cfg.share_encoder and i < cfg.num_layers
            else self.document_layers[i]
            for i in range(cfg.num_document_layers)
        ]

    def encode(self, src: Array, src_mask: Array) -> tuple[Array, Array]:  # type: ignore[override]
        """(``h_ctx [B*S, Ts, D]`` (Eq. 7), SentEnc's final states ``[B*S, L, D]``) of chunks
        ``src [B, S, Ts]``."""
        B, S, T = src.shape
        D = self.config.d_model
        mask = src_mask.reshape(B * S, T)
        states, finals = super().encode(src.reshape(B * S, T), mask)  # Eq. 1
        h_s = self.sentence_attention(states, states, layers.padding_mask(mask, mask))  # Eq. 2
        summary = jnp.sum(jnp.where((mask > 0)[..., None], h_s, 0.0), axis=1)  # Eq. 3
        sentences = jnp.any(src_mask > 0, axis=-1)  # [B, S]
        doc, _ = self.encode_stack(
            self.document_stack(), summary.reshape(B, S, D).astype(states.dtype), sentences
        )  # Eq. 4: H_S [B, S, D]
        d_ctx = self.context_attention(
            states.reshape(B, S * T, D), doc, sentences[:, None, None, :]
        )  # Eq. 5-6
        d_ctx = self.context_dropout(d_ctx, deterministic=self.config.deterministic)
        return states + d_ctx.reshape(B * S, T, D), finals  # Eq. 7

    def __call__(self, src: Array, src_mask: Array, tgt: Array, tgt_mask: Array) -> Array:
        """Logits ``[B, S, Tt, V]`` for every sentence of the chunks."""
        B, S, T = tgt.shape
        encoded = self.encode(src, src_mask)
        flat = lambda x: x.reshape(B * S, x.shape[-1])  # noqa: E731
        tgt_in = layers.shift_right(flat(tgt), BOS_ID)
        logits = self.decode(encoded, flat(src_mask), tgt_in, flat(tgt_mask))
        return logits.reshape(B, S, T, -1)


@register("rnnsearch_hmgdc", config=RNNSearchHMGDCConfig, flops=flops.rnnsearch_hmgdc_terms)
class RNNSearchHMGDCModel(BaseModel):
    """RNNSearch + HM-GDC: chunks in, every sentence translated with the chunk's global
    context, all sentences of a chunk at once. ``with_random_context``: the base class's
    rotation of sentence slots across rows (:func:`~.base.random_context_batch`)."""

    module_class = RNNSearchHMGDC
    layout = BatchLayout.CHUNKS
    source_parameters = SOURCE_PARAMETERS

    @property
    def whole_documents(self) -> bool:
        """With ``document_scope`` every pipeline chunk is a whole document (global context,
        as :class:`~.hmgdc.HMGDCModel`)."""
        return self.config.document_scope

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        require_grid(batch, "RNNSearch HM-GDC")
        return super().rows(batch)

    def transformer_rules(self) -> list[tuple[str, str]]:
        """From an ``rnnsearch`` checkpoint (the sentence model of the two-step training):
        ``theta_s`` from identical paths, ``theta_d`` fresh."""
        return [(DOCUMENT_PARAMETERS, "skip"), (r"(.*)", r"\1")]

    def sentence_attention(self, params: Any, batch: dict[str, Array]) -> Array:
        """Sentence-to-sentence attention ``[B, S, S]`` (Zheng et al. 2020, Fig. 4) of Eq.
        5-6's attention of every word over the document states ``H_S``
        (:func:`~.hmgdc.document_state_attention`, as :class:`~.hmgdc.HMGDCModel`)."""
        rows = self.rows(batch)
        module = self.eval_module
        _, weights = captured_attention(
            lambda: module.apply(
                {"params": params}, rows["src"], rows["src_mask"], method=module.encode
            ),
            ("context_attention",),
        )
        return document_state_attention(weights, batch["src_mask"])

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search of every sentence of the chunks at once, each attending over its
        ``h_ctx`` (the encoder runs once): ids ``[B, S, L]``, padding sentences PAD."""
        module, variables = self.eval_module, {"params": params}
        rows = self.rows(batch)
        encoded = module.apply(variables, rows["src"], rows["src_mask"], method=module.encode)
        src_mask = rows["src_mask"].reshape(-1, rows["src_mask"].shape[-1])
        extra = module.apply(variables, encoded, src_mask, method=module.decode_inputs)
        max_len, limits = sentence_limits(src_mask, search)
        result = search_decoder(module, variables, extra, search, max_len, limits)
        ids = result.sequences[:, 0].reshape(batch["src"].shape[:2] + (max_len,))
        return pad_empty_sentences(ids, batch["src_mask"]), {}
