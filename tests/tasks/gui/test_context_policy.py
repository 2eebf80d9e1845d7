"""The last-k-screenshots context policy, checked against a reference written here from its
definition: of the messages that show images, only the last k keep them; every other message
is unchanged, and the history itself is never modified."""
import copy

from hypothesis import given, strategies as st

from orchard_jax.harness.browser_agent import OMITTED_SCREENSHOT, first_message, last_k_images

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def message(kind):
  if kind == "text":
    return {"role": "user", "content": "hello"}
  if kind == "tool":
    return {"role": "tool", "tool_call_id": "c1", "content": "Done: clicked."}
  if kind == "assistant":
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
  return {"role": "user", "content": [{"type": "text", "text": "Page: x"}, dict(IMAGE)]}


def reference(messages, k):
  image_rows = [i for i, m in enumerate(messages) if isinstance(m["content"], list)]
  keep = set(image_rows[max(len(image_rows) - k, 0):]) if k else set()
  out = []
  for i, m in enumerate(messages):
    if i in image_rows and i not in keep:
      out.append({**m, "content": [p if p["type"] == "text" else
                                   {"type": "text", "text": OMITTED_SCREENSHOT}
                                   for p in m["content"]]})
    else:
      out.append(m)
  return out


@given(kinds=st.lists(st.sampled_from(["text", "tool", "assistant", "image"]), max_size=20),
       k=st.integers(0, 5))
def test_only_the_last_k_screenshots_are_sent(kinds, k):
  messages = [message(kind) for kind in kinds]
  before = copy.deepcopy(messages)
  sent = last_k_images(messages, k)
  assert sent == reference(messages, k)
  assert messages == before   # the kept history is untouched
  shown = sum(1 for m in sent if isinstance(m["content"], list)
              for p in m["content"] if p["type"] == "image_url")
  assert shown == min(k, kinds.count("image"))


def test_first_message_puts_the_task_before_the_page():
  content = first_message("Buy a mug", message("image"))
  assert content[0] == {"type": "text", "text": "Task: Buy a mug"}
  assert content[-1]["type"] == "image_url"
