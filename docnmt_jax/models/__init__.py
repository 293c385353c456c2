"""Models, one module per paper, behind one interface (:mod:`.base`), built by name.

Importing this package registers the models it ships: ``transformer`` (sentence Transformer,
``transformer.py``), ``final`` (FINAL and the Table 3 rows, ``final.py`` with the
Transformer-XL pieces in ``xl.py``), ``doc2doc`` (concatenation baseline, ``concat.py``),
``doct`` (DocT of Zhang et al. 2018, ``doct.py``).
A new model is one module with a ``@register("name", config=..., flops=...)`` class; nothing
else in the package changes (README, "Adding a model").
"""

from docnmt_jax.models import concat, doct, final, transformer  # noqa: F401  (registration)
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

__all__ = [
    "BaseModel",
    "BatchLayout",
    "Metric",
    "Model",
    "ModelError",
    "build_model",
    "register",
    "registered",
]
