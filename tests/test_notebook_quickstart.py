"""notebooks/quickstart.ipynb runs end to end at tiny settings.

The notebook executes in a fresh kernel (nbclient) with ``DOCNMT_NOTEBOOK_QUICK=1``: prepare
the data, train a tiny FINAL, translate, score, draw the attention map and the context curve.
Any cell that raises fails the test; the committed notebook carries no outputs.
"""

import pytest

pytest.importorskip("nbformat", reason="executing notebooks needs nbformat and nbclient")

from notebook_runner import assert_clean, execute_notebook  # noqa: E402

pytestmark = pytest.mark.notebook


def test_quickstart_notebook_runs(tmp_path):
    nb = assert_clean("quickstart.ipynb")
    executed = execute_notebook(nb, tmp_path)
    images = [
        out
        for cell in executed.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]
    assert len(images) >= 2, "expected the attention map and the context curve inline"
    assert (tmp_path / "final" / "test.hyp.tsv").is_file()
