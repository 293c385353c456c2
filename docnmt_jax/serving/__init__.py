"""The translation server (``docnmt-serve``, docs/serving.md).

* :mod:`~docnmt_jax.serving.batching`: the bounded set of pending requests and the worker
  thread that runs them in fair, interleaved batches (a large job split by document),
  cancelling a timed-out request before it commits.
* :mod:`~docnmt_jax.serving.documents`: the LRU cache of documents translated sentence by
  sentence, their evicted ids (409) and their answers by request id (exactly-once retries).
* :mod:`~docnmt_jax.serving.requests`: strict parsing of a request's ``Content-Length`` and
  JSON body.
* :mod:`~docnmt_jax.serving.guard`: the Host allow-list, the Origin check, the bearer token.
* :mod:`~docnmt_jax.serving.server`: the HTTP handler (routes, one-line JSON errors) on the
  standard library's ``ThreadingHTTPServer``, with a connection cap and a whole-request
  deadline.

The command is :mod:`docnmt_jax.commands.serve`; its load test (latency and throughput of a
running server) :mod:`docnmt_jax.commands.serve_load_test`.

Only the standard library and the toolkit itself: no web framework (the model call is the
bottleneck, and it runs in one worker thread).
"""
