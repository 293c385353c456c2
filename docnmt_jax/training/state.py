"""The train state ``{step, params, opt_state}`` on a device mesh.

Its shardings come from the models' logical axis names (``jax.eval_shape`` of the init, so
nothing is computed), and it is initialised directly into them by a jitted init with those
``out_shardings``: no device ever holds the whole state unless the mesh says so.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from docnmt_jax import parallel
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.parallel import Layout
from docnmt_jax.training import optim

PyTree = Any


def build_optimizer_state(
    model: Any, config: Any, layout: Layout, note: Any = print
) -> tuple[PyTree, PyTree, optax.GradientTransformation, optax.Schedule]:
    """The optimiser of ``config.train`` for ``model`` (``train.freeze``, ``unfreeze_at_step``
    and ``schedule_offset`` applied, the counts of trainable and frozen parameters reported
    through ``note``), the train state's shardings and its abstract form: ``(shardings,
    abstract, tx, schedule)``."""
    tcfg = config.train
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch())["params"]
    labels = optim.freeze_labels(nn.meta.unbox(boxed), tcfg.get("freeze", ()))
    counts = optim.count_by_label(nn.meta.unbox(boxed), labels)
    unfreeze_at = int(tcfg.get("unfreeze_at_step", 0))
    note(
        f"parameters: {counts[optim.TRAINABLE]:,} trainable, {counts[optim.FROZEN]:,} frozen"
        + (f" (train.freeze={tcfg.freeze!r})" if counts[optim.FROZEN] else "")
        + (
            f", released at step {unfreeze_at} with fresh Adam moments"
            if unfreeze_at and counts[optim.FROZEN]
            else ""
        )
    )
    tx, schedule = optim.make_optimizer(
        config.model.d_model,
        tcfg.warmup_steps,
        tcfg.lr_scale,
        clip_norm=tcfg.clip_norm or None,
        labels=labels,
        unfreeze_at_step=unfreeze_at,
        schedule_offset=int(tcfg.get("schedule_offset", 0)),
    )
    shardings = state_shardings(model, tx, layout)
    return shardings, abstract_state(model, tx, shardings), tx, schedule


def state_shardings(model: Any, tx: optax.GradientTransformation, layout: Layout) -> PyTree:
    """Shardings of the train state: parameters by their logical axes, the optimiser state
    like the parameters it mirrors, the step replicated."""
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch())["params"]
    params = layout.param_shardings(boxed)
    opt_state = jax.eval_shape(tx.init, nn.meta.unbox(boxed))
    return {
        "step": layout.replicated,
        "params": params,
        "opt_state": layout.opt_state_shardings(tx, opt_state, params),
    }


def abstract_state(model: Any, tx: optax.GradientTransformation, shardings: PyTree) -> PyTree:
    """``jax.ShapeDtypeStruct`` leaves of the train state with ``shardings`` (restore target)."""

    def init() -> PyTree:
        return _fresh(tx, nn.meta.unbox(model.init(jax.random.PRNGKey(0), dummy_batch())["params"]))

    return parallel.abstract(jax.eval_shape(init), shardings)


def _fresh(tx: optax.GradientTransformation, params: PyTree) -> PyTree:
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}


def init_state(
    model: Any,
    tx: optax.GradientTransformation,
    shardings: PyTree,
    seed: int,
    params: PyTree | None = None,
) -> PyTree:
    """The initial train state, computed straight into ``shardings``: fresh parameters from
    ``seed``, or the given host ``params`` (``init_from``) with a fresh optimiser state."""
    if params is not None:
        params = put(params, shardings["params"])
        return jax.jit(lambda p: _fresh(tx, p), out_shardings=shardings)(params)

    def init() -> PyTree:  # the parameters do not depend on the batch's values or size
        variables = model.init(jax.random.PRNGKey(seed), dummy_batch())
        return _fresh(tx, nn.meta.unbox(variables["params"]))

    return jax.jit(init, out_shardings=shardings)()


def put(tree: PyTree, shardings: PyTree) -> PyTree:
    """``tree`` as global arrays with ``shardings``; host arrays must be equal on all processes."""

    def place(x: Any, sharding: jax.sharding.Sharding) -> jax.Array:
        if isinstance(x, jax.Array):
            return jax.device_put(x, sharding)
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree_util.tree_map(place, tree, shardings)
