"""The translation server (``docnmt-serve``, docs/serving.md).

* :mod:`~docnmt_jax.serving.batching`: the bounded request queue, the worker thread that runs
  one batched model call per cycle, and the LRU cache of documents translated sentence by
  sentence.
* :mod:`~docnmt_jax.serving.server`: the HTTP handler (routes, request validation, one-line
  JSON errors) on the standard library's ``ThreadingHTTPServer``.

The command is :mod:`docnmt_jax.commands.serve`; its load test (latency and throughput of a
running server) :mod:`docnmt_jax.commands.serve_load_test`.

Only the standard library and the toolkit itself: no web framework (the model call is the
bottleneck, and it runs in one worker thread).
"""
