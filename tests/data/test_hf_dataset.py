"""Export to a Hugging Face datasets file, read back with datasets' own loaders."""
import json

import datasets
import pytest

from orchard_jax.data import DataError, Trajectory, chat_messages, export_hf_dataset

BASH = {"type": "function", "function": {"name": "bash", "parameters": {
  "type": "object", "properties": {"command": {"type": "string"}}}}}


def _trajectories():
  agent = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": [{"type": "text", "text": "Fix "}, {"type": "text", "text": "it"}]},
    {"role": "assistant", "content": None, "reasoning_content": "look first",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "bash", "arguments": {"command": "ls ü"}}}],
     "extra": {"cost": 0.5}},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py\n"},
    {"role": "assistant", "content": "done"},
    {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
  ]
  return [
    Trajectory(trajectory_id="a", task_id="t1", messages=agent, tools=[BASH],
               exit_status="Submitted", submission="diff", outcome={"resolved": True},
               rewards={"binary": 1.0}, experiment="e", iteration=1, metadata={"k": [1]}),
    Trajectory(trajectory_id="b", task_id="t2", attempt=3,
               messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]),
  ]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ""])
def test_export_reads_back_with_datasets(tmp_path, suffix):
  path = tmp_path / f"data{suffix}"
  export_hf_dataset(_trajectories(), path)
  if suffix == ".parquet":
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
  elif suffix == ".jsonl":
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
  else:
    ds = datasets.load_from_disk(str(path))
  assert ds.num_rows == 2
  first, second = ds[0], ds[1]
  assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "tool",
                                                    "assistant"]
  assert first["messages"][1]["content"] == "Fix it"
  call = first["messages"][2]["tool_calls"][0]
  assert call["function"]["name"] == "bash"
  assert json.loads(call["function"]["arguments"]) == {"command": "ls ü"}
  assert first["messages"][2]["reasoning_content"] == "look first"
  assert first["messages"][3]["tool_call_id"] == "c1"
  assert json.loads(first["tools"]) == [BASH]
  assert (first["resolved"], second["resolved"]) == (True, None)
  assert json.loads(first["rewards"]) == {"binary": 1.0}
  assert json.loads(first["metadata"]) == {"k": [1]}
  assert (first["experiment"], first["iteration"], second["attempt"]) == ("e", 1, 3)


def test_exported_messages_render_like_the_originals(tok):
  (row, _) = export_hf_dataset(_trajectories())
  original = _trajectories()[0]
  assert tok.render_chat_text(row["messages"], json.loads(row["tools"])) == (
    tok.render_chat_text(chat_messages(original.messages), original.tools))


def test_nothing_to_export():
  with pytest.raises(DataError, match="no trajectories"):
    export_hf_dataset([])
