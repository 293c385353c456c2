"""CoWord dropout (Fernandes et al. 2021) as an objective: its mask against a hand-computed
one, the batch the model sees, no dropout in evaluation, and the options' checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from docnmt_jax.data.tokenizer import EOS_ID, UNK_ID
from docnmt_jax.objectives import ObjectiveError, build_objective
from docnmt_jax.objectives.coword import coword_batch, coword_mask

SRC = np.array([[[5, 6, EOS_ID, 0], [7, EOS_ID, 0, 0]]], np.int32)  # [1, 2, 4]
CONTEXT = np.array([[[8, 9, EOS_ID, 0]]], np.int32)  # a window model's context_src


class RecordingModel:
    """Records the batch its loss gets."""

    def __init__(self) -> None:
        self.batches: list = []

    def loss(self, params, batch, rng, train):
        self.batches.append(batch)
        return jnp.zeros(()), {}


def _batch():
    return {"src": SRC, "src_mask": (SRC > 0).astype(np.int32), "context_src": CONTEXT}


def test_mask_against_a_hand_computed_one():
    uniform = np.array([[[0.05, 0.5, 0.01, 0.01], [0.09, 0.0, 0.0, 0.0]]])
    got = np.asarray(coword_mask(SRC, SRC > 0, uniform, 0.1))
    # dropped: real, not EOS, uniform < 0.1 -> only the tokens 5 and 7
    want = np.array([[[True, False, False, False], [True, False, False, False]]])
    np.testing.assert_array_equal(got, want)
    assert not np.asarray(coword_mask(SRC, SRC > 0, uniform, 0.0)).any()


def test_objective_drops_only_the_current_source_in_training():
    model = RecordingModel()
    objective = build_objective({"name": "coword", "coword": {"probability": 0.5}}, model)
    rng = jax.random.PRNGKey(0)
    objective.loss(None, _batch(), rng, train=True)
    seen = model.batches[-1]
    drop_key, _ = jax.random.split(jax.random.fold_in(rng, 1))
    uniform = np.asarray(jax.random.uniform(drop_key, SRC.shape))
    mask = (SRC > 0) & (SRC != EOS_ID) & (uniform < 0.5)
    np.testing.assert_array_equal(np.asarray(seen["src"]), np.where(mask, UNK_ID, SRC))
    np.testing.assert_array_equal(np.asarray(seen["context_src"]), CONTEXT)  # context kept
    np.testing.assert_array_equal(np.asarray(seen["src_mask"]), SRC > 0)
    dropped, _ = coword_batch(_batch(), drop_key, 0.5)
    np.testing.assert_array_equal(np.asarray(dropped["src"]), np.asarray(seen["src"]))
    objective.loss(None, _batch(), rng, train=False)  # evaluation: nothing dropped
    np.testing.assert_array_equal(np.asarray(model.batches[-1]["src"]), SRC)


def test_probability_must_be_below_one():
    with pytest.raises(ObjectiveError, match="coword.probability = 1.0"):
        build_objective({"name": "coword", "probability": 1.0}, RecordingModel())
