"""GUI distillation through the loop's distillation stage (agentic/distill.py, job
gui_distill.collect) with a teacher behind a real HTTP endpoint that is shown the screenshots.

The teacher is a scripted OpenAI-compatible server (tests/openai_stub.py), because no vision
model that could solve a task runs on this machine: for each request it checks that the last
screenshot came as an image part (a PNG data URL at the browser's viewport size), keeps its
bytes, and answers with the scripted expert's next tool call for that task (the expert's calls
were recorded first by playing it through the same harness; a MiniWoB++ task with a fixed seed
shows the same page, so the same calls solve it). The run must then grade every attempt solved
by the task's own reward, and store text-only records whose images are the very bytes the
teacher was sent."""
import base64
import hashlib
import io
import json

import pytest
from PIL import Image

from experiments import gui_distill
from orchard_jax import data
from orchard_jax.recipes import gui as gui_recipe
from tests.openai_stub import ChatStub

pytestmark = pytest.mark.slow


def _text(message) -> str:
  content = message.get("content")
  if isinstance(content, list):
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")
  return content or ""


def _images(messages) -> list:
  return [p for m in messages if isinstance(m.get("content"), list) for p in m["content"]
          if p.get("type") == "image_url"]


def test_a_teacher_endpoint_sees_each_screenshot_and_its_calls_are_distilled(env_client,
                                                                            tmp_path):
  config = gui_distill.get_config("tiny")
  config.workdir = str(tmp_path / "run")
  config.progress = False
  config.tasks.update(dict(miniwob="click-test", miniwob_seeds=1, miniwob_eval_seeds=1))
  domain = gui_recipe.GUIDomain(config)
  tasks = domain.load_tasks()
  assert len(tasks) == 2

  class Run:
    store = data.TrajectoryStore(str(tmp_path / "expert"))
  experts = domain.seed_trajectories(Run, tasks, env_client)
  assert all(t.resolved for t in experts)
  # A task is known to the teacher by its first screenshot (the seed's page; stored by digest
  # in the expert's trajectory), then by the id of its own first tool call in the history.
  first = [_images(t.messages)[0]["image_url"]["url"].split(":")[-1] for t in experts]
  script = [[c["function"] for m in t.messages if m["role"] == "assistant"
             for c in m.get("tool_calls") or []] for t in experts]
  shown = []          # sha256 of every PNG the teacher was sent

  def teacher(request):
    messages = request.body["messages"]
    images = _images(messages)
    assert len(images) == 1, images          # the last screenshot, as an image part
    url = images[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    png = base64.b64decode(url.split(",", 1)[1])
    assert Image.open(io.BytesIO(png)).size == tuple(config.browser.viewport)
    shown.append(hashlib.sha256(png).hexdigest())
    turns = [m for m in messages if m["role"] == "assistant"]
    if turns:
      task = int(turns[0]["tool_calls"][0]["id"].split("_")[1])
    else:
      task = first.index(shown[-1])          # the page of a seed the expert played
    return {"tool_calls": [{"id": f"call_{task}_{len(turns)}", "type": "function",
                            "function": dict(script[task][len(turns)])}]}

  with ChatStub(teacher) as stub:
    config.teacher.update(dict(url=stub.root + "/v1", model="vl-teacher", api_key_env=""))
    summary = gui_recipe.distill(config)
    requests = list(stub.requests)
  assert summary.completed == summary.resolved == 2 and summary.aborted == 0
  assert all(r.body["model"] == "vl-teacher" for r in requests)
  assert len(shown) == len(requests) == sum(len(calls) for calls in script)
  with data.TrajectoryStore(str(tmp_path / "run" / "store")) as store:
    distilled = store.trajectories(experiment="gui_distill")
    assert sorted(t.task_id for t in distilled) == sorted(t.id for t in tasks)
    assert all(t.resolved and t.metadata["text_only"] for t in distilled)
    recorded = [c for t in distilled for c in store.model_calls(t.session_id)]
    assert len(recorded) == len(requests) and all(c.text_only for c in recorded)
    digests = [d for c in recorded for d in c.images]
    assert sorted(d.split(":")[-1] for d in digests) == sorted(shown)
    assert all(store.has_image(d) for d in digests)
    assert "base64" not in json.dumps([t.messages for t in distilled])
