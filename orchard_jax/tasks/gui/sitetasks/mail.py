"""Task families of mail.test: reply, forward, compose, delete by sender, star."""
from __future__ import annotations

from orchard_jax.tasks.gui.driver import mail as site
from orchard_jax.tasks.gui.expert import click, fill
from orchard_jax.tasks.gui.sitetasks.base import Template, fail, ok, same_text

INBOX = {m["id"]: m for m in site.inbox()}
START = "http://mail.test/"


def _sent(state: dict) -> list:
  return [m for m in state.get("messages", []) if m["folder"] == "sent"]


def _open(view, message_id: int):
  yield from click(view, f"tr[data-message-id='{message_id}'] a")


def _send(view, to: str, subject: str, body: str, *, keep_body: bool = False):
  yield from fill(view, "#to", to)
  yield from fill(view, "#subject", subject)
  yield from click(view, "#body")
  if keep_body:   # type above the quoted text
    yield ("press_keys", {"keys": ["Control", "Home"]})
    yield ("write", {"text": body})
  else:
    yield ("write", {"text": body, "clear": True})
  yield from click(view, "#send")
  yield ("done", {})


class Reply(Template):
  """Reply to a message with a given text."""
  family = "mail/reply"
  site = "mail"

  def params(self):
    texts = ("Approved, thanks!", "Yes, count me in.", "Option B works for me.",
             "Thanks, I will change it today.", "Sounds good, let's keep the terms.",
             "Happy to, February works.")
    chosen = (1, 2, 3, 4, 6, 12)
    return [{"message": m, "text": t} for m, t in zip(chosen, texts)]

  def instruction(self, p):
    m = INBOX[p["message"]]
    return f"Reply to {m['from_name']}'s email \"{m['subject']}\" with the message: {p['text']}"

  def check(self, p, state, answer):
    m = INBOX[p["message"]]
    sent = _sent(state)
    if len(sent) != 1:
      return fail(f"expected exactly one sent message, found {len(sent)}")
    reply = sent[0]
    problems = []
    if [a.lower() for a in reply["to"]] != [m["from_address"]]:
      problems.append(f"sent to {reply['to']} instead of {m['from_address']}")
    if not same_text(reply["subject"], "Re: " + m["subject"]):
      problems.append(f"subject {reply['subject']!r} instead of 'Re: {m['subject']}'")
    if " ".join(p["text"].split()).lower() not in " ".join(reply["body"].split()).lower():
      problems.append(f"the message does not say {p['text']!r}")
    return fail("; ".join(problems)) if problems else ok("the reply matches")

  def expert(self, p, view):
    yield from _open(view, p["message"])
    yield from click(view, ".actions a", text="Reply")
    yield from click(view, "#body")
    yield ("press_keys", {"keys": ["Control", "Home"]})
    yield ("write", {"text": p["text"]})
    yield from click(view, "#send")
    yield ("done", {})

  def wrong(self, p, view):
    yield from _open(view, p["message"])
    yield from click(view, ".actions a", text="Forward")   # forwards to the sender instead
    yield from _send(view, INBOX[p["message"]]["from_address"], "Fwd: " +
                     INBOX[p["message"]]["subject"], p["text"], keep_body=True)


class Forward(Template):
  """Forward a message to an address."""
  family = "mail/forward"
  site = "mail"

  def params(self):
    pairs = ((1, "finance@acme.test"), (3, "design-team@acme.test"), (6, "legal@acme.test"),
             (9, "payroll@acme.test"), (11, "accounts@acme.test"), (5, "ben@acme.test"))
    return [{"message": m, "to": to} for m, to in pairs]

  def instruction(self, p):
    m = INBOX[p["message"]]
    return f"Forward the email \"{m['subject']}\" from {m['from_name']} to {p['to']}."

  def check(self, p, state, answer):
    m = INBOX[p["message"]]
    sent = _sent(state)
    if len(sent) != 1:
      return fail(f"expected exactly one sent message, found {len(sent)}")
    fwd = sent[0]
    problems = []
    if [a.lower() for a in fwd["to"]] != [p["to"]]:
      problems.append(f"sent to {fwd['to']} instead of {p['to']}")
    if "fwd" not in fwd["subject"].lower() or m["subject"].lower() not in fwd["subject"].lower():
      problems.append(f"subject {fwd['subject']!r} is not a forward of {m['subject']!r}")
    if m["body"].splitlines()[0].strip() not in fwd["body"]:
      problems.append("the original message is not in the body")
    return fail("; ".join(problems)) if problems else ok("the forward matches")

  def _forward(self, p, view, message_id):
    yield from _open(view, message_id)
    yield from click(view, ".actions a", text="Forward")
    yield from fill(view, "#to", p["to"])
    yield from click(view, "#send")
    yield ("done", {})

  def expert(self, p, view):
    yield from self._forward(p, view, p["message"])

  def wrong(self, p, view):   # forwards a different message
    other = next(i for i in INBOX if i != p["message"] and
                 INBOX[i]["subject"] != INBOX[p["message"]]["subject"])
    yield from self._forward(p, view, other)


class DeleteFrom(Template):
  """Delete every message from one sender (and nothing else)."""
  family = "mail/delete_from"
  site = "mail"

  def params(self):
    senders = sorted({m["from_address"] for m in INBOX.values()})
    return [{"sender": s} for s in senders if sum(m["from_address"] == s for m in
                                                  INBOX.values()) >= 2]

  def _name(self, p):
    return next(m["from_name"] for m in INBOX.values() if m["from_address"] == p["sender"])

  def instruction(self, p):
    return f"Delete every email from {self._name(p)} ({p['sender']}), and no other email."

  def check(self, p, state, answer):
    messages = state.get("messages", [])
    kept = [m["subject"] for m in messages if m["from_address"] == p["sender"]
            and m["folder"] != "trash"]
    extra = [m["subject"] for m in messages if m["from_address"] != p["sender"]
             and m["folder"] == "trash"]
    if kept or extra:
      return fail(f"not deleted: {kept}; deleted by mistake: {extra}")
    return ok(f"every email from {p['sender']} is in the trash")

  def _delete(self, view, ids):
    for message_id in ids:
      yield from _open(view, message_id)
      yield from click(view, ".actions button", text="Delete")
    yield ("done", {})

  def expert(self, p, view):
    yield from self._delete(view, [i for i, m in INBOX.items() if m["from_address"] == p["sender"]])

  def wrong(self, p, view):   # only the newest one
    ids = [i for i, m in INBOX.items() if m["from_address"] == p["sender"]]
    yield from self._delete(view, ids[:1])


class Compose(Template):
  """Write a new message to one or two people."""
  family = "mail/compose"
  site = "mail"

  def params(self):
    return [{"to": ["ben@acme.test"], "subject": "Lunch", "body": "See you at 12:30."},
            {"to": ["alice@acme.test", "emma@acme.test"], "subject": "Offsite rooms",
             "body": "Please book two rooms for the offsite."},
            {"to": ["carla@studio.test"], "subject": "Invoice received",
             "body": "Thanks, the invoice will be paid this week."},
            {"to": ["fatima@university.test", "daniel@partners.test"],
             "subject": "Schedule", "body": "Could we talk on Tuesday at 10?"}]

  def instruction(self, p):
    who = " and ".join(p["to"])
    return (f"Send a new email to {who} with the subject \"{p['subject']}\" and the text "
            f"\"{p['body']}\".")

  def check(self, p, state, answer):
    sent = _sent(state)
    if len(sent) != 1:
      return fail(f"expected exactly one sent message, found {len(sent)}")
    m = sent[0]
    problems = []
    if sorted(a.lower() for a in m["to"]) != sorted(p["to"]):
      problems.append(f"sent to {m['to']} instead of {p['to']}")
    if not same_text(m["subject"], p["subject"]):
      problems.append(f"subject {m['subject']!r} instead of {p['subject']!r}")
    if not same_text(m["body"], p["body"]):
      problems.append(f"text {m['body']!r} instead of {p['body']!r}")
    return fail("; ".join(problems)) if problems else ok("the message matches")

  def expert(self, p, view):
    yield from click(view, "header nav a", text="Compose")
    yield from _send(view, ", ".join(p["to"]), p["subject"], p["body"])

  def wrong(self, p, view):   # only the first recipient
    yield from click(view, "header nav a", text="Compose")
    yield from _send(view, p["to"][0] if len(p["to"]) > 1 else "ben.okafor@acme.test",
                     p["subject"], p["body"])


class Star(Template):
  """Star one message (the others keep their stars)."""
  family = "mail/star"
  site = "mail"

  def params(self):
    return [{"message": i} for i in (1, 4, 6, 8, 12)]

  def instruction(self, p):
    m = INBOX[p["message"]]
    return f"Star the email \"{m['subject']}\" from {m['from_name']}."

  def check(self, p, state, answer):
    starred = sorted(m["id"] for m in state.get("messages", []) if m["starred"])
    wanted = sorted({i for i, m in INBOX.items() if m["starred"]} | {p["message"]})
    return ok("the right emails are starred") if starred == wanted else fail(
        f"starred emails are {starred}, expected {wanted}")

  def expert(self, p, view):
    yield from click(view, f"tr[data-message-id='{p['message']}'] button.star")
    yield ("done", {})

  def wrong(self, p, view):   # stars the message below it
    ids = view.js("[...document.querySelectorAll('tr[data-message-id]')]"
                  ".map(r => +r.dataset.messageId)")
    other = ids[(ids.index(p["message"]) + 1) % len(ids)]
    if INBOX[other]["starred"]:
      other = ids[(ids.index(p["message"]) + 2) % len(ids)]
    yield from click(view, f"tr[data-message-id='{other}'] button.star")
    yield ("done", {})


TEMPLATES = (Reply(), Forward(), DeleteFrom(), Compose(), Star())
