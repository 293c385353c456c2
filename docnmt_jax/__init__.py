"""docnmt_jax: document-level neural machine translation in JAX/Flax."""

__version__ = "0.1.0"
