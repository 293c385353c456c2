"""Runs many command lines of one launch script in one process (for the fuzz tests).

``python tests/cli_fuzz_worker.py SCRIPT CASES_JSON RESULTS_JSON``: imports
``launch/SCRIPT`` once, then for each case parses ``args`` with the boundary's absl parser
and calls the script's ``main`` behind :func:`docnmt_jax.cli.guarded` -- what ``cli.run``
does around ``app.run`` -- recording the exit status, stderr, and whether an exception
escaped the boundary (a traceback). Importing JAX and the script once makes hundreds of
cases affordable.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import flags  # noqa: E402

from docnmt_jax import cli  # noqa: E402


def main() -> None:
    script, cases_path, results_path = sys.argv[1:]
    path = os.path.join(ROOT, "launch", script)
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    for case in cases:
        argv = [path, *case["args"]]
        flags.FLAGS.unparse_flags()
        for name in [n for n in flags.FLAGS if n.startswith("config.")]:
            delattr(flags.FLAGS, name)  # config_flags defines an override flag per parse
        err, out = io.StringIO(), io.StringIO()
        code, escaped = 0, ""
        sys.argv = argv
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                remaining = cli.parse_absl_flags(argv)
                cli.guarded(module.main)(remaining)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 - a traceback: what the test looks for
                escaped = traceback.format_exc()
                code = 1
        results.append({"code": code, "stderr": err.getvalue(), "traceback": escaped})
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
