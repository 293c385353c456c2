"""The sentence Transformer as a CTranslate2 model (``docnmt-export --format ctranslate2``).

CTranslate2 (the OpenNMT inference engine, pip ``ctranslate2``, an optional extra of this
package) reads a model directory it writes itself from a *specification*: the layers of
``ctranslate2.specs.TransformerSpec`` with their weights set by a converter. Ours,
:class:`TransformerConverter`, fills that spec from a run's parameters, as CTranslate2's own
converters (Marian, OpenNMT) do from theirs; ``Converter.convert`` validates it, quantizes it
(``--quantization``) and writes ``model.bin``, ``config.json`` and the vocabulary.

What maps onto what (``docs/export.md``):

* the one embedding matrix (scaled by ``sqrt(d_model)``) is the source embedding, the target
  embedding and the output projection: CTranslate2 stores it once (its spec aliases equal
  weights);
* positions are sinusoidal, ``[sin | cos]`` halves (:func:`~docnmt_jax.models.layers.
  sinusoidal_encoding`), written as a table of :data:`MAX_POSITIONS` rows (CTranslate2's own
  sinusoids use another frequency spacing);
* pre-LN (``model.pre_ln``) is the spec's ``pre_norm`` with the encoder's and decoder's final
  norms; post-LN has none; layer norm epsilon 1e-6 as ours;
* attention projections ``[D, H, D/H]`` become ``[D, D]`` matrices (heads contiguous), the
  self-attention's query, key and value fused into one;
* the vocabulary is the tokenizer's pieces in our ids (PAD 0, EOS 1 ``</s>``, BOS 2 ``<s>``,
  UNK 3), the source gets EOS appended (``add_source_eos``) and the decoder starts from BOS.

Document models keep state across sentences (context encoders, FINAL's memory) that the
spec cannot hold: :func:`check_convertible` refuses them in one line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from docnmt_jax import __version__
from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.errors import ModelError, UserError
from docnmt_jax.export import release

#: Quantizations ``--quantization`` offers (CTranslate2's names); none: float32 weights.
QUANTIZATIONS = ("int8", "int8_float32", "float16")
#: Rows of the position table: the longest source (EOS included) or output the model takes.
MAX_POSITIONS = 1024
#: Our metadata beside CTranslate2's files: what was converted and how to search like us.
METADATA_FILE = "docnmt_export.json"
TOKENIZER_FILE = "spm.model"
FORMAT = "docnmt_jax-ctranslate2"
FORMAT_VERSION = 1
CONVERTIBLE_MODELS = ("transformer",)
#: Files an export directory may hold (a leftover staging directory of only these is cleared).
_EXPORT_FILES = {
    "model.bin",
    "config.json",
    "shared_vocabulary.json",
    "source_vocabulary.json",
    "target_vocabulary.json",
    TOKENIZER_FILE,
    METADATA_FILE,
}


def import_ctranslate2() -> Any:
    """The ``ctranslate2`` module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError(
            "--format ctranslate2 needs the ctranslate2 package: pip install -e .[ctranslate2] "
            "(or pip install ctranslate2)"
        ) from None
    return ctranslate2


def check_convertible(model: Any) -> None:
    """Only the sentence Transformer fits CTranslate2's TransformerSpec; another model is a
    one-line :class:`ModelError`."""
    name = getattr(model, "name", type(model).__name__)
    if name not in CONVERTIBLE_MODELS:
        raise ModelError(
            f"--format ctranslate2 converts the sentence Transformer only; this run's model is "
            f"{name!r}, whose document context CTranslate2's TransformerSpec cannot express"
        )


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The pieces of every id, in id order; two ids with one piece is a one-line error (the
    engine looks tokens up by piece)."""
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    seen: set[str] = set()
    for piece in pieces:
        if piece in seen:
            raise UserError(f"{tokenizer.model_path}: the piece {piece!r} has two ids")
        seen.add(piece)
    return pieces


def position_table(num_positions: int, d_model: int) -> np.ndarray:
    """Our sinusoidal encodings of positions ``0 .. num_positions - 1``: ``[P, D]`` float32."""
    from docnmt_jax.models import layers

    positions = np.arange(num_positions, dtype=np.int32)
    return np.asarray(layers.sinusoidal_encoding(positions, d_model), np.float32)


def _matrix(x: np.ndarray, inputs: int) -> np.ndarray:
    """A kernel of ``inputs`` leading input features (``[D, H, d]``, ``[D, F]``; or
    ``[H, d, D]`` with ``inputs=2``) as CTranslate2's ``[out, in]`` float32 matrix."""
    rows = int(np.prod(x.shape[:inputs]))
    return np.ascontiguousarray(np.asarray(x, np.float32).reshape(rows, -1).T)


def _vector(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32).reshape(-1))


class _Weights:
    """The run's flat parameters (:func:`~docnmt_jax.export.release.flatten_params`) read by
    path, each read once (an unread one is a bug: :meth:`check_all_read`)."""

    def __init__(self, flat: Mapping[str, np.ndarray]):
        self.flat = flat
        self.read: set[str] = set()

    def __call__(self, path: str) -> np.ndarray:
        self.read.add(path)
        return self.flat[path]

    def linear(self, spec: Any, scope: str, out: bool = False) -> None:
        """``spec.weight``/``bias`` from ``scope/kernel`` and ``scope/bias`` (``out``: an
        attention output ``[H, d, D]``)."""
        spec.weight = _matrix(self(f"{scope}/kernel"), 2 if out else 1)
        spec.bias = _vector(self(f"{scope}/bias"))

    def norm(self, spec: Any, scope: str) -> None:
        spec.gamma = _vector(self(f"{scope}/scale"))
        spec.beta = _vector(self(f"{scope}/bias"))

    def fused(self, spec: Any, scopes: Sequence[str]) -> None:
        """One linear of several projections' outputs stacked (query, key, value)."""
        spec.weight = np.concatenate([_matrix(self(f"{s}/kernel"), 1) for s in scopes])
        spec.bias = np.concatenate([_vector(self(f"{s}/bias")) for s in scopes])

    def check_all_read(self) -> None:
        unread = sorted(set(self.flat) - self.read)
        if unread:
            raise ValueError(f"parameters the CTranslate2 spec has no place for: {unread[:5]}")


def _attention(weights: _Weights, spec: Any, scope: str, norm: str, self_attention: bool) -> None:
    """A self- or cross-attention sublayer: its norm, projections and output."""
    weights.norm(spec.layer_norm, f"{norm}/norm")
    qkv = [f"{scope}/{name}" for name in ("query", "key", "value")]
    if self_attention:
        weights.fused(spec.linear[0], qkv)
    else:
        weights.linear(spec.linear[0], qkv[0])
        weights.fused(spec.linear[1], qkv[1:])
    weights.linear(spec.linear[-1], f"{scope}/out", out=True)


def _ffn(weights: _Weights, spec: Any, scope: str) -> None:
    weights.norm(spec.layer_norm, f"{scope}/ffn_block/norm")
    weights.linear(spec.linear_0, f"{scope}/ffn/wi")
    weights.linear(spec.linear_1, f"{scope}/ffn/wo")


def transformer_spec(
    config: Any, flat: Mapping[str, np.ndarray], pieces: Sequence[str], num_positions: int
) -> Any:
    """The ``TransformerSpec`` of a sentence Transformer of ``config``
    (:class:`~docnmt_jax.models.transformer.TransformerConfig`) with parameters ``flat``, its
    vocabulary ``pieces`` and a position table of ``num_positions`` rows."""
    from ctranslate2.specs import transformer_spec as ts

    spec = ts.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers),
        config.num_heads,
        pre_norm=config.pre_ln,
    )
    weights = _Weights(flat)
    embedding = np.ascontiguousarray(np.asarray(weights("embed/embedding"), np.float32))
    positions = position_table(num_positions, config.d_model)
    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = embedding
    decoder.embeddings.weight = embedding
    decoder.projection.weight = embedding  # tied output logits h E^T, no bias
    encoder.position_encodings.encodings = positions
    decoder.position_encodings.encodings = positions
    encoder.scale_embeddings = decoder.scale_embeddings = True  # sqrt(d_model)
    if config.pre_ln:
        weights.norm(encoder.layer_norm, "encoder_norm")
        weights.norm(decoder.layer_norm, "decoder_norm")
    for i, layer in enumerate(encoder.layer):
        scope = f"encoder_layers_{i}"
        _attention(
            weights,
            layer.self_attention,
            f"{scope}/self_attention",
            f"{scope}/attention_block",
            self_attention=True,
        )
        _ffn(weights, layer.ffn, scope)
    for i, layer in enumerate(decoder.layer):
        scope = f"decoder_layers_{i}"
        _attention(
            weights,
            layer.self_attention,
            f"{scope}/self_attention",
            f"{scope}/self_attention_block",
            self_attention=True,
        )
        _attention(
            weights,
            layer.attention,
            f"{scope}/cross_attention",
            f"{scope}/cross_attention_block",
            self_attention=False,
        )
        _ffn(weights, layer.ffn, scope)
    weights.check_all_read()
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    spec.config.unk_token, spec.config.bos_token = pieces[UNK_ID], pieces[BOS_ID]
    spec.config.eos_token, spec.config.decoder_start_token = pieces[EOS_ID], pieces[BOS_ID]
    spec.config.add_source_eos = True  # our source is its pieces, then EOS
    spec.config.layer_norm_epsilon = 1e-6
    return spec


def converter(
    config: Any, flat: Mapping[str, np.ndarray], tokenizer: Tokenizer, num_positions: int
) -> Any:
    """A ``ctranslate2.converters.Converter`` of the sentence Transformer (``config``,
    parameters ``flat``, ``tokenizer``): ``.convert(out_dir, quantization=...)`` writes it."""
    ctranslate2 = import_ctranslate2()

    class TransformerConverter(ctranslate2.converters.Converter):
        """docnmt_jax's sentence Transformer -> ``TransformerSpec``."""

        def _load(self) -> Any:
            spec = transformer_spec(config, flat, vocabulary(tokenizer), num_positions)
            spec.register_file(tokenizer.model_path, TOKENIZER_FILE)
            return spec

    return TransformerConverter()


def search_options(search: SearchConfig, pieces: Sequence[str]) -> dict[str, Any]:
    """``Translator.translate_batch`` options under which CTranslate2 searches as our
    ``search`` does, besides ``max_decoding_length`` (:func:`decoding_length`): EOS allowed
    from the first step, PAD and BOS (``pieces``' ids 0 and 2) never generated, no input
    truncation, the length penalty exponent (the same ranking at ``alpha = 0`` only: ours
    divides by GNMT's ``((5 + len) / 6) ** alpha``, CTranslate2 by ``len ** alpha``)."""
    return {
        "beam_size": search.beam_size,
        "length_penalty": search.alpha,
        "min_decoding_length": 0,
        "max_input_length": 0,
        "suppress_sequences": [[pieces[PAD_ID]], [pieces[BOS_ID]]],
    }


def decoding_length(limit: int) -> int:
    """CTranslate2's ``max_decoding_length`` for our output limit ``limit`` (EOS included):
    at the limit we force EOS as the last token, CTranslate2 stops after ``limit - 1``
    tokens without one; the tokens before it are the same."""
    return max(int(limit) - 1, 1)


# ------------------------------------------------------------------------- the export command


def check_target(out: str, workdir: str, overwrite: bool) -> None:
    """:func:`~docnmt_jax.export.release.check_target` for a CTranslate2 export (its
    ``docnmt_export.json`` marks an earlier one, which ``--overwrite`` may replace)."""
    release.check_target(out, workdir, overwrite, METADATA_FILE, "a CTranslate2 export")


def _staging_dir(out: str) -> str:
    """A fresh, empty ``OUT.tmp`` (a killed export's leftover of export files is removed)."""
    tmp = os.path.abspath(out) + ".tmp"
    if os.path.lexists(tmp):
        names = set(os.listdir(tmp)) if os.path.isdir(tmp) else {"?"}
        if not names <= _EXPORT_FILES:
            raise UserError(f"{tmp} exists and is not a partial export: move it away")
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    return tmp


def check_arguments(args: argparse.Namespace) -> None:
    """The flags ``--format ctranslate2`` cannot combine with, and ctranslate2 installed."""
    if args.stablehlo:
        raise UserError("--stablehlo writes a release; --format ctranslate2 cannot add it")
    import_ctranslate2()


def write_export(args: argparse.Namespace, staging: str) -> dict[str, Any]:
    """Converts the run ``args.workdir`` (``args.checkpoint``, ``args.params``) into the
    CTranslate2 model directory ``staging`` (``args.quantization``); returns the metadata it
    writes to :data:`METADATA_FILE`."""
    from docnmt_jax.training import restore

    model, tokenizer, _ = restore.load_model(args.workdir)
    check_convertible(model)  # before the parameters load
    step, parameter_set = restore.selected_parameters(args.workdir, args.checkpoint, args.params)
    params, _ = restore.load_params(
        model, args.workdir, args.checkpoint, tokenizer.model_path, args.params
    )
    flat = release.flatten_params(params)
    converter(model.config, flat, tokenizer, MAX_POSITIONS).convert(
        staging, quantization=args.quantization, force=True
    )
    search = SearchConfig(beam_size=1, alpha=0.0)  # our greedy search, token for token
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model.name,
        "pre_ln": bool(model.config.pre_ln),
        "source_workdir": os.path.abspath(args.workdir),
        "source_step": step,
        "checkpoint": args.checkpoint,
        "parameter_set": parameter_set,
        "parameter_count": int(sum(x.size for x in flat.values())),
        "quantization": args.quantization or "float32",
        "vocab_size": tokenizer.vocab_size,
        "max_positions": MAX_POSITIONS,
        "tokenizer": TOKENIZER_FILE,
        "output_limit": {"max_len": search.max_len, "len_a": search.len_a, "len_b": search.len_b},
        "translate_batch_as_our_greedy": {
            **search_options(search, vocabulary(tokenizer)),
            "max_decoding_length": "output limit - 1 (the limit counts our forced EOS)",
        },
        "ctranslate2_version": import_ctranslate2().__version__,
        "docnmt_jax_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    with open(os.path.join(staging, METADATA_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(metadata, indent=2) + "\n")
    return metadata


def export(args: argparse.Namespace) -> int:
    """``docnmt-export --format ctranslate2``: the run's CTranslate2 model directory at
    ``args.out``, written to ``OUT.tmp`` and renamed when complete."""
    check_arguments(args)
    check_target(args.out, args.workdir, args.overwrite)
    staging = _staging_dir(args.out)
    try:
        metadata = write_export(args, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    release.commit(staging, args.out)
    size = release.directory_bytes(args.out)
    print(
        f"wrote {args.out}: CTranslate2 {metadata['model']} step {metadata['source_step']}, "
        f"{metadata['parameter_set']} parameters ({metadata['parameter_count']:,}), "
        f"{metadata['quantization']} weights; {size / 1e6:.2f} MB"
    )
    return 0
