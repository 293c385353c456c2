"""What the benchmarks compare: the models at a size and dtype, and their shared batch.

Batches are synthetic and fully real (seeded random tokens, no padding): ``chunks`` chunks of
``sentences`` sentences of ``length`` tokens. Document models get the chunks, the sentence
Transformer the same sentences as rows, so every model learns the same target tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from docnmt_jax import sizes
from docnmt_jax.errors import UserError

Results = dict[str, Any]


class UsageError(UserError, ValueError):
    """A benchmark option names something that is not there (one line, no traceback)."""


#: ``--size``: the presets of :mod:`docnmt_jax.sizes` and a tiny one for tests (encoder and
#: decoder layers alike: ``layers``).
SIZES = {
    "tiny": {"d_model": 32, "num_heads": 2, "ffn_dim": 64, "layers": 1},
    **{
        name: {
            "d_model": preset["d_model"],
            "num_heads": preset["num_heads"],
            "ffn_dim": preset["ffn_dim"],
            "layers": preset["num_encoder_layers"],
        }
        for name, preset in sizes.PRESETS.items()
    },
}


def model_names(args: argparse.Namespace) -> list[str]:
    """``--models``, or every registered model with a FLOP counter, the sentence Transformer
    (the baseline of every ratio) first."""
    if args.models != "auto":
        return args.models.split(",")
    from docnmt_jax.models import registered

    names = [name for name, entry in registered().items() if entry.flops is not None]
    return sorted(names, key=lambda name: (name != "transformer", name))


def build(name: str, args: argparse.Namespace, sentences: int) -> Any:
    """Model ``name`` at ``--size``/``--dtype`` (label smoothing 0.1), fit for chunks of
    ``sentences`` (a segment table of at least that many rows, where the model has one);
    ``NAME:SWITCH`` turns a boolean switch of the model's config on (``final:recurrent``),
    ``NAME:FIELD=VALUE`` sets a field (``final:packed_layout=two_layout``; ``true``/``false``
    and numbers are read as such), several joined by ``+``
    (``final:packed_layout=two_layout+packed_chunk_spans=2``)."""
    from docnmt_jax.models import build_model
    from docnmt_jax.models.base import registration

    name, _, switch = name.partition(":")

    size = SIZES[args.size]
    sizes = {
        "d_model": size["d_model"],
        "embed_dim": size["d_model"],
        "num_heads": size["num_heads"],
        "ffn_dim": size["ffn_dim"],
        "num_encoder_layers": size["layers"],
        "num_decoder_layers": size["layers"],
        "num_layers": size["layers"],
        "dtype": args.dtype,
    }
    known = {f.name for f in dataclasses.fields(registration(name).config_class)}
    config = {"name": name, **{key: value for key, value in sizes.items() if key in known}}
    for part in switch.split("+") if switch else ():
        field, has_value, value = part.partition("=")
        if field not in known:
            raise UsageError(f"--models {name}:{switch}: {name} has no field {field!r}")
        config[field] = field_value(value) if has_value else True
    model = build_model(config, args.vocab, label_smoothing=0.1)
    fields = {f.name for f in dataclasses.fields(model.config)}
    if "max_segments" in fields and model.config.max_segments < sentences:
        config = dataclasses.replace(model.config, max_segments=sentences)
        model = type(model)(config, label_smoothing=0.1)
    return model


def field_value(text: str) -> Any:
    """A ``--models NAME:FIELD=VALUE`` value: a bool, int or float where it reads as one."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def make_batch(
    args: argparse.Namespace, chunks: int, sentences: int, length: int, context_sentences: int = 0
) -> Results:
    """The shared synthetic batch: ``[chunks, sentences, length]``, seeded, no padding; with
    ``context_sentences = K > 0`` (a model's context window, DocT) also ``context_src``: ``K``
    full sentences before every chunk, so every sentence has a whole context."""
    import numpy as np

    from docnmt_jax.data.schema import dummy_batch

    batch = dummy_batch(sentences, length, rows=chunks, vocab_size=args.vocab)
    if context_sentences:
        rng = np.random.default_rng(1)
        shape = (chunks, context_sentences, length)
        batch["context_src"] = rng.integers(4, args.vocab, shape).astype(np.int32)
        batch["context_src_mask"] = np.ones(shape, np.int32)
    return batch


def analytic_train_flops(task: Any, batch: Results) -> tuple[int | None, dict[str, int]]:
    """flops.py's count for one train step on ``batch`` and its forward terms (None if the
    model has no analytic count)."""
    from docnmt_jax import flops

    if not flops.supported(task):
        return None, {}
    B, S, T = batch["tgt"].shape
    shape = flops.BatchShape(B, S, batch["src"].shape[-1], T)
    return flops.train_flops(task, shape), flops.forward_terms(task, shape)


def add_ratios(runs: list[Results], key: str, group: str | None = None) -> str:
    """Adds ``{key}_ratio`` (run / baseline) to every run; the baseline is the sentence
    Transformer if present, else the first model (per ``group`` value when given)."""
    names = [r["model"] for r in runs]
    baseline = "transformer" if "transformer" in names else names[0]
    for r in runs:
        base = next(
            b for b in runs if b["model"] == baseline and (group is None or b[group] == r[group])
        )
        r[f"{key}_ratio"] = r[key] / base[key]
    return baseline
