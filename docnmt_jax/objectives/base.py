"""The objective interface and its registry.

``Objective(model, options)``: ``check(model)`` raises :class:`ObjectiveError` (one line) when
the objective cannot train that model (e.g. a context objective on a sentence model);
``loss(params, batch, rng, train) -> (loss, metrics)`` is what the trainer differentiates and
logs, with the model's metric convention (:class:`~docnmt_jax.models.base.Metric`).
``options`` come from ``config.objective.<name>`` (a section per objective with its
defaults, written out in ``configs/transformer.py`` and equal to :func:`option_sections`, so
that ``--config.objective.context_margin.alpha_data=2`` works on the command line) and from
plain keys of ``config.objective`` itself (in Python); each objective declares its own in a
frozen dataclass ``options_class`` so that an unknown key is an error naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax

from docnmt_jax.models import contract
from docnmt_jax.models.base import Metrics, Model, ModelError

Array = jax.Array
PyTree = Any


class ObjectiveError(ModelError):
    """A user's mistake in ``config.objective`` (one-line message)."""


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """An objective without options."""


class Objective:
    """Base objective: the model's own loss. Subclasses override :meth:`loss` (and
    :meth:`check`, :attr:`options_class`)."""

    name: ClassVar[str] = ""
    options_class: ClassVar[type] = NoOptions
    #: Whether the objective needs ``[B, S, T]`` grid batches (e.g. to give sentences other
    #: documents' context); the trainer then builds the grid instead of the model's packed rows.
    needs_grid: ClassVar[bool] = False

    #: Whether the objective can train a model that carries state across chunks (its loss is
    #: the model's own, :meth:`loss_with_carry`).
    carries_state: ClassVar[bool] = False

    def __init__(self, model: Model, options: Any = None):
        self.model = model
        self.options = options if options is not None else self.options_class()
        if contract.carries_state(model) and not self.carries_state:
            raise ObjectiveError(
                f"config.objective.name: objective {self.name!r} cannot train model "
                f"{getattr(model, 'name', model)!r}, which carries state across chunks "
                "(recurrent); use maximum_likelihood"
            )
        self.check(model)

    def check(self, model: Model) -> None:
        """Raises :class:`ObjectiveError` when this objective cannot train ``model``."""

    def loss(
        self, params: PyTree, batch: dict[str, Array], rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        return self.model.loss(params, batch, rng, train)

    def loss_with_carry(
        self,
        params: PyTree,
        batch: dict[str, Array],
        carry: PyTree,
        rng: Array | None,
        train: bool,
    ) -> tuple[Array, Metrics, PyTree]:
        """:meth:`loss` of a model trained on document streams, reading the ``carry`` the
        previous chunks left and returning the one this batch leaves; only an objective that
        is the model's own loss can (``carries_state`` objectives), the others raise
        :class:`ObjectiveError` when built for such a model."""
        return self.model.loss_with_carry(params, batch, carry, rng, train)


_OBJECTIVES: dict[str, type[Objective]] = {}


def register_objective(name: str) -> Callable[[type[Objective]], type[Objective]]:
    """Class decorator: makes the objective selectable as ``config.objective.name = name``."""

    def decorate(cls: type[Objective]) -> type[Objective]:
        old = _OBJECTIVES.get(name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ValueError(f"objective name {name!r} is already registered by {old}")
        cls.name = name
        _OBJECTIVES[name] = cls
        return cls

    return decorate


def registered_objectives() -> dict[str, type[Objective]]:
    return dict(_OBJECTIVES)


def option_sections() -> dict[str, dict[str, Any]]:
    """``{objective name: its options' defaults}`` for every registered objective with
    options: what the ``config.objective.<name>`` sections of the configs must hold."""
    sections = {}
    for name, cls in sorted(_OBJECTIVES.items()):
        defaults = dataclasses.asdict(cls.options_class())
        if defaults:
            sections[name] = defaults
    return sections


def build_objective(objective_config: Mapping[str, Any] | None, model: Model) -> Objective:
    """The objective ``objective_config['name']`` (default ``maximum_likelihood``) for
    ``model``; its options: the section ``objective_config[name]`` if present, updated with
    the other plain keys (every other section is ignored)."""
    values = dict(objective_config or {})
    name = values.pop("name", "maximum_likelihood")
    if name not in _OBJECTIVES:
        raise ObjectiveError(
            f"config.objective.name: unknown objective {name!r}; registered: {sorted(_OBJECTIVES)}"
        )
    # sections (dicts, ConfigDicts) hold objectives' options, registered in this process or not
    sections = {key: values.pop(key) for key in list(values) if hasattr(values[key], "items")}
    values = {**dict(sections.get(name) or {}), **values}
    cls = _OBJECTIVES[name]
    fields = {f.name for f in dataclasses.fields(cls.options_class)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ObjectiveError(
            f"config.objective: unknown keys {unknown} for objective {name!r}; known: "
            f"{sorted(fields)}"
        )
    return cls(model, cls.options_class(**values))
