"""The recurrent building blocks of RNNSearch (Bahdanau et al. 2015, as OpenNMT builds it),
shared by ``rnnsearch`` (:mod:`.rnnsearch`, whose docstring gives the equations) and
``rnnsearch_hmgdc`` (:mod:`.hmgdc_rnn`): ``U(-0.1, 0.1)`` initialisation, linear maps, the GRU
cell and its masked scan (PyTorch's gates ``[r | z | n]``), the bidirectional encoder layer,
additive ("mlp") attention, the attentional output and one input-feeding decoder step; and
the hyper-parameters they read (:class:`RNNSearchConfig`, re-exported by :mod:`.rnnsearch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax.models import layers

Array = jax.Array
Cache = dict[str, Any]
Weights = dict[str, Any]


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


def uniform_init(scale: float) -> layers.Initializer:
    """``U(-scale, scale)`` (OpenNMT-py's ``param_init``)."""

    def init(key: Array, shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
        return jax.random.uniform(key, shape, dtype, -scale, scale)

    return init


INIT = uniform_init(0.1)


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
