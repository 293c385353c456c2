"""notebooks/context_proof.ipynb runs at tiny settings and draws its per-distance plot."""

import pytest

pytest.importorskip("nbformat", reason="executing notebooks needs nbformat and nbclient")

from notebook_runner import assert_clean, execute_notebook  # noqa: E402

pytestmark = pytest.mark.notebook


def test_context_proof_notebook_runs(tmp_path):
    nb = assert_clean("context_proof.ipynb")
    executed = execute_notebook(nb, tmp_path)
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no per-distance plot"
    markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert any("**transformer**" in m for m in markdown)
    assert any("**final**" in m for m in markdown)
