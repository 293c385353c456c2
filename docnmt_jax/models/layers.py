"""Shared building blocks of every model: embeddings, positions, attention, feed-forward.

Each paper module (``transformer.py``, ``final.py``, ...) composes these, so a reader sees
only its delta. Every parameter carries logical axis names (``vocab``, ``embed``, ``heads``,
``kv``, ``mlp``) so that train and decode steps can be sharded over a device mesh without
touching the models; activations carry ``batch``/``length`` constraints (no-ops without a mesh).

Attention follows Vaswani et al. (2017), Eq. (1)-(2): softmax(QK^T/sqrt(d_k))V per head,
heads concatenated and projected. Keys and values are projected by :meth:`project_kv`
separately from :meth:`attend`, so decoders can cache them (self-attention step by step,
cross-attention once per source batch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

NEG_INF = -1e9  # additive mask value; finite so fully masked rows give a uniform softmax, not NaN


class LogicalAxes(nn.LogicallyPartitioned):
    """A parameter boxed with logical axis names; unboxing under a mesh constrains it only when
    the ranks agree (``nn.DenseGeneral`` unboxes its kernel flat, before reshaping it)."""

    def unbox(self, apply_constraint: bool = True) -> Any:
        return super().unbox(apply_constraint and np.ndim(self.value) == len(self.names))


def partitioned(init: Initializer, axes: tuple[str, ...]) -> Initializer:
    """An initializer whose parameter carries logical axis names ``axes``."""

    def boxed(*args: Any, **kwargs: Any) -> LogicalAxes:
        return LogicalAxes(init(*args, **kwargs), axes)

    return boxed


def constrain(x: Array, axes: tuple[str | None, ...]) -> Array:
    """Logical sharding constraint on an activation (a no-op outside a mesh context)."""
    return nn.with_logical_constraint(x, axes)


def sinusoidal_encoding(positions: Array, features: int, dtype: Dtype = jnp.float32) -> Array:
    """Sinusoidal encodings of (integer or float) ``positions``: ``[...] -> [..., features]``.

    PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...) (Vaswani et al. 2017, Sec. 3.5),
    laid out as ``[sin | cos]`` halves. Computed on the fly, so positions may restart at every
    sentence or be negative relative distances (Dai et al. 2019).
    """
    half = features // 2
    inv_freq = np.exp(-np.log(10000.0) * np.arange(half, dtype=np.float32) / max(half, 1))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    enc = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    if features % 2:
        enc = jnp.pad(enc, [(0, 0)] * (enc.ndim - 1) + [(0, 1)])
    return enc.astype(dtype)


class SharedEmbedding(nn.Module):
    """One matrix for source, target and output projection (joint vocabulary).

    Lookups are scaled by sqrt(d_model) (Vaswani et al. 2017, Sec. 3.4); :meth:`attend` gives
    the tied output logits h E^T. Lookups are float32 whatever ``dtype``: they start the
    residual stream, which stays float32 (:class:`Sublayer`).
    """

    vocab_size: int
    features: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def setup(self) -> None:
        self.embedding = self.param(
            "embedding",
            partitioned(nn.initializers.normal(stddev=self.features**-0.5), ("vocab", "embed")),
            (self.vocab_size, self.features),
            self.param_dtype,
        )

    def __call__(self, ids: Array) -> Array:
        table = jnp.asarray(self.embedding, jnp.float32)
        return jnp.take(table, ids, axis=0) * np.float32(np.sqrt(self.features))

    def attend(self, x: Array) -> Array:
        """Tied output logits ``x E^T`` (:func:`tied_logits`)."""
        return tied_logits(x.astype(self.dtype), jnp.asarray(self.embedding, self.dtype))


@jax.custom_vjp
def tied_logits(x: Array, table: Array) -> Array:
    """``x [..., D] @ table [V, D]^T`` whose backward computes ``d table = (x^T g)^T``.

    Autodiff writes ``d table = g^T x`` and XLA:CPU then materialises the logits gradient
    ``g [N, V]`` a second time, transposed (the largest tensor of a step: 65 MB at 2,048
    tokens and 8k words); transposing ``x [N, D]`` and the ``[D, V]`` result instead moves
    ``V/D`` times fewer bytes. 10% faster train steps at Zheng's TED size
    (docs/performance.md); same values.

    The logits are float32 whatever the inputs' dtype (the products accumulate in float32
    and are not rounded back): a bfloat16 logit keeps 8 bits, so near-ties between words
    (0.06 apart at a logit of 10) would be decided by rounding, not by the model.
    """
    return jnp.einsum("...d,vd->...v", x, table, preferred_element_type=jnp.float32)


def _tied_logits_fwd(x: Array, table: Array) -> tuple[Array, tuple[Array, Array]]:
    return tied_logits(x, table), (x, table)


def _tied_logits_bwd(residuals: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
    x, table = residuals
    g = g.astype(x.dtype)  # the products run in the inputs' dtype, accumulated in float32
    dx = jnp.einsum("...v,vd->...d", g, table, preferred_element_type=jnp.float32)
    rows_x, rows_g = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    d_table = jnp.einsum("nd,nv->dv", rows_x, rows_g, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), d_table.T.astype(table.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


def layer_norm(dtype: Dtype, name: str | None = None) -> nn.LayerNorm:
    """LayerNorm whose scale and bias carry the ``embed`` axis."""
    return nn.LayerNorm(
        epsilon=1e-6,
        dtype=dtype,
        scale_init=partitioned(nn.initializers.ones_init(), ("embed",)),
        bias_init=partitioned(nn.initializers.zeros_init(), ("embed",)),
        name=name,
    )


def float32_output_dot(lhs: Array, rhs: Array, *args: Any, **kwargs: Any) -> Array:
    """``lax.dot_general`` whose products accumulate and stay float32 whatever the inputs'
    dtype: the sublayers' last projections (FFN ``wo``, attention ``out``) hand the float32
    residual stream an unrounded sum (:class:`Sublayer`)."""
    kwargs["preferred_element_type"] = jnp.float32
    return jax.lax.dot_general(lhs, rhs, *args, **kwargs)


class FeedForward(nn.Module):
    """Position-wise FFN(x) = max(0, xW1 + b1)W2 + b2 (Vaswani et al. 2017, Eq. 2)."""

    hidden_dim: int
    dropout_rate: float = 0.0
    deterministic: bool = True
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        h = nn.Dense(
            self.hidden_dim,
            dtype=self.dtype,
            kernel_init=partitioned(nn.initializers.xavier_uniform(), ("embed", "mlp")),
            bias_init=partitioned(nn.initializers.zeros_init(), ("mlp",)),
            name="wi",
        )(x)
        h = nn.relu(h)
        h = constrain(h, ("batch", "length", "mlp"))
        h = nn.Dropout(self.dropout_rate)(h, deterministic=self.deterministic)
        return nn.Dense(
            features,
            dtype=self.dtype,
            dot_general=float32_output_dot,
            kernel_init=partitioned(nn.initializers.xavier_uniform(), ("mlp", "embed")),
            bias_init=partitioned(nn.initializers.zeros_init(), ("embed",)),
            name="wo",
        )(h)


def heads_projection(
    num_heads: int, model_dim: int, dtype: Dtype, use_bias: bool = True, name: str | None = None
) -> nn.DenseGeneral:
    """``[..., D] -> [..., H, D/H]`` projection (queries, keys, values) with logical axes."""
    if model_dim % num_heads:
        raise ValueError(f"model dimension {model_dim} is not divisible by {num_heads} heads")
    return nn.DenseGeneral(
        features=(num_heads, model_dim // num_heads),
        axis=-1,
        use_bias=use_bias,
        dtype=dtype,
        kernel_init=partitioned(nn.initializers.xavier_uniform(), ("embed", "heads", "kv")),
        bias_init=partitioned(nn.initializers.zeros_init(), ("heads", "kv")),
        name=name,
    )


def output_projection(model_dim: int, dtype: Dtype, name: str | None = None) -> nn.DenseGeneral:
    """``[..., H, D/H] -> [..., D]``: the heads concatenated and projected (logical axes)."""
    return nn.DenseGeneral(
        features=model_dim,
        axis=(-2, -1),
        dtype=dtype,
        dot_general=float32_output_dot,
        kernel_init=partitioned(nn.initializers.xavier_uniform(), ("heads", "kv", "embed")),
        bias_init=partitioned(nn.initializers.zeros_init(), ("embed",)),
        name=name,
    )


def masked_softmax(logits: Array, mask: Array | None) -> Array:
    """Softmax over the last axis of float32 ``logits`` where the boolean ``mask`` holds
    (:data:`NEG_INF` elsewhere: a fully masked row is uniform, never NaN)."""
    if mask is not None:
        logits = jnp.where(mask, logits, NEG_INF)
    return jax.nn.softmax(logits, axis=-1)


#: ``DOCNMT_ATTENTION=xla|cudnn|einsum`` overrides :func:`attention_implementation` (to
#: compare kernels, or to step around one a device cannot compile).
ATTENTION_ENV = "DOCNMT_ATTENTION"


def attention_implementation(dtype: Dtype) -> str:
    """The kernel of :func:`fused_attention`: cuDNN's fused (flash) attention on a GPU in
    bfloat16/float16 (cuDNN has no float32 kernel), XLA's ``dot_product_attention`` on other
    accelerators, and on CPU the two einsums this project's CPU timings were made with
    (``einsum``; XLA's kernel is the same two products there, and whether it is faster on CPU
    is measured by ``experiments/loader_attention_speed.py``, not assumed)."""
    chosen = os.environ.get(ATTENTION_ENV, "")
    if chosen:
        if chosen not in ("xla", "cudnn", "einsum"):
            raise ValueError(f"{ATTENTION_ENV}={chosen!r}: expected xla, cudnn or einsum")
        return chosen
    backend = jax.default_backend()
    if backend == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return "einsum" if backend == "cpu" else "xla"


def fused_attention(
    q: Array, k: Array, v: Array, mask: Array | None, implementation: str = ""
) -> Array:
    """``softmax(q k^T / sqrt(d) where mask) v`` per head, ``q [B, Tq, H, d]``, ``k, v
    [B, Tk, H, d]``, ``mask`` boolean broadcastable to ``[B, H, Tq, Tk]`` -> ``[B, Tq, H, d]``,
    through ``jax.nn.dot_product_attention`` (logits and softmax in float32; a fully masked
    row is uniform, as :func:`masked_softmax` makes it). ``implementation``: '' picks
    :func:`attention_implementation`."""
    implementation = implementation or attention_implementation(q.dtype)
    if implementation == "einsum":
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        logits = logits / np.sqrt(q.shape[-1])
        weights = masked_softmax(logits, mask).astype(v.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    if mask is not None and implementation == "cudnn":  # cuDNN takes the whole mask
        mask = jnp.broadcast_to(mask, (q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, scale=1.0 / np.sqrt(q.shape[-1]), implementation=implementation
    )


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention with separable key/value projection.

    ``__call__(q_in, kv_in, mask)`` is plain attention; decoders use ``project_kv`` once and
    ``attend`` many times. ``mask`` is boolean, broadcastable to ``[B, H, Tq, Tk]``.
    """

    num_heads: int
    model_dim: int
    dropout_rate: float = 0.0
    deterministic: bool = True
    dtype: Dtype = jnp.float32

    def setup(self) -> None:
        self.query = heads_projection(self.num_heads, self.model_dim, self.dtype)
        self.key = heads_projection(self.num_heads, self.model_dim, self.dtype)
        self.value = heads_projection(self.num_heads, self.model_dim, self.dtype)
        self.out = output_projection(self.model_dim, self.dtype)
        self.dropout = nn.Dropout(self.dropout_rate)

    def project_q(self, x: Array) -> Array:
        """``[B, T, D] -> [B, T, H, D/H]``."""
        return self.query(x)

    def project_kv(self, x: Array) -> tuple[Array, Array]:
        """Keys and values ``[B, T, H, D/H]`` of the memory ``x``."""
        return self.key(x), self.value(x)

    def attend(
        self,
        q: Array,
        k: Array,
        v: Array,
        mask: Array | None,
        return_weights: bool = False,
        heads_major: bool = False,
    ) -> Array | tuple[Array, Array]:
        """Attention of projected queries over projected keys/values, output projected to D.

        Keys/values are ``[B, Tk, H, d]`` as :meth:`project_kv` gives them, or with
        ``heads_major`` ``[B, H, Tk, d]`` (:func:`heads_major`), the layout of decoding caches.

        ``q`` may hold ``G`` rows per key row (``q [B*G, Tq, H, d]``, ``k, v [B, Tk, H, d]``,
        each example's ``G`` rows contiguous): the beams of a search share their example's
        cross-attention keys, read once instead of once per beam. ``mask`` then broadcasts to
        ``[B, H, G*Tq, Tk]`` (its query axis of size 1).
        """
        groups = q.shape[0] // k.shape[0]
        rows, tq = q.shape[:2]
        q = group_rows(q, groups)
        depth = q.shape[-1]
        if not (return_weights or heads_major) and (self.deterministic or not self.dropout_rate):
            out = fused_attention(q, k, v, mask)  # no weights asked for, none dropped
            return self.out(out.reshape((rows, tq) + out.shape[2:]))
        kv = "bhkd" if heads_major else "bkhd"
        logits = jnp.einsum(f"bqhd,{kv}->bhqk", q, k, preferred_element_type=jnp.float32)
        logits = logits / np.sqrt(depth)
        weights = masked_softmax(logits, mask)
        dropped = self.dropout(weights, deterministic=self.deterministic)
        if heads_major:
            out = attention_values(dropped.astype(self.dtype), v)
        else:
            out = jnp.einsum("bhqk,bkhd->bqhd", dropped.astype(self.dtype), v)
        out = self.out(out.reshape((rows, tq) + out.shape[2:]))
        return (out, weights) if return_weights else out

    def fold_memory(self, memory: Array) -> tuple[Array, Array, Array]:
        """A small memory ``[B, S, D]`` with the query and output projections folded in, for
        :meth:`attend_folded` (exact, not an approximation): keys ``[B, S, H, D]`` (``W_q^h
        k_s^h``), key biases ``[B, S, H]`` (``b_q^h . k_s^h``) and values ``[B, S, H, D]``
        (``v_s^h W_o^h``). Each query then costs ``2 H S D`` multiply-adds instead of the two
        ``D x D`` projections: cheaper when ``H * S < D`` (a document's few sentence vectors
        read at every decoding step)."""
        k, v = self.project_kv(memory)
        query = nn.meta.unbox(self.query.variables["params"])
        out = nn.meta.unbox(self.out.variables["params"])
        scale = 1.0 / np.sqrt(k.shape[-1])
        keys = jnp.einsum("bshd,Dhd->bshD", k, query["kernel"].astype(k.dtype)) * scale
        bias = query.get("bias", jnp.zeros(k.shape[2:], k.dtype))
        key_bias = jnp.einsum("bshd,hd->bsh", k, bias.astype(k.dtype)) * scale
        values = jnp.einsum("bshd,hdD->bshD", v, out["kernel"].astype(v.dtype))
        return keys, key_bias, values

    def attend_folded(
        self, x: Array, folded: tuple[Array, Array, Array], mask: Array | None
    ) -> Array:
        """Attention of the inputs ``x [B*G, 1, D]`` (``G`` rows per memory row, contiguous)
        over a memory folded by :meth:`fold_memory`; ``mask`` broadcasts to ``[B, 1, 1, S]``.
        Equals ``self.attend(self.project_q(x), *self.project_kv(memory), mask)`` without
        attention dropout (decoding)."""
        keys, key_bias, values = folded
        B, S = keys.shape[:2]
        rows = x.reshape(B, -1, x.shape[-1])  # [B, G, D]
        logits = (
            jnp.einsum("bgD,bshD->bhgs", rows, keys, preferred_element_type=jnp.float32)
            + jnp.einsum("bsh->bhs", key_bias).astype(jnp.float32)[:, :, None, :]
        )
        weights = masked_softmax(logits, mask).astype(values.dtype)
        out = jnp.einsum("bhgs,bshD->bgD", weights, values)
        bias = nn.meta.unbox(self.out.variables["params"]).get("bias", 0.0)
        return (out + bias).astype(x.dtype).reshape(x.shape)

    def __call__(self, q_in: Array, kv_in: Array, mask: Array | None) -> Array:
        k, v = self.project_kv(kv_in)
        return self.attend(self.project_q(q_in), k, v, mask)


class Sublayer(nn.Module):
    """Residual wrapper: post-LN ``LN(x + Drop(f(x)))`` (the papers) or pre-LN.

    Pre-LN computes ``x + Drop(f(LN x))``.

    ``fn`` receives the (possibly normalised) input and returns the sublayer output.

    Mixed precision: ``fn`` computes in ``dtype`` (its projections cast their inputs), but the
    norm computes and returns float32 and the residual sums stay float32 (a float32 ``x`` plus
    a bfloat16 ``fn(.)`` is float32): rounding every sum of a deep stream to bfloat16's 8 bits
    flips beam-search near-ties (docs/accelerators.md, bfloat16 decoding).
    """

    pre_ln: bool
    dropout_rate: float
    deterministic: bool
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array, fn: Callable[[Array], Array]) -> Array:
        norm = layer_norm(jnp.float32, name="norm")
        drop = nn.Dropout(self.dropout_rate)
        if self.pre_ln:
            return x + drop(fn(norm(x)), deterministic=self.deterministic)
        return norm(x + drop(fn(x), deterministic=self.deterministic))


def group_rows(x: Array, groups: int) -> Array:
    """``[B*G, T, ...] -> [B, G*T, ...]``: the ``G`` contiguous rows of an example (its beams)
    become one row of ``G*T`` positions, so they share per-example keys in one matmul."""
    if groups == 1:
        return x
    return x.reshape((x.shape[0] // groups, groups * x.shape[1]) + x.shape[2:])


def attention_values(weights: Array, values: Array) -> Array:
    """``sum_k weights[b, h, q, k] values[b, h, k, d]`` as ``[B, Q, H, d]`` (heads-major values).

    With a handful of query rows per key row (a search's beams sharing their example's keys,
    ``1 < Q <= 8``) XLA:CPU runs the batched product 2.7x slower than the broadcast
    multiply-add it is (``[5 x 33] . [33 x 64]`` per example and head, measured); one row
    (a matrix-vector product) and many rows are products.
    """
    rows = weights.shape[2]
    if 1 < rows <= 8 and jax.default_backend() == "cpu":
        out = jnp.sum(weights[..., None] * values[:, :, None], axis=3)  # [B, H, Q, d]
        return jnp.swapaxes(out, 1, 2)
    return jnp.einsum("bhqk,bhkd->bqhd", weights, values)


def heads_major(x: Array) -> Array:
    """Keys or values ``[B, T, H, d] -> [B, H, T, d]``: the layout of decoding caches.

    A cache kept in the matmul's own layout is written in place every step; in the projection
    layout XLA:CPU copied the whole cache transposed after every write (35% of beam-search
    time; docs/performance.md)."""
    return jnp.swapaxes(x, 1, 2)


def write_position(cache: Array, x: Array, index: Array) -> Array:
    """Writes the keys or values ``x [N, 1, H, d]`` of one step into a heads-major cache
    ``[N, H, L, d]`` at position ``index``: shared (a scalar) or one per row (``[N]``)."""
    if jnp.ndim(index) == 0:
        return jax.lax.dynamic_update_slice_in_dim(cache, heads_major(x), index, axis=2)
    return cache.at[jnp.arange(cache.shape[0]), :, index].set(x[:, 0])


def padding_mask(q_mask: Array, k_mask: Array) -> Array:
    """``[B, Tq]``, ``[B, Tk]`` token masks -> boolean ``[B, 1, Tq, Tk]`` attention mask."""
    return (q_mask[:, None, :, None] > 0) & (k_mask[:, None, None, :] > 0)


def segment_mask(q_ids: Array, k_ids: Array) -> Array:
    """``[B, Tq]``, ``[B, Tk]`` segment ids (0 = padding) of packed rows -> boolean
    ``[B, 1, Tq, Tk]``: a query sees the keys of its own segment (flax ``examples/wmt``'s
    packed attention)."""
    q, k = q_ids[:, None, :, None], k_ids[:, None, None, :]
    return (q == k) & (q > 0)


def causal_mask(length: int) -> Array:
    """Boolean ``[1, 1, T, T]`` lower-triangular mask: position i sees positions <= i."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def shift_right(ids: Array, bos_id: int) -> Array:
    """Decoder input: ``[bos, y_1, ..., y_{T-1}]`` along the last axis."""
    pad_width = [(0, 0)] * (ids.ndim - 1) + [(1, 0)]
    return jnp.pad(ids, pad_width, constant_values=bos_id)[..., :-1]


def shift_right_segments(ids: Array, positions: Array, bos_id: int) -> Array:
    """Decoder input of packed rows: :func:`shift_right`, with ``bos_id`` wherever a segment
    starts (``positions == 0``), so no segment sees the previous one's last token."""
    return jnp.where(positions == 0, bos_id, shift_right(ids, bos_id))


# ------------------------------------------------------------------------- banded attention


class Band:
    """Banded attention over packed rows of ``length`` tokens (docs/design/packing_plan.md §2.3).

    A row is cut into ``length // width`` blocks of ``width`` tokens; modules run on block rows
    ``[B * blocks, width, ...]`` (:meth:`blocks`, :meth:`unblock`: reshapes only) and a block's
    queries attend to the keys of its window, the blocks ``i - back .. i + ahead``
    (:meth:`windows`, ``(back + 1 + ahead) * width`` keys, zeros beyond the row's ends). The
    caller's mask must allow only keys inside the window; then banded attention equals dense
    attention over the row, which is ``Band.dense(length)`` (one block, no neighbours).
    ``back``/``ahead`` are clipped to the blocks that exist.
    """

    def __init__(self, length: int, width: int, back: int = 0, ahead: int = 0):
        if width < 1 or length % width:
            raise ValueError(f"band width {width} does not divide the row length {length}")
        if back < 0 or ahead < 0:
            raise ValueError(f"band back/ahead must be >= 0, got {back}/{ahead}")
        self.length, self.width = length, width
        self.num_blocks = length // width
        self.back = min(back, self.num_blocks - 1)
        self.ahead = min(ahead, self.num_blocks - 1)

    @classmethod
    def dense(cls, length: int) -> Band:
        """One block per row: every token of the row is a key of every query."""
        return cls(length, length)

    @classmethod
    def covering(cls, length: int, width: int, back_tokens: int, ahead_tokens: int) -> Band:
        """The band whose windows hold every key ``p`` of a query ``q`` with
        ``-back_tokens <= p - q <= ahead_tokens``; dense when ``width >= length``. A key at
        ``back_tokens`` before a query of block ``i`` lies at most ``ceil(back_tokens / width)``
        blocks back (and likewise ahead)."""
        if width >= length:
            return cls.dense(length)
        return cls(length, width, -(-back_tokens // width), -(-ahead_tokens // width))

    @property
    def is_dense(self) -> bool:
        return self.num_blocks == 1

    @property
    def window(self) -> int:
        """Keys per query block: ``(back + 1 + ahead) * width``."""
        return (self.back + 1 + self.ahead) * self.width

    def blocks(self, x: Array) -> Array:
        """``[B, L, ...] -> [B * blocks, width, ...]``."""
        return x.reshape((-1, self.width) + x.shape[2:])

    def unblock(self, x: Array) -> Array:
        """``[B * blocks, width, ...] -> [B, L, ...]``."""
        return x.reshape((-1, self.length) + x.shape[2:])

    def windows(self, x: Array) -> Array:
        """Block rows ``[B * blocks, width, ...]`` -> each block's window ``[B * blocks,
        window, ...]``: the blocks ``i - back .. i + ahead`` of its row in order, zeros (ids:
        padding) outside the row. Static slices and one concatenation; no gather."""
        if self.back == self.ahead == 0:
            return x
        nb = self.num_blocks
        rows = x.reshape((-1, nb) + x.shape[1:])  # [B, nb, W, ...]
        pad = [(0, 0), (self.back, self.ahead)] + [(0, 0)] * (rows.ndim - 2)
        padded = jnp.pad(rows, pad)
        parts = [padded[:, o : o + nb] for o in range(self.back + 1 + self.ahead)]
        return jnp.concatenate(parts, axis=2).reshape((-1, self.window) + x.shape[2:])
