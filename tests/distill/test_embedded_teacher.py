"""Distillation from the embedded engine (no network): a small policy served by the JAX engine
behind the proxy's token-level path; a second run resumes without repeating work; a teacher
checkpoint (orbax or Hugging Face folder) is what the engine serves."""
import dataclasses
import os

import jax
import numpy as np
import pytest
from flax import nnx

from orchard_jax import data, models
from orchard_jax.models import hf
from orchard_jax.recipes.agentic import teachers as teacher
from orchard_jax.recipes.swe import distill as swe_distill

# The tiny preset cut down (as in tests/rollout) so the engine compiles in seconds.
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
             num_experts_per_tok=2)


def small_teacher(config):
  config.teacher.model_overrides.update(SMALL)
  config.teacher.engine.update(dict(max_seq_len=1024, cache_len_buckets=(1024,),
                                    prefill_chunk_buckets=(256,), decode_steps=8))
  config.sampling.max_tokens = 16
  config.agent.step_limit = 2
  return config


def _files(root):
  return {p: os.path.getsize(p) for p in sorted(
      os.path.join(d, f) for d, _, names in os.walk(root) for f in names)}


def test_embedded_teacher_collects_token_level_records_and_resumes(tmp_path, distill_config):
  config = small_teacher(distill_config(tmp_path / "run", attempts_per_task=2, parallel=2))
  summary = swe_distill.collect(config)
  assert (summary.planned, summary.skipped, summary.started) == (2, 0, 2)
  assert (summary.completed, summary.evaluated, summary.aborted) == (2, 2, 0)
  store_root = swe_distill.store_path(config)
  with data.TrajectoryStore(store_root) as store:
    trajectories = store.trajectories(experiment="swe_distill")
    assert sorted(t.attempt for t in trajectories) == [0, 1]
    for trajectory in trajectories:
      # a random policy writes no bash block: two format errors, then the step limit
      assert trajectory.exit_status == "LimitsExceeded" and trajectory.resolved is False
      assert trajectory.metadata["text_only"] is False
      assert trajectory.metadata["teacher_tokenizer"] == "tiny"
      calls = store.model_calls(trajectory.session_id)
      assert len(calls) == 2 == trajectory.metadata["model_calls"]
      for call in calls:
        assert not call.text_only and 0 < len(call.output_ids) <= 16
        assert len(call.output_logprobs) == len(call.output_ids)
        assert all(lp <= 0 for lp in call.output_logprobs)
      # token-level records feed RL: the trained tokens are exactly the sampled ones
      (sequence,) = data.sequences_from_model_calls(calls, mode="rl")
      sampled = np.concatenate([c.output_ids for c in calls])
      np.testing.assert_array_equal(sequence.input_ids[sequence.loss_weights > 0], sampled)
      np.testing.assert_allclose(sequence.old_logprobs[sequence.loss_weights > 0],
                                 np.concatenate([c.output_logprobs for c in calls]), rtol=1e-6)
      assert trajectory.metadata["completion_tokens"] == len(sampled)
  before = _files(store_root)

  again = swe_distill.collect(config)
  assert (again.skipped, again.started, again.remaining) == (2, 0, 0)
  assert _files(store_root) == before          # not one record written

  config.distill.attempts_per_task = 3         # a larger k runs only the new attempt
  config.distill.parallel = 1
  more = swe_distill.collect(config)
  assert (more.skipped, more.started, more.completed) == (2, 1, 1)
  with data.TrajectoryStore(store_root) as store:
    assert sorted(t.attempt for t in store.trajectories()) == [0, 1, 2]


def _teacher_config(tmp_path, **fields):
  from experiments import swe_distill as experiment
  teacher = experiment.get_config().teacher
  teacher.model_overrides.update(SMALL)
  teacher.update(fields)
  return teacher


def _params(model):
  return jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def test_teacher_checkpoints_load_as_written(tmp_path, tok):
  from orchard_jax.rollout import save_params
  from orchard_jax.train.checkpoint import Checkpointer

  config = dataclasses.replace(models.get_preset("tiny"), dtype="float32", **SMALL)
  trained = models.CausalLM(config, rngs=nnx.Rngs(7))
  save_params(str(tmp_path / "run" / "checkpoints"), nnx.state(trained, nnx.Param))
  tok.save(str(tmp_path / "run" / "tokenizer"))    # a recipe's workdir layout
  hf.save_pretrained(trained, config, str(tmp_path / "hf"))
  # a recipe run folder: the trainer's checkpoints under sft/ and rl/ (rl is the later stage)
  later = models.CausalLM(config, rngs=nnx.Rngs(8))
  for stage, model in (("sft", trained), ("rl", later)):
    with Checkpointer(str(tmp_path / "swe_run" / stage / "checkpoints"), async_save=False) as c:
      c.save(3, {"params": nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                 "step": np.int32(3)}, force=True)
  tok.save(str(tmp_path / "swe_run" / "tokenizer"))

  fresh, _, description = teacher.teacher_policy(_teacher_config(tmp_path))
  assert "freshly initialised" in description
  assert not all(np.array_equal(a, b) for a, b in zip(_params(fresh), _params(trained)))
  for folder, kind in ((tmp_path / "run" / "checkpoints", "orbax"), (tmp_path / "hf", "Hugging")):
    model, tokenizer, description = teacher.teacher_policy(
        _teacher_config(tmp_path, checkpoint=str(folder)))
    assert kind in description
    if kind == "orbax":     # the tokenizer saved beside the checkpoints folder
      assert f"tokenizer {tmp_path / 'run' / 'tokenizer'}" in description
    for got, want in zip(_params(model), _params(trained)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  run_model, _, description = teacher.teacher_policy(
      _teacher_config(tmp_path, checkpoint=str(tmp_path / "swe_run")))
  assert "swe_run/rl/checkpoints (orbax" in description
  assert f"tokenizer {tmp_path / 'swe_run' / 'tokenizer'}" in description
  for got, want in zip(_params(run_model), _params(later)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  with pytest.raises(teacher.TeacherError, match="is not a folder"):
    teacher.teacher_policy(_teacher_config(tmp_path, checkpoint=str(tmp_path / "no")))
