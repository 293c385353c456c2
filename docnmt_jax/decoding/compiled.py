"""The compiled search of a model: the one ``(params, batch) -> (ids, aux)`` a Translator, the
benchmarks and the exports run, chosen by the model's declared capabilities
(:mod:`docnmt_jax.models.contract`): a carried state across chunks (document streams, one
chunk of every stream a call), a slot-by-slot search, or the model's pure ``translate`` (also
for a slot-by-slot model that searches every slot in one call).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import jax

from docnmt_jax import parallel
from docnmt_jax.decoding.search import (
    PyTree,
    SearchConfig,
    TranslateFn,
    loop_slots,
    stream_translate,
)
from docnmt_jax.models import contract


def compile_translate(
    model: Any,
    search: SearchConfig,
    mesh: parallel.Layout | None = None,
    carried: dict[str, PyTree] | None = None,
) -> TranslateFn:
    """The compiled ``(params, batch) -> (ids [B, S, L], aux)`` of ``model``: its pure
    ``translate`` under one ``jax.jit``, or for slot-by-slot models (``model.layout``) a loop
    of jitted slot searches, unless the model searches every slot in one call
    (:class:`~docnmt_jax.models.contract.OneCallSearch`). With a ``mesh`` the host batch is
    placed with its rows split over ``data x fsdp`` (every process holds the same batch), the
    models' activation constraints are active, and the outputs come back replicated; the
    parameters must already carry their shardings."""
    active = mesh.activate if mesh is not None else contextlib.nullcontext

    def jit(fn: Callable[..., Any], out: bool = False, **kwargs: Any) -> Callable[..., Any]:
        def body(*args: Any) -> Any:
            with active():
                return fn(*args)

        if out and mesh is not None:
            kwargs["out_shardings"] = mesh.replicated
        return jax.jit(body, **kwargs)

    if contract.carries_state(model):  # context across chunks: document streams
        translate = stream_translate(model, search, jit, {} if carried is None else carried)
    elif model.layout.sequential and not contract.searches_in_one_call(model, search):
        translate = loop_slots(model, search, jit)
    else:
        translate = jit(functools.partial(model.translate, search=search), out=True)
    if mesh is None:
        return translate
    return lambda params, batch: translate(params, parallel.replicated_batch(batch, mesh.batch))
