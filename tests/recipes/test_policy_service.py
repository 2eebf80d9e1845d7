"""The policy service's remote path (engine.urls set, as the cluster preset sets it): new weights
are written as a Hugging Face folder under engine.weights_dir and every server loads them with
/update_weights_from_disk, and such a folder works as policy.init. The "SGLang server" is
orchard_jax's own InferenceServer, which speaks SGLang's HTTP API: no SGLang server can run on
this machine."""
import os

import jax
import numpy as np
import pytest
from flax import nnx

from experiments import swe_rpr
from orchard_jax import data, parallel, rollout
from orchard_jax.recipes.agentic import policy as swe_policy, serving
from tests.recipes import conftest


def test_remote_engines_load_new_weights_from_the_weights_folder(tmp_path):
  config = swe_rpr.get_config()
  config.policy.update(conftest.MINI_POLICY)
  tokenizer = swe_policy.load_tokenizer(config.policy)
  mesh = parallel.make_mesh(config.mesh)
  served = swe_policy.build_policy(config.policy, mesh, vocab_size=tokenizer.vocab_size, seed=0)
  trained = swe_policy.build_policy(config.policy, mesh, vocab_size=tokenizer.vocab_size, seed=1)
  engine = rollout.Engine(served, tokenizer, config=rollout.EngineConfig(
      max_batch_size=1, batch_buckets=(1,), max_seq_len=64))
  with rollout.InferenceServer(engine) as server, \
      data.TrajectoryStore(str(tmp_path / "store")) as store:
    config.engine.urls = server.url
    with serving.policy_service(config, None, tokenizer, store) as service:
      with pytest.raises(serving.ServingError, match="weights_dir"):
        service.sync_weights(trained, version=3)       # no shared folder to load from
      config.engine.weights_dir = service.weights_dir = str(tmp_path / "weights")
      service.sync_weights(trained, version=3)
      folder = os.path.join(config.engine.weights_dir, "v000003")
      assert service.version == 3 and swe_policy.is_hf_folder(folder)
      info = engine.model_info()
      assert info["model_path"] == folder and info["weight_version"] == "3"
      expected = jax.tree.leaves(nnx.to_pure_dict(nnx.state(trained, nnx.Param)))
      loaded = jax.tree.leaves(engine.runner.params)
      assert len(loaded) == len(expected)
      for a, b in zip(loaded, expected):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The cluster preset's policy.init is such a folder: build_policy reads it back.
  again = swe_policy.build_policy(config.policy, mesh, vocab_size=tokenizer.vocab_size,
                                  init=folder)
  for a, b in zip(jax.tree.leaves(nnx.to_pure_dict(nnx.state(again, nnx.Param))), expected):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_embedded_engine_takes_the_prefix_cache_switch_from_the_config(tmp_path, prefix_cache):
  config = swe_rpr.get_config()
  config.policy.update(conftest.MINI_POLICY)
  config.engine.prefix_cache = prefix_cache
  tokenizer = swe_policy.load_tokenizer(config.policy)
  model = swe_policy.build_policy(config.policy, parallel.make_mesh(config.mesh),
                                  vocab_size=tokenizer.vocab_size, seed=0)
  with data.TrajectoryStore(str(tmp_path / "store")) as store:
    with serving.policy_service(config, model, tokenizer, store) as service:
      assert service.engine.config.prefix_cache is prefix_cache
      # Two turns of one session: the second reuses the first's prompt only with the cache on.
      ids = [1, 2, 3, 4, 5, 6, 7, 8]
      request = rollout.SingleGenerateRequest(
          input_ids=ids, sampling_params=rollout.SamplingParams(
              max_new_tokens=2, temperature=0.0, ignore_eos=True))
      [first] = service.engine.generate([request])
      follow = request.model_copy(update={"input_ids": ids + first.output_ids + [9]})
      [second] = service.engine.generate([follow])
      assert (second.meta_info.cached_tokens > 0) is prefix_cache
