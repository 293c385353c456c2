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

The shared recurrent blocks (GRU, bi-GRU, additive attention, the decoder step) are
:mod:`.rnn_layers`; HM-GDC in its encoder (``rnnsearch_hmgdc``) is :mod:`.hmgdc_rnn`.
"""

from __future__ import annotations

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
    search_rows,
    sentence_limits,
    sentence_outputs,
)
from docnmt_jax.models import layers
from docnmt_jax.models.base import (
    BaseModel,
    BatchLayout,
    register,
    require_grid,
)
from docnmt_jax.models.rnn_layers import (
    INIT,
    BiGRU,
    Cache,
    GRUCell,
    Linear,
    MLPAttention,
    RNNSearchConfig,
    decoder_step,
)
from docnmt_jax.models.transformer import sentence_rows

Array = jax.Array
Weights = dict[str, Any]

#: The source side (``init_from_rules = "source"``): source embedding and sentence encoder.
SOURCE_PARAMETERS = r"source_embed/.*|encoder_layers_\d+/.*"


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
        return logits, {  # the cache keeps its dtypes (a search's loop carry must)
            "index": cache["index"] + 1,
            "hidden": hidden.astype(cache["hidden"].dtype),
            "feed": out.astype(cache["feed"].dtype),
        }


def rnnsearch_terms(config: RNNSearchConfig, shape: flops.BatchShape) -> flops.Terms:
    """Forward FLOPs of RNNSearch, per sentence row (``N`` rows), ``E`` embedding, ``D``
    hidden, ``L`` layers::

      encoder layer l  input        2 · 2·Ts·in_l·3(D/2)    in_0 = E, else D; 2 directions
                       recurrent    2 · 2·Ts·(D/2)·3(D/2)
      decoder layer l  input        2·Tt·in_l·3D            in_0 = E + D (input feeding)
                       recurrent    2·Tt·D·3D
      attention        memory       2·Ts·D²                 W_m h, once per source
                       query        2·Tt·D²                 W_q s_t
                       scores       2·Tt·Ts·D               v · tanh(...)
                       context      2·Tt·Ts·D               weights · h
                       output       2·Tt·2D·D               W_c [c_t; s_t]
      output softmax   2·Tt·D·V                             (untied)
    """
    E, D, N, V = config.embed_dim, config.d_model, shape.rows, config.vocab_size
    Ts, Tt = shape.src_len, shape.tgt_len
    total: flops.Terms = {}
    for layer in range(config.num_layers):
        flops.add_terms(total, "encoder", flops.bi_gru(N, Ts, E if layer == 0 else D, D))
        decoder = {
            "input": N * 2 * Tt * (E + D if layer == 0 else D) * 3 * D,
            "recurrent": N * 2 * Tt * D * 3 * D,
        }
        flops.add_terms(total, "decoder", decoder)
    attention = {
        "memory": N * 2 * Ts * D * D,
        "query": N * 2 * Tt * D * D,
        "scores": N * 2 * Tt * Ts * D,
        "context": N * 2 * Tt * Ts * D,
        "output": N * 2 * Tt * 2 * D * D,
    }
    flops.add_terms(total, "attention", attention)
    total["output"] = N * 2 * Tt * D * V
    return total


@register("rnnsearch", config=RNNSearchConfig, flops=rnnsearch_terms)
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
        ids, aux = sentence_outputs(result, batch["src"].shape[:2], search)
        return pad_empty_sentences(ids, batch["src_mask"]), aux


# ------------------------------------------------------------------------------------- HM-GDC
