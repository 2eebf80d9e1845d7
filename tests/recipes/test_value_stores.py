"""swe_value's choice of trajectory stores: a misspelt store is an error, not a new empty store."""
import os

import ml_collections
import pytest

from orchard_jax import data
from orchard_jax.recipes import swe_value


def _config(stores):
  return ml_collections.ConfigDict({"value": {"stores": tuple(stores)}})


def test_named_store_that_does_not_exist_is_refused_and_not_created(tmp_path):
  missing = str(tmp_path / "runs" / "nope" / "store")
  with pytest.raises(FileNotFoundError, match="value.stores names"):
    swe_value.stores_of(_config([missing]))
  assert not os.path.exists(missing)


def test_named_and_default_stores(tmp_path, monkeypatch):
  store = tmp_path / "runs" / "a" / "store"
  with data.TrajectoryStore(str(store)):
    pass
  assert swe_value.stores_of(_config([str(store)])) == [str(store)]
  monkeypatch.chdir(tmp_path)                       # the default globs runs/*/store here
  assert swe_value.stores_of(_config([])) == [os.path.join("runs", "a", "store")]
