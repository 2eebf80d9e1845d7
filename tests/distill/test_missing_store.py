"""The store jobs on a store path that does not exist: a clear error, and no empty store made."""
import os

import pytest

from experiments import swe_distill as experiment
from orchard_jax.recipes import swe_distill, trajectory_data


@pytest.mark.parametrize("job", [trajectory_data.stats, trajectory_data.export])
def test_missing_store_is_refused_without_creating_it(tmp_path, job):
  config = experiment.get_config()
  config.workdir = str(tmp_path / "run")
  config.store = str(tmp_path / "runs" / "nope" / "store")      # a misspelt --config.store
  with pytest.raises(swe_distill.DistillError, match="no trajectory store at"):
    job(config)
  assert not os.path.exists(config.store)
