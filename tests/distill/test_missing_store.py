"""The store jobs on a store path that does not exist: a clear error, and no empty store made."""
import os

import pytest

from experiments import swe_distill as experiment
from orchard_jax.recipes.agentic import trajectory_data
from orchard_jax.recipes.swe import distill as swe_distill


@pytest.mark.parametrize("job", [trajectory_data.stats, trajectory_data.export])
def test_missing_store_is_refused_without_creating_it(tmp_path, job):
  config = experiment.get_config()
  config.workdir = str(tmp_path / "run")
  config.store = str(tmp_path / "runs" / "nope" / "store")      # a misspelt --config.store
  with pytest.raises(swe_distill.DistillError, match="no trajectory store at"):
    job(config)
  assert not os.path.exists(config.store)


@pytest.mark.parametrize("source, message", [
    ("no_such_folder", "import_from: '.*no_such_folder' does not exist"),
    ("empty_folder", r"import_from: no \*\.traj\.json files under"),
])
def test_import_from_nothing_is_refused_without_creating_a_store(tmp_path, source, message):
  # Walkthrough: a misspelt --config.import_from was a TrajectoryFormatError traceback (exit 1)
  # raised with the store already opened, i.e. created.
  (tmp_path / "empty_folder").mkdir()
  config = experiment.get_config()
  config.workdir = str(tmp_path / "run")
  config.store = str(tmp_path / "run" / "store")
  config.import_from = str(tmp_path / source)
  with pytest.raises(swe_distill.DistillError, match=message):
    trajectory_data.import_trajectories(config)
  assert not os.path.exists(config.workdir)
