"""The training-task synthesiser: at least 200 tasks, deterministic, disjoint from the evaluation
set, every reference solution passing and a do-nothing answer failing (so the graders are not
vacuous), the cached set, and teacher-proposed tasks going through the same gates. Solutions are
played through the ReAct harness against the real services in-process (LocalWorld), which the
evaluation-task test shows grades exactly as the sandboxed world does."""
import collections
import json

import pytest

from orchard_jax.harness import ChatModel, ToolAgent, ToolAgentConfig
from orchard_jax.tasks.claw import synth
from orchard_jax.tasks.claw.episode import run_episode
from orchard_jax.tasks.claw.solutions import ScriptedModel
from orchard_jax.tasks.claw.task import Step, eval_tasks, overlap
from tests.openai_stub import ChatStub

EVAL = eval_tasks()


def play(task, steps=None):
  agent = lambda world, backend, instruction: ToolAgent(  # noqa: E731
      ScriptedModel(steps or task.reference), backend, ToolAgentConfig()).run(instruction)
  return run_episode(task, None, agent).outcome


@pytest.fixture(scope="module")
def tasks():
  return synth.synthesize(240, seed=0, evaluation=EVAL)


def test_at_least_200_distinct_tasks_disjoint_from_evaluation(tasks):
  assert len(tasks) >= 200
  assert len({t.id for t in tasks}) == len(tasks)
  assert len({t.fingerprint() for t in tasks}) == len(tasks)
  assert overlap(tasks, EVAL) == []
  assert not {t.id for t in tasks} & {t.id for t in EVAL}
  services = collections.Counter(s for t in tasks for s in t.services)
  assert set(services) == {"mail", "calendar", "contacts", "todos", "notes", "files"}
  assert 0.1 < sum(bool(t.faults) for t in tasks) / len(tasks) < 0.35
  assert sum(len(t.services) > 1 for t in tasks) >= 30
  assert [t.raw for t in synth.synthesize(40, seed=0)] == [t.raw for t in tasks[:40]]
  assert [t.raw for t in synth.synthesize(40, seed=1)] != [t.raw for t in tasks[:40]]


def test_references_pass_and_doing_nothing_fails(tasks):
  result = synth.validate(tasks, play)
  assert result.dropped == {} and len(result.kept) == len(tasks)
  idle = (Step(answer="Done."),)
  assert [t.id for t in tasks if play(t, idle).passed] == []


def test_local_world_grades_evaluation_tasks_as_the_sandbox_does():
  for task in EVAL:                     # test_eval_tasks plays the same in real sandboxes
    assert play(task).passed, task.id
    assert not play(task, task.wrong).passed, task.id


def test_training_set_is_cached_and_a_broken_template_is_refused(tmp_path, monkeypatch):
  built, path = synth.training_set(30, 0, play, evaluation=EVAL, folder=str(tmp_path))
  assert len(built) == 30 and path.endswith(".jsonl")
  again, same = synth.training_set(30, 0, lambda t: pytest.fail("replayed"),
                                   evaluation=EVAL, folder=str(tmp_path))
  assert same == path and [t.raw for t in again] == [t.raw for t in built]

  class Failed:
    passed, status, error = False, "failed", None
    def failures(self):
      return ["no"]
  with pytest.raises(synth.TaskFormatError, match="passed their reference"):
    synth.training_set(20, 1, lambda t: Failed(), folder=str(tmp_path))


def test_teacher_tasks_go_through_the_same_gates():
  good = synth.draft("todos_add", 5)
  good.update(id="teacher_todo_1", split="eval")
  copy_of_eval = EVAL[0].to_dict()
  replies = ["no JSON here", json.dumps({"id": "teacher_bad", "services": ["fax"]}),
             f"Here you go:\n```json\n{json.dumps(good)}\n```", json.dumps(copy_of_eval),
             json.dumps(good)]
  with ChatStub(lambda request: replies[min(request.index, len(replies) - 1)]) as stub, \
       ChatModel(stub.root + "/v1", retries=0) as model:
    made, rejected = synth.teacher_tasks(model, n=3, evaluation=EVAL, max_attempts=5)
    prompt = stub.requests[0].body["messages"][0]["content"]
  assert [t.id for t in made] == ["teacher_todo_1"] and made[0].split == "train"
  assert sorted(rejected) == [0, 1, 3, 4]
  assert "JSON" in rejected[0] or "Expecting" in rejected[0]
  assert "services" in rejected[1] and "duplicates" in rejected[3] and "duplicates" in rejected[4]
  assert '"solutions"' in prompt and "teacher_" in prompt
  assert synth.validate(made, play).kept == made
