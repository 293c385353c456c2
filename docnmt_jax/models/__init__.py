"""Models, one module per paper, behind one interface (:mod:`.base`), built by name.

Importing this package registers the models it ships: ``transformer`` (sentence Transformer,
``transformer.py``), ``final`` (FINAL and the Table 3 rows, ``final.py``, its layers in
``final_layers.py``, the Transformer-XL pieces in ``xl.py``), ``doc2doc`` (concatenation
baseline, ``concat.py``), ``doct`` (DocT of Zhang et al. 2018, ``doct.py``), ``hmgdc`` (HM-GDC
of Tan et al. 2019, ``hmgdc.py``), ``rnnsearch`` and ``rnnsearch_hmgdc`` (RNNSearch and HM-GDC
in its encoder, Tan et al. 2019 Table 1, ``rnnsearch.py`` and ``hmgdc_rnn.py``, the recurrent
blocks in ``rnn_layers.py``), ``jean_cho`` (the larger-context Transformer of Jean & Cho 2019,
``jean_cho.py``; it and DocT share the window-context base of ``window.py``). Random contexts
for every model are ``context_rotation.py``.
A new model is one module with a ``@register("name", config=..., flops=...)`` class that
implements the capabilities of the model contract it needs (:mod:`.contract`); nothing else in
the package changes (docs/design.md, "Adding a model").
"""

from docnmt_jax.models import (  # noqa: F401
    concat,
    doct,
    final,
    hmgdc,
    hmgdc_rnn,
    jean_cho,
    rnnsearch,
    transformer,
)
from docnmt_jax.models.base import (
    BaseModel,
    BatchLayout,
    Metric,
    Model,
    ModelError,
    build_model,
    register,
    registered,
)
from docnmt_jax.models.contract import (
    Core,
    FlopCounting,
    PackedTraining,
    PretrainMapping,
    RandomContext,
    Scoring,
    Searchable,
    SentenceAttention,
    SlotSearch,
    Trainable,
)

__all__ = [
    "BaseModel",
    "BatchLayout",
    "Core",
    "FlopCounting",
    "Metric",
    "Model",
    "ModelError",
    "PackedTraining",
    "PretrainMapping",
    "RandomContext",
    "Scoring",
    "Searchable",
    "SentenceAttention",
    "SlotSearch",
    "Trainable",
    "build_model",
    "register",
    "registered",
]
