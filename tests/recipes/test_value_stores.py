"""swe_value's choice of trajectory stores: a misspelt store is an error, not a new empty store."""
import os

import ml_collections
import pytest

from orchard_jax import data
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import value as swe_value


def _config(stores):
  return ml_collections.ConfigDict({"value": {"stores": tuple(stores)}})


def test_named_store_that_does_not_exist_is_refused_and_not_created(tmp_path):
  missing = str(tmp_path / "runs" / "nope" / "store")
  with pytest.raises(ConfigError, match="value.stores names"):   # launch/run.py: one line
    swe_value.stores_of(_config([missing]))
  assert not os.path.exists(missing)


def test_stores_without_a_labelled_trajectory_are_one_line_before_any_model(tmp_path):
  # Walkthrough: `swe_value.py` before any RL/eval run (or on an empty store) was a TrainError
  # traceback, exit 1.
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  store = tmp_path / "empty" / "store"
  with data.TrajectoryStore(str(store)):
    pass
  result = subprocess.run(
      [sys.executable, os.path.join(root, "launch", "run.py"), "--config",
       os.path.join(root, "experiments", "swe_value.py"), f"--config.workdir={tmp_path / 'run'}",
       f"--config.value.stores=('{store}',)"], cwd=root, capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: no labelled trajectory to train the value model on in ['{store}']; run an RL "
      "or eval experiment first")
  assert not (tmp_path / "run").exists()


def test_named_and_default_stores(tmp_path, monkeypatch):
  store = tmp_path / "runs" / "a" / "store"
  with data.TrajectoryStore(str(store)):
    pass
  assert swe_value.stores_of(_config([str(store)])) == [str(store)]
  monkeypatch.chdir(tmp_path)                       # the default globs runs/*/store here
  assert swe_value.stores_of(_config([])) == [os.path.join("runs", "a", "store")]
