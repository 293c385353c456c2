"""One error boundary for every launch script.

A user's mistake ends a command with one line on stderr, ``PROG: error: MESSAGE``, and exit
status 2; a bug keeps its traceback (and Python's status 1). A mistake is:

* a :class:`~docnmt_jax.errors.UserError` (malformed input ``FILE:LINE: reason``, a model or
  data config that cannot work, a missing workdir/checkpoint/tokenizer, a vocabulary that does
  not fit, an empty input, ...);
* a bad flag: unknown, malformed, missing, or ``--config.KEY`` naming no key of the config
  file (absl and argparse alike; :class:`ArgumentParser` is argparse with the one-line error);
* an ``OSError`` on a path the user gave: a command-line value, a path inside one (the
  workdir's files) or above one (an output directory that cannot be created), or a path
  registered with :func:`note_user_paths` (the config's data files). An ``OSError`` on any
  other path is a bug and keeps its traceback.

absl scripts call :func:`run` instead of ``app.run``; argparse scripts build their parser
with :class:`ArgumentParser` and call :func:`run_argparse`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from absl import app, flags

from docnmt_jax.errors import UserError

USER_ERROR_STATUS = 2
_user_paths: set[str] = set()


_prog: list[str] = []  # the running script's name, set by guarded()


def prog_name() -> str:
    """The launch script's file name (``train.py``), else ``sys.argv[0]``'s."""
    return _prog[-1] if _prog else os.path.basename(sys.argv[0]) or "docnmt_jax"


def one_line(text: str) -> str:
    """``text`` with its whitespace runs (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def fail(message: Any, prog: str | None = None) -> NoReturn:
    """Prints ``PROG: error: MESSAGE`` (one line) on stderr and exits with status 2."""
    sys.stdout.flush()
    print(f"{prog or prog_name()}: error: {one_line(message)}", file=sys.stderr)
    sys.exit(USER_ERROR_STATUS)


def note_user_paths(paths: Iterable[str | os.PathLike | None]) -> None:
    """Registers paths the user chose outside the command line (e.g. a config's data files):
    an ``OSError`` on them is the user's mistake."""
    _user_paths.update(os.path.abspath(os.fspath(p)) for p in paths if p)


def _argv_paths(argv: Sequence[str]) -> set[str]:
    """Every command-line token and every ``--flag=VALUE`` value (also without a ``:ARG``
    suffix, as in ``--config=FILE:ARG``), as absolute paths."""
    values: set[str] = set()
    for token in argv[1:]:
        for part in (token, token.partition("=")[2]):
            if part and not part.startswith("-"):
                values.update(os.path.abspath(p) for p in (part, part.partition(":")[0]) if p)
    return values


def _related(path: str, roots: Iterable[str]) -> bool:
    """``path`` is one of ``roots``, inside one, or a directory above one."""
    for root in roots:
        if path == root or path.startswith(root + os.sep) or root.startswith(path + os.sep):
            return True
    return False


def user_os_error(error: OSError, argv: Sequence[str] | None = None) -> str | None:
    """A one-line message if ``error`` concerns a path the user gave, else ``None``."""
    roots = _argv_paths(sys.argv if argv is None else argv) | _user_paths
    for name in (error.filename, error.filename2):
        if name is None or isinstance(name, int):
            continue
        name = os.fsdecode(name)
        if _related(os.path.abspath(name), roots):
            reason = error.strerror or errno.errorcode.get(error.errno or 0, "") or str(error)
            return f"{name}: {reason}"
    return None


def describe(error: BaseException) -> str:
    """A user error's one-line text; ``FILE: reason`` for one built like an ``OSError``."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{os.fsdecode(error.filename)}: {error.strerror}"
    return str(error)


def guarded(main: Callable[..., Any]) -> Callable[..., Any]:
    """``main`` with the error boundary: user mistakes -> one line and status 2."""

    code = getattr(main, "__code__", None)
    prog = os.path.basename(code.co_filename) if code is not None else prog_name()

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _prog.append(prog)
        try:
            return main(*args, **kwargs)
        except (UserError, app.UsageError) as e:
            fail(describe(e))
        except OSError as e:
            message = user_os_error(e)
            if message is None:
                raise
            fail(message)
        finally:
            _prog.pop()

    return wrapper


# --------------------------------------------------------------------------------------- absl


def _config_path(argv: Sequence[str]) -> str | None:
    """The ``--config`` value of ``argv`` (``FILE`` or ``FILE:ARG``), if any."""
    for i, token in enumerate(argv[1:], start=1):
        if token.startswith("--config="):
            return token.partition("=")[2]
        if token == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def resolve_config_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with its ``--config`` value resolved by
    :func:`~docnmt_jax.config_files.resolve_config_path` (a shipped config's name -> its file)."""
    from docnmt_jax.config_files import resolve_config_path

    resolved = list(argv)
    for i, token in enumerate(resolved[1:], start=1):
        if token.startswith("--config="):
            resolved[i] = "--config=" + resolve_config_path(token.partition("=")[2])
        elif token == "--config" and i + 1 < len(resolved):
            resolved[i + 1] = resolve_config_path(resolved[i + 1])
    return resolved


def _config_file_error(argv: Sequence[str]) -> str | None:
    """``--config=FILE`` naming no file (config_flags loads it lazily, without a path in its
    error); ``argv`` as resolved by :func:`resolve_config_argv`."""
    from docnmt_jax.config_files import shipped_config_names

    config_path = _config_path(argv)
    if config_path is None or os.path.isfile(config_path.partition(":")[0] or config_path):
        return None
    if os.path.isfile(config_path):  # a file name with a colon
        return None
    shipped = ", ".join(shipped_config_names())
    return f"--config={config_path}: no such file" + (
        f" (nor a shipped config: {shipped})" if shipped else ""
    )


def _config_load_error(argv: Sequence[str], shown: str | None) -> str | None:
    """The ``--config`` file's ``get_config(ARG)`` rejecting its argument (an unknown row: a
    ``KeyError`` or ``ValueError``; an argument it takes none of: a ``TypeError``):
    ``FILE:ARG: reason``, ``shown`` naming the value as the user wrote it."""
    from docnmt_jax.config_files import load_config

    config_path = _config_path(argv)
    if config_path is None:
        return None
    try:
        load_config(config_path)
    except (KeyError, TypeError, ValueError) as e:
        reason = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
        file_name = os.path.basename(config_path.partition(":")[0])
        reason = re.sub(rf"^\S*{re.escape(file_name)}:\s*", "", reason)  # the file, once
        return f"{shown or config_path}: {reason}"
    except Exception:  # noqa: BLE001 - any other failure of the file is absl's message
        return None
    return None


def _config_override_error(argv: Sequence[str], shown: str | None = None) -> str | None:
    """For ``--config.KEY=VALUE`` flags naming no key of the ``--config`` file: which one
    (``shown``: the ``--config`` value as the user wrote it)."""
    from docnmt_jax.config_files import load_config

    config_path = _config_path(argv)
    overrides = [
        token[len("--config.") :].partition("=")[0]
        for token in argv[1:]
        if token.startswith("--config.")
    ]
    if config_path is None or not overrides or _config_file_error(argv):
        return _config_file_error(argv)
    try:
        config = load_config(config_path)
    except Exception:  # noqa: BLE001 - the config file's own error is absl's message
        return None
    for key in overrides:
        node: Any = config
        for depth, name in enumerate(key.split(".")):
            if not hasattr(node, "keys") or name not in node.keys():
                where = ".".join(key.split(".")[:depth]) or "the config"
                known = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "no keys"
                file = shown or config_path
                return f"--config.{key}: no such key in {file} ({where} has: {known})"
            node = node[name]
    return None


_HELP_FLAGS = ("--help", "-help", "-?", "--helpshort", "--helpfull", "-helpfull", "--helpxml")


def _asks_help(argv: Sequence[str]) -> bool:
    return any(token in _HELP_FLAGS for token in argv[1:])


def parse_absl_flags(
    argv: list[str], config_help: Callable[[str | None], str] | None = None
) -> list[str]:
    """absl's flag parsing with the boundary's one-line errors. A shipped config's name as
    ``--config`` resolves to its file; ``config_help(CONFIG)`` (``CONFIG`` resolved, ``None``
    without ``--config``), if given, is the ``--config`` flag's help, so ``--helpfull`` lists
    the chosen config's keys. ``--help`` and ``--helpfull`` exit 0."""
    shown = _config_path(argv)  # as the user wrote it
    argv = resolve_config_argv(argv)
    if message := _config_file_error(argv):  # resolution keeps a value naming no file
        fail(message)
    if _asks_help(argv) and config_help is not None and "config" in flags.FLAGS:
        if message := _config_load_error(argv, shown):
            fail(message)
        with contextlib.suppress(Exception):  # a config that fails to load: absl's message
            flags.FLAGS["config"].help = config_help(_config_path(argv))
    try:
        return flags.FLAGS(argv)
    except SystemExit as e:
        # absl exits 1 after printing --help/--helpfull; a help that was asked for is a success
        if e.code == 1 and _asks_help(argv):
            sys.exit(0)
        raise
    except flags.Error as e:
        fail(_config_override_error(argv, shown) or _config_load_error(argv, shown) or e)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        # ml_collections' config_flags raise these for an override it cannot apply
        message = _config_override_error(argv, shown)
        if message is None:
            raise
        fail(message if message else e)


def run(
    main: Callable[[list[str]], Any], config_help: Callable[[str | None], str] | None = None
) -> None:
    """``app.run(main)`` behind the error boundary (flags included). ``--help`` shows the
    docstring of ``main``'s module (absl reads ``__main__``'s, which may be a shim or an
    installed command's script). ``config_help``: see :func:`parse_absl_flags`."""
    command_doc = getattr(sys.modules.get(getattr(main, "__module__", "")), "__doc__", None)
    entry = sys.modules.get("__main__")
    if command_doc and entry is not None:
        entry.__doc__ = command_doc
    parser = functools.partial(parse_absl_flags, config_help=config_help)
    app.run(guarded(main), flags_parser=parser)


# ----------------------------------------------------------------------------------- argparse


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the boundary's error: ``PROG: error: MESSAGE`` (one line), status 2."""

    def error(self, message: str) -> NoReturn:
        fail(message, prog=self.prog.split()[0])


def run_argparse(main: Callable[[Sequence[str] | None], Any], argv: Sequence[str] | None = None):
    """Calls ``main(argv)`` behind the error boundary; exits with its integer result."""
    result = guarded(main)(argv)
    if isinstance(result, int):
        sys.exit(result)
    return result
