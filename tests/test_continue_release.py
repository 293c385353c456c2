"""A row's training continued from its interim release on another machine
(``init_from_continue``, ``experiments/release_row.py --interim``, the runner's
``--continue_release``): the step, the learning-rate schedule and the best dev value carry
over, Adam starts fresh (its first update is ``lr * sign(g)``), and an interim release is
never a finetune's base."""

import argparse
import os
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import ROOT, tiny_config
from etils import epath
from test_init_from import _flat

from docnmt_jax.errors import ConfigError
from docnmt_jax.export import release
from docnmt_jax.training import trainer

sys.path.insert(0, ROOT)

from experiments import release_row, results  # noqa: E402


def _state(step_dir):
    """The saved train state of ``step_dir`` as numpy (Orbax directly) and its meta."""
    state_dir = os.path.join(step_dir, "state")
    tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(state_dir)).tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = ocp.PyTreeCheckpointer().restore(
        state_dir, args=ocp.args.PyTreeRestore(restore_args=args)
    )
    meta = ocp.JsonCheckpointHandler().restore(epath.Path(step_dir) / "meta")
    return state, meta


def _lr(count, d_model, warmup):
    """Vaswani et al. (2017) Eq. (3) at schedule count ``count`` (step ``count + 1``)."""
    return d_model**-0.5 * min((count + 1) ** -0.5, (count + 1) * warmup**-1.5)


@pytest.fixture(scope="module")
def interim(synthetic_dir, tmp_path_factory):
    """A row trained 4 steps (dev loss every 2) with no train record, released ``--interim``."""
    run_dir = tmp_path_factory.mktemp("campaign")
    workdir = str(run_dir / "rows" / "transformer")
    config = tiny_config(synthetic_dir, num_steps=4, eval_every=2, checkpoint_every=2)
    config.train.update(warmup_steps=8, log_every=1, aot_compile=False)
    trainer.train_and_evaluate(config, workdir)
    out = str(run_dir / "release")
    release_row.main(
        ["--run_dir", str(run_dir), "--row", "transformer", "--out", out, "--interim"]
        + ["--commit", "abc"]
    )
    return config, workdir, out


def test_interim_release_records_where_training_stands(interim):
    config, workdir, out = interim
    training = release.read_manifest(out)["training"]
    assert training["stopped_by"] == "interim" and training["commit"] == "abc"
    chosen = training["chosen_step"]
    assert chosen in (2, 4) and training["steps_trained"] == chosen
    assert 0 < training["target_tokens_trained"] <= chosen * config.data.batch_tgt_tokens
    assert training["dev_at_chosen_step"]["dev_loss"] > 0
    with pytest.raises(Exception, match="--interim"):
        release_row.main(
            ["--run_dir", os.path.dirname(os.path.dirname(workdir))]
            + ["--row", "transformer", "--out", out + "2"]
        )


def test_the_final_release_over_an_interim_one_records_how_training_began(interim, tmp_path):
    import shutil

    from docnmt_jax.files import write_record

    _, workdir, out = interim
    final = str(tmp_path / "release")
    shutil.copytree(out, final)
    run_dir = tmp_path / "run"
    shutil.copytree(workdir, run_dir / "rows" / "transformer")
    write_record(
        str(run_dir / "rows" / "transformer" / "train.json"),
        {"steps": 4, "tokens_per_step": 10.0, "stopped_by": "patience", "code": "def"},
    )
    flags = ["--run_dir", str(run_dir), "--row", "transformer", "--out", final, "--overwrite"]
    release_row.main(flags)
    training = release.read_manifest(final)["training"]
    assert training["stopped_by"] == "patience" and training["commit"] == "def"
    assert training["continued_from"] == release.read_manifest(out)["training"]
    assert results.is_final_release(final)


def test_logged_tokens_per_step_counts_each_step_once(tmp_path):
    """Log lines every 10 steps, the run resumed at step 10 logging step 20 again: 30 steps."""
    log = tmp_path / "train.log"
    lines = [(10, 1000), (20, 1100), (10, 999), (20, 1100), (30, 900), (40, 5000)]
    log.write_text(
        "".join(f"2026-12-03 07:00:00 step={s} train/loss=1.0 train/tokens={t}\n" for s, t in lines)
        + "2026-12-03 07:00:01 step=30 dev_loss=2.0\n"
    )
    assert release_row.logged_tokens_per_step(str(log), 30) == pytest.approx(3000 / 30)


def test_training_continues_at_the_release_step_with_fresh_adam(synthetic_dir, interim, tmp_path):
    config, _, out = interim
    training = release.read_manifest(out)["training"]
    chosen, dev_loss = training["chosen_step"], training["dev_at_chosen_step"]["dev_loss"]
    flat_release = release.read_params(out, release.read_manifest(out))
    cont = tiny_config(synthetic_dir, num_steps=chosen + 1, warmup_steps=8, log_every=1)
    cont.train.aot_compile = False
    cont.init_from, cont.init_from_params, cont.init_from_continue = out, "auto", True
    workdir = str(tmp_path / "continued")
    result = trainer.train_and_evaluate(cont, workdir)
    assert result.step == chosen + 1
    log = open(os.path.join(workdir, "train.log")).read()
    assert f"init_from_continue: step {chosen} and dev_loss=" in log
    assert f"starting at step {chosen}" in log
    # Saved at once, as latest and best: the release's parameters, its best value, fresh Adam.
    for kind in ("checkpoints", "best"):
        state, meta = _state(os.path.join(workdir, kind, str(chosen)))
        assert int(state["step"]) == chosen
        assert meta["best_value"] == pytest.approx(dev_loss) and meta["best_step"] == chosen
        assert meta["evals_without_improvement"] == 0
        params = _flat(state["params"])
        assert set(params) == set(flat_release)
        for path, value in flat_release.items():
            np.testing.assert_array_equal(params[path], value, err_msg=path)
        counts = [
            int(x)
            for p, x in jax.tree_util.tree_leaves_with_path(state["opt_state"])
            if jax.tree_util.keystr(p).endswith(".count") or "count" in str(p[-1])
        ]
        assert sorted(counts) == [0, chosen]  # Adam's count fresh, the schedule's continued
    # The first continued update: the schedule at `chosen`, and Adam's first step from zero
    # moments moves every parameter with a clear gradient by the learning rate itself.
    lr = _lr(chosen, config.model.d_model, 8)
    logged = [ln for ln in log.splitlines() if f" step={chosen + 1} " in ln and "train/lr=" in ln]
    assert float(logged[-1].split("train/lr=")[1].split()[0]) == pytest.approx(lr, rel=1e-5)
    after = _flat(_state(os.path.join(workdir, "checkpoints", str(chosen + 1)))[0]["params"])
    moved = np.concatenate([np.abs(after[p] - v).ravel() for p, v in flat_release.items()])
    assert np.mean(np.isclose(moved, lr, rtol=0.02)) > 0.8, np.percentile(moved / lr, [10, 50, 90])


def test_the_runner_continues_a_row_and_refuses_an_interim_base(interim):
    from experiments.results_rows import select_rows
    from experiments.results_stages import Settings, row_config

    _, _, out = interim
    assert not results.is_final_release(out)
    args = argparse.Namespace(init_release=f"transformer={out}", converged=True, quick=False)
    with pytest.raises(ConfigError, match="interim release"):
        results.released_rows(args)
    (row,) = select_rows("transformer", [0], True, ())
    settings = Settings(out="runs/x", data_dir="data/x", continued=((row.name, out),))
    config = row_config(row, settings, 10, "spm.model")
    assert (config.init_from, config.init_from_continue, config.init_from_params) == (
        out,
        True,
        "auto",
    )


@pytest.mark.parametrize(
    "script", ["converged_campaign.sh", "campaign_interim.sh"], ids=["campaign", "interim"]
)
def test_the_campaign_reads_the_releases_own_stop_not_its_chains(script, tmp_path):
    """A final release continued from interim ones (``training.continued_from``) is final: the
    campaign scripts' interim test reads the top-level record only (a text search for
    ``"stopped_by": "interim"`` matched the chain and re-exported the final release)."""
    import json
    import re
    import subprocess

    text = open(os.path.join(ROOT, "experiments", "recipes", script), encoding="utf-8").read()
    check = re.search(r"python3 -c '(.+?)' \\\s*\n\s*\"\$RELEASE/release.json\"", text)
    assert check, f"{script}: no interim check on the release's own record"

    def interim(record):
        (tmp_path / "release.json").write_text(json.dumps({"training": record}))
        done = subprocess.run(["python3", "-c", check.group(1), str(tmp_path / "release.json")])
        return done.returncode == 0

    chain = {"stopped_by": "interim", "steps_trained": 10}
    assert not interim({"stopped_by": "patience", "continued_from": chain})
    assert interim({"stopped_by": "interim", "continued_from": chain})
    assert interim({"stopped_by": "interim"})
    assert not interim({"stopped_by": "max_epochs"})
