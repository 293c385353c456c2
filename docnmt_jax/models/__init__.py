"""Models, one module per paper, and the registry that builds them from a config.

A *task* adapts a model to the training loop: ``init(rng, batch)`` returns initial variables
(parameters boxed with their logical axis names) and ``logits(params, batch, dropout_rng,
train)`` returns ``(logits, targets, target_mask)`` for the loss. Models: ``transformer``
(sentence Transformer), ``final`` (FINAL and the Table 3 rows), ``doc2doc`` (concatenation
baseline, ``concat.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from docnmt_jax.models import concat, final, transformer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dataclass_from_mapping(cls: type, values: Mapping[str, Any], where: str) -> Any:
    """Builds frozen config ``cls`` from ``values``, naming unknown keys and dtype strings."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields - {"name"})
    if unknown:
        raise ValueError(
            f"{where}: unknown keys {unknown} for {cls.__name__}; known: {sorted(fields)}"
        )
    kwargs = {k: v for k, v in values.items() if k in fields}
    for key in ("dtype", "param_dtype"):
        if isinstance(kwargs.get(key), str):
            if kwargs[key] not in DTYPES:
                raise ValueError(f"{where}.{key}: {kwargs[key]!r} is not one of {sorted(DTYPES)}")
            kwargs[key] = DTYPES[kwargs[key]]
    return cls(**kwargs)


def build_task(model_config: Mapping[str, Any], vocab_size: int) -> Any:
    """The task for ``model_config['name']`` with the tokenizer's vocabulary size."""
    values = dict(model_config)
    name = values.get("name", "transformer")
    values["vocab_size"] = vocab_size
    if name == "transformer":
        cfg = dataclass_from_mapping(transformer.TransformerConfig, values, "config.model")
        return transformer.SentenceTransformerTask(cfg)
    if name == "final":
        return final.FinalTask(dataclass_from_mapping(final.FinalConfig, values, "config.model"))
    if name == "doc2doc":
        cfg = dataclass_from_mapping(concat.Doc2DocConfig, values, "config.model")
        return concat.Doc2DocTask(cfg)
    raise ValueError(
        f"config.model.name: unknown model {name!r}; known: ['doc2doc', 'final', 'transformer']"
    )
