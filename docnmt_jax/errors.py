"""The user-error hierarchy: what the command-line tools report as one line and exit 2.

Every mistake a user can make -- a malformed input file, a bad flag or config key, a workdir,
checkpoint or tokenizer that is not there, a vocabulary that does not fit a checkpoint, an empty
input, an output that cannot be written -- raises a subclass of :class:`UserError` whose message
is one line naming the file and line (``FILE:LINE: reason``) or the flag/field. The launch
scripts' error boundary (:mod:`docnmt_jax.cli`) prints ``PROG: error: MESSAGE`` and exits with
status 2; any other exception is a bug and keeps its traceback.

The library's specific errors (``ModelError``, ``CorpusFormatError``, ``DataConfigError``,
``PackingError``, ...) subclass :class:`UserError` and also their historical built-in base
(``ValueError``, ``FileNotFoundError``), so code that caught those still does.
"""

from __future__ import annotations


class UserError(Exception):
    """A user's mistake; the message is one line naming the file/line or flag/field."""


class RunNotFoundError(UserError, FileNotFoundError):
    """A workdir, checkpoint step, tokenizer or input file the user named is not there."""


class TextTooLongError(UserError, ValueError):
    """A sentence is longer than the model can take and the run was told not to cut it."""


class VocabularyMismatchError(UserError, ValueError):
    """A tokenizer's vocabulary does not fit the checkpoint it is used with."""


class ConfigError(UserError, ValueError):
    """A config key holds a value that cannot work (the message names ``config.KEY``)."""


class InputMismatchError(UserError, ValueError):
    """Inputs that do not fit together or hold nothing (hypotheses vs references, an empty
    list, a chunk or option the input does not have)."""


class ModelError(UserError, ValueError):
    """A user's mistake in the model configuration or its use (one-line message)."""


class CapabilityError(ModelError, TypeError):
    """A model was asked for something it does not implement (a capability of
    :mod:`docnmt_jax.models.contract`, e.g. translating a model without search); the message
    names the model, what was asked and the members it lacks."""
