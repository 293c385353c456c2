"""The user's commands (``launch/*.py`` are thin shims that run them): prepare_data, train,
translate, evaluate, analyze, average_checkpoints, benchmark, context_proof, demo,
memory_report. Each module's ``main`` is run by :mod:`docnmt_jax.cli`'s error boundary. The
top layer of the package (``docs/design.md``, "Layer order"): a command may train, translate
and evaluate."""
