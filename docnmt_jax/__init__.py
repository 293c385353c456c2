"""docnmt_jax: document-level neural machine translation in JAX/Flax."""

import os as _os

# TensorFlow (tf.data, the training loader) logs C++ lines on import ("oneDNN custom operations
# are on", CPU feature notes, TF-TRT/cuDNN registration warnings). Quiet them before any module
# imports it; a value the user set wins. TF_CPP_MIN_LOG_LEVEL=2 keeps errors. The oneDNN line
# ignores the log level: only TF_ENABLE_ONEDNN_OPTS=0 silences it, which changes TensorFlow's
# float kernels only -- here TensorFlow batches integer token ids and JAX does every float
# operation (it does not read the variable), so no number this toolkit computes changes.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

__version__ = "0.1.0"


def __getattr__(name: str):
    """``docnmt_jax.load`` (:func:`docnmt_jax.api.load`), imported on first use so that
    importing the package stays light."""
    if name == "load":
        from docnmt_jax.api import load

        return load
    raise AttributeError(f"module 'docnmt_jax' has no attribute {name!r}")
