"""Learning algorithms as objectives of their own, chosen by ``config.objective.name``.

An :class:`~docnmt_jax.objectives.base.Objective` wraps a model's ``loss`` (e.g. adds a second
forward pass with random context and a margin term, Jean & Cho 2019) and is checked against
the model when the run is built. The trainer calls only ``objective.loss``. Registered here:
``maximum_likelihood`` (the model's own loss, the default), ``context_margin`` (Jean & Cho
2019's multi-level context-aware margin regulariser, :mod:`~docnmt_jax.objectives.context_margin`),
``random_context`` (maximum likelihood with other documents' context, Table 1 row (b),
:mod:`~docnmt_jax.objectives.random_context`), ``coword`` (Fernandes et al. 2021's
context-aware word dropout on the current source, :mod:`~docnmt_jax.objectives.coword`).
"""

from docnmt_jax.objectives import (  # noqa: F401  (registration)
    context_margin,
    coword,
    maximum_likelihood,
    random_context,
)
from docnmt_jax.objectives.base import (
    Objective,
    ObjectiveError,
    build_objective,
    option_sections,
    register_objective,
    registered_objectives,
)

__all__ = [
    "Objective",
    "ObjectiveError",
    "build_objective",
    "option_sections",
    "register_objective",
    "registered_objectives",
]
