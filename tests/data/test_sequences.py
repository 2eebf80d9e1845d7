"""Model calls -> training sequences: recorded ids kept exactly, masks and log-probs aligned."""
import numpy as np
import pytest

from orchard_jax.data import (
  DataError, ModelCall, TextOnlyRecordError, TrainingSequence, lm_sequences,
  sequences_from_model_calls, sft_sequences_from_messages)

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
  "type": "object", "properties": {"command": {"type": "string"}}}}}]


def _spelled(tok, text):
  """Ids of `text` one character per token: a valid sample, but not how encode() splits it."""
  ids = [tok.encode(ch) for ch in text]
  assert all(len(i) == 1 for i in ids)
  return [i[0] for i in ids]


def _proxy_session(tok):
  """A two-call agent session recorded the way the proxy records it: the second prompt is the
  first prompt + the sampled ids + the new turn's ids (never a re-rendering)."""
  messages = [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": "List the files.\n"}]
  prompt1 = tok.render_chat(messages, TOOLS)
  out1 = (tok.encode('<tool_call>\n{"name": "bash", "arguments": {"command": "')
          + _spelled(tok, "ls") + tok.encode('"}}\n</tool_call>') + [tok.eos_id])
  turn = tok.encode("\n<|im_start|>user\n<tool_response>\na.py\nb.py\n\n</tool_response>"
                    "<|im_end|>\n<|im_start|>assistant\n")
  prompt2 = prompt1 + out1 + turn
  out2 = _spelled(tok, "Two files.") + [tok.eos_id]
  rng = np.random.default_rng(0)
  lp1, lp2 = (-rng.random(len(out1))).tolist(), (-rng.random(len(out2))).tolist()
  calls = [
    ModelCall(session_id="s", call_index=0, prompt_ids=prompt1, output_ids=out1,
              output_logprobs=lp1, messages=messages, tools=TOOLS),
    ModelCall(session_id="s", call_index=1, prompt_ids=prompt2, output_ids=out2,
              output_logprobs=lp2, tools=TOOLS),
  ]
  return calls, (prompt1, out1, lp1, turn, out2, lp2)


def test_rl_sequence_keeps_sampled_ids_and_aligns_logprobs(tok):
  calls, (prompt1, out1, lp1, turn, out2, lp2) = _proxy_session(tok)
  (seq,) = sequences_from_model_calls(calls, mode="rl")
  expected_ids = prompt1 + out1 + turn + out2
  np.testing.assert_array_equal(seq.input_ids, expected_ids)
  weights = np.zeros(len(expected_ids), np.float32)
  logprobs = np.zeros(len(expected_ids), np.float32)
  actions = np.full(len(expected_ids), -1)
  a, b = len(prompt1), len(prompt1) + len(out1)
  weights[a:b], logprobs[a:b], actions[a:b] = 1, lp1, 0
  c = b + len(turn)
  weights[c:], logprobs[c:], actions[c:] = 1, lp2, 1
  np.testing.assert_array_equal(seq.loss_weights, weights)
  np.testing.assert_allclose(seq.old_logprobs, logprobs, rtol=0, atol=1e-7)
  np.testing.assert_array_equal(seq.action_ids, actions)
  assert seq.loss_weights[0] == 0 and seq.call_indices == (0, 1) and seq.logprobs_known


def test_re_rendering_the_chat_would_change_the_ids(tok):
  """docs/cases.md 1 and 2: rendering the same chat again gives other ids than were sampled."""
  calls, _ = _proxy_session(tok)
  (seq,) = sequences_from_model_calls(calls, mode="rl")
  messages = calls[0].messages + [
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "bash",
                                                      "arguments": {"command": "ls"}}}]},
    {"role": "tool", "content": "a.py\nb.py\n"},
    {"role": "assistant", "content": "Two files."}]
  rendered = tok.render_chat_text(messages, TOOLS, add_generation_prompt=False)
  assert tok.decode(seq.input_ids) + "\n" == rendered  # same text ...
  assert tok.encode(rendered)[:len(seq)] != seq.input_ids.tolist()  # ... other ids


def test_a_diverged_prompt_starts_a_new_sequence(tok):
  calls, (prompt1, out1, *_rest) = _proxy_session(tok)
  compacted = tok.render_chat([{"role": "user", "content": "Summary so far: two files."}])
  calls.append(ModelCall(session_id="s", call_index=2, segment_index=1, prompt_ids=compacted,
                         output_ids=[5, 6, tok.eos_id], output_logprobs=[-1.0, -2.0, -0.5]))
  first, second = sequences_from_model_calls(calls, mode="rl")
  assert first.call_indices == (0, 1) and second.call_indices == (2,)
  assert second.segment_index == 1
  np.testing.assert_array_equal(second.input_ids, compacted + [5, 6, tok.eos_id])
  np.testing.assert_array_equal(second.loss_weights, [0] * len(compacted) + [1, 1, 1])
  np.testing.assert_allclose(second.old_logprobs[-3:], [-1.0, -2.0, -0.5])
  np.testing.assert_array_equal(second.action_ids[-3:], [2, 2, 2])


def test_calls_are_ordered_and_grouped_by_session(tok):
  calls, _ = _proxy_session(tok)
  other = ModelCall(session_id="a-first", call_index=0, prompt_ids=[1, 2], output_ids=[3],
                    output_logprobs=[-0.1])
  seqs = sequences_from_model_calls([calls[1], other, calls[0]], mode="rl")
  assert [s.session_id for s in seqs] == ["a-first", "s"]
  assert seqs[1].call_indices == (0, 1)


def test_text_only_records_sft_tokenises_rl_refuses(tok):
  messages = [{"role": "user", "content": "Say hi."}]
  response = {"role": "assistant", "content": "Hi there!"}
  call = ModelCall(session_id="t", call_index=0, messages=messages, response=response,
                   text_only=True)
  with pytest.raises(TextOnlyRecordError, match="text-only"):
    sequences_from_model_calls([call], mode="rl")
  with pytest.raises(DataError, match="tokenizer"):
    sequences_from_model_calls([call], mode="sft")
  (seq,) = sequences_from_model_calls([call], mode="sft", tokenizer=tok)
  prompt = tok.encode("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")
  completion = tok.encode("Hi there!") + [tok.eos_id]
  np.testing.assert_array_equal(seq.input_ids, prompt + completion)
  np.testing.assert_array_equal(seq.loss_weights, [0] * len(prompt) + [1] * len(completion))
  assert not seq.logprobs_known and not seq.old_logprobs.any()


def test_rl_refuses_calls_without_logprobs():
  call = ModelCall(session_id="s", call_index=0, prompt_ids=[1, 2], output_ids=[3, 4])
  with pytest.raises(DataError, match="no output_logprobs"):
    sequences_from_model_calls([call], mode="rl")
  (seq,) = sequences_from_model_calls([call], mode="sft")
  assert not seq.logprobs_known


def test_sft_from_harness_messages_trains_every_assistant_turn(tok):
  messages = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "Looking.", "extra": {"cost": 0.1},
     "tool_calls": [{"id": "c", "type": "function",
                     "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "c", "content": "x.py\n", "extra": {"returncode": 0}},
    {"role": "assistant", "content": "Done."},
    {"role": "exit", "content": "Submitted", "extra": {"exit_status": "Submitted"}},
  ]
  (seq,) = sft_sequences_from_messages(messages, tok, tools=TOOLS, session_id="traj-1")
  full = tok.render_chat_text([m for m in messages if m["role"] != "exit"], TOOLS,
                              add_generation_prompt=False)
  np.testing.assert_array_equal(seq.input_ids, tok.encode(full.removesuffix("\n")))
  trained = seq.input_ids[seq.loss_weights > 0]
  assert tok.decode(trained) == (
    'Looking.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    "<|im_end|>Done.<|im_end|>")
  assert sorted(set(seq.action_ids[seq.loss_weights > 0].tolist())) == [0, 1]


def test_action_weights_and_advantages():
  seq = TrainingSequence(input_ids=[1, 2, 3, 4, 5], loss_weights=[0, 1, 1, 0, 1],
                         old_logprobs=np.zeros(5), action_ids=[-1, 0, 0, -1, 1])
  np.testing.assert_array_equal(seq.with_action_weights({1: 0.5}).loss_weights,
                                [0, 0, 0, 0, 0.5])
  np.testing.assert_array_equal(seq.with_action_weights([2.0, 1.0]).loss_weights,
                                [0, 2, 2, 0, 1])
  np.testing.assert_array_equal(seq.with_advantage(-0.75).advantages, [-0.75] * 5)
  with pytest.raises(DataError, match="shape"):
    TrainingSequence(input_ids=[1, 2], loss_weights=[0], old_logprobs=[0, 0],
                     action_ids=[-1, -1])


def test_lm_sequences_chunk_documents(tok):
  docs = ["def f():\n    return 1\n" * 20, "x = 2\n"]
  seqs = lm_sequences(docs, tok, max_len=16)
  end = tok.token_to_id("<|endoftext|>")
  expected = []
  for doc in docs:
    ids = tok.encode(doc) + [end]
    expected += [ids[i:i + 16] for i in range(0, len(ids), 16) if len(ids[i:i + 16]) > 1]
  assert [s.input_ids.tolist() for s in seqs] == expected
  for s in seqs:
    np.testing.assert_array_equal(s.loss_weights, [0] + [1] * (len(s) - 1))
  with pytest.raises(DataError, match="max_len"):
    lm_sequences(docs, tok, max_len=1)


def test_undelivered_calls_are_left_out_and_temperatures_travel(tok):
  """A call its caller never got (`delivered=False`) is not trained on and does not break the
  session's sequence; each sampled token carries its call's temperature, context tokens 1."""
  calls, (prompt1, out1, lp1, turn, out2, lp2) = _proxy_session(tok)
  first, second = calls
  first.temperature, second.temperature = 0.7, 0.9
  lost = ModelCall(session_id="s", call_index=1, prompt_ids=prompt1 + out1 + turn,
                   output_ids=out2[:3], output_logprobs=lp2[:3], delivered=False,
                   temperature=0.7, finish_reason="abort")
  second.call_index = 2
  [sequence] = sequences_from_model_calls([first, lost, second], mode="rl")
  assert sequence.call_indices == (0, 2)
  assert list(sequence.input_ids) == prompt1 + out1 + turn + out2
  n1 = len(prompt1) + len(out1)
  expected = np.ones(len(sequence), np.float32)
  expected[len(prompt1):n1] = 0.7
  expected[n1 + len(turn):] = 0.9
  np.testing.assert_array_equal(sequence.temperatures, expected)
  sampled = sequence.action_ids[sequence.loss_weights > 0]
  assert sorted(set(sampled.tolist())) == [0, 1]          # delivered turns, counted 0, 1
  assert ModelCall.from_dict({"session_id": "old", "call_index": 0}).temperature == 1.0
  with pytest.raises(Exception, match="temperature"):
    ModelCall(session_id="s", call_index=0, temperature=0.0)
