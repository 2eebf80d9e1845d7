"""Shared fixtures: a real Orchard Env service (local bubblewrap backend), two small real SWE
tasks on the `parse` package's image whose hidden test is a fair coin, and the miniature
recipe config (a 2-layer, 64-wide MoE policy; two tasks; two RL iterations)."""
import dataclasses

import pytest


@pytest.fixture(scope="session")
def env_client():
  from orchard_jax.env.backends.local import LocalBackend
  from orchard_jax.env.client import SandboxClient
  from orchard_jax.env.orchestrator import Orchestrator
  with Orchestrator(LocalBackend()) as service, SandboxClient(service.url, service.api_key) as c:
    yield c


@pytest.fixture(scope="session")
def parse_instances():
  """Real instances on the parse package (tests/parse_tasks.py: the set every SWE test
  shares)."""
  from tests.parse_tasks import parse_task_set
  return parse_task_set().instances


COIN_TEST = ("import os\n\n\ndef test_coin():\n"
             "    assert os.urandom(1)[0] % 2 == 0, 'the coin came up tails'\n")


def coin_instance(base, index: int):
  """A task on `base`'s real image and commit whose FAIL_TO_PASS test passes with
  probability 1/2 whatever the agent does: rollouts of an untrained policy then resolve at
  random, which gives BAR mixed groups to train on without a trained model."""
  test_patch = ("diff --git a/tests/test_coin.py b/tests/test_coin.py\nnew file mode 100644\n"
                "--- /dev/null\n+++ b/tests/test_coin.py\n@@ -0,0 +1,5 @@\n"
                + "".join(f"+{line}\n" for line in COIN_TEST.splitlines()))
  spec = dataclasses.replace(base.test_spec, test_files=("tests/test_coin.py",),
                             timeout_s=60.0)
  return dataclasses.replace(
      base, instance_id=f"coin__parse-{index}", problem_statement=f"Coin {index}: flip it.",
      test_patch=test_patch, FAIL_TO_PASS=("tests/test_coin.py::test_coin",), PASS_TO_PASS=(),
      test_spec=spec)


@pytest.fixture(scope="session")
def coin_dataset(parse_instances, tmp_path_factory):
  from orchard_jax.tasks.swe.instance import save_instances
  path = tmp_path_factory.mktemp("coins") / "instances.jsonl"
  save_instances([coin_instance(parse_instances[0], i) for i in range(2)], str(path))
  return str(path)


def sft_folder(tmp_path, instances):
  """A mini-swe-agent folder with one resolved and one unresolved short trajectory per task."""
  from orchard_jax import data
  from orchard_jax.harness import prompts
  folder = tmp_path / "sft_trajectories"
  for instance in instances:
    values = {"task": instance.problem_statement, "workdir": "/testbed",
              "submit_command": prompts.SUBMIT_COMMAND, "command_timeout_s": 30}
    head = [{"role": "system", "content": prompts.SYSTEM_TEMPLATE.format(**values)},
            {"role": "user", "content": prompts.INSTANCE_TEMPLATE.format(**values)}]
    for attempt, resolved in enumerate((True, False)):
      messages = head + [
          {"role": "assistant", "content": "THOUGHT: Run the tests.\n\n```bash\npython -m "
                                           "pytest -q tests/test_coin.py\n```"},
          {"role": "user", "content": "<returncode>1</returncode>\n<output>\nF\n1 failed\n"
                                      "</output>", "extra": {"returncode": 1}},
          {"role": "assistant", "content": "THOUGHT: Submit.\n\n```bash\n"
                                           f"{prompts.SUBMIT_COMMAND}\n```"},
          {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}]
      trajectory = data.Trajectory(
          trajectory_id=f"{instance.instance_id}-{attempt}", task_id=instance.instance_id,
          attempt=attempt, messages=messages, exit_status="Submitted",
          outcome={"resolved": resolved})
      data.write_miniswe_trajectory(trajectory, str(
          folder / f"attempt_{attempt}" / instance.instance_id /
          f"{instance.instance_id}.traj.json"))
  return str(folder)


MINI_POLICY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, intermediate_size=128,
                   moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                   max_position_embeddings=2048)


def mini_config(experiment, tmp_path, dataset: str, *, judge_url: str = "", sft_source: str = ""):
  """The miniature recipe config: every stage on, sized for seconds."""
  config = experiment.get_config("tiny")
  config.workdir = str(tmp_path / config.name)
  config.progress = False
  config.policy.update(MINI_POLICY)
  config.tasks.dataset = dataset
  config.tasks.update(dict(heldout_fraction=0.0, train_tasks=2, selection="first",
                           per_package=0))
  config.agent.update(dict(step_limit=4, output_limit_chars=300, command_timeout_s=30.0,
                           wall_time_limit_s=180.0, max_consecutive_format_errors=2))
  config.engine.update(dict(max_batch_size=4, max_seq_len=1536))
  config.sampling.max_tokens = 16
  config.sft.update(dict(source=sft_source, epochs=1, batch_size=8, microbatches=1,
                         seq_len=1536, max_tokens=1536, lr=1e-3, end_lr=1e-4, warmup_steps=0))
  config.rl.update(dict(iterations=2, prompts_per_iteration=2, oversample=0, batch_size=8,
                        microbatches=1, seq_len=1536, max_updates_per_iteration=2,
                        parallel_rollouts=4, lr=1e-3, end_lr=1e-3, chunk_size=512))
  config.rl.bar.update(dict(group_size=2, max_rollouts=6, stride=2,
                            positive_fraction=(0.25, 0.75)))
  if judge_url:
    config.judge.update(dict(kind="llm", url=judge_url, model="judge", retries=0,
                             timeout_s=30.0, max_workers=2))
  config.eval.update(dict(splits=("train",), k=2, max_instances=2, parallel=1, baseline=True))
  return config
