"""Packages: ``docnmt_jax*``, plus the repository's ``configs/`` shipped as the package data
``docnmt_jax/configs/*.py`` (mapped, not copied: the files stay in ``configs/``, where the docs
and experiments name them). Everything else is in pyproject.toml. An editable install reads
them from ``configs/`` itself (``docnmt_jax.config_files.shipped_configs_dir``).
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["docnmt_jax", "docnmt_jax.*"]), "docnmt_jax.configs"],
    package_dir={"docnmt_jax.configs": "configs"},
    package_data={"docnmt_jax.configs": ["*.py"]},
)
