"""mail.test: a web mail client for one user (Jordan Lee, jordan@mail.test).

Pages: / (inbox with search), /folder/<inbox|starred|sent|trash>, /message/<id> (read; reply,
forward, star, delete, restore), /compose (new, reply or forward; To may hold several
addresses separated by commas). State: every message with its folder, read and starred flags;
sending appends to the sent folder. `state()` is what a task's checker reads.
"""
from __future__ import annotations

import copy
import re
from typing import List, Optional

from .web import Request, Response, Site, esc, redirect

USER_NAME, USER_ADDRESS = "Jordan Lee", "jordan@mail.test"
FOLDERS = ("inbox", "starred", "sent", "trash")
_ADDRESS = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\Z")

# (id, from name, from address, subject, date, body)
_INBOX = [
    (1, "Alice Moreno", "alice@acme.test", "Q3 budget review",
     "2026-11-28 09:12", "Hi Jordan,\n\nThe Q3 budget is attached for review. Could you confirm "
     "by Friday whether the marketing line looks right?\n\nThanks,\nAlice"),
    (2, "Ben Okafor", "ben@acme.test", "Team lunch on Thursday",
     "2026-11-28 11:40", "Hey, we're booking a team lunch on Thursday at 12:30. Are you in?\n\nBen"),
    (3, "Carla Diaz", "carla@studio.test", "Logo drafts v2",
     "2026-11-27 16:05", "Hi Jordan, here are the second round of logo drafts. I prefer option "
     "B but happy to hear your thoughts.\n\nCarla"),
    (4, "IT Helpdesk", "helpdesk@acme.test", "Password expires in 3 days",
     "2026-11-27 08:00", "Your account password expires in 3 days. Change it from the "
     "intranet settings page."),
    (5, "Alice Moreno", "alice@acme.test", "Offsite agenda",
     "2026-11-26 14:22", "Draft agenda for the December offsite: strategy in the morning, team "
     "workshops in the afternoon. Comments welcome.\n\nAlice"),
    (6, "Daniel Kim", "daniel@partners.test", "Contract renewal",
     "2026-11-26 10:03", "Hello Jordan, our contract renews on 1 January. Please let me know if "
     "you'd like to change the terms.\n\nBest regards,\nDaniel Kim"),
    (7, "Newsletter", "news@technews.test", "This week in tech",
     "2026-11-25 07:30", "Top stories this week: new chips, faster browsers and more."),
    (8, "Ben Okafor", "ben@acme.test", "Re: Sprint planning",
     "2026-11-24 15:48", "Sprint planning moved to Monday 10:00. Room 4B.\n\nBen"),
    (9, "Emma Novak", "emma@acme.test", "Travel reimbursement",
     "2026-11-24 09:55", "Hi Jordan, your travel reimbursement for the Berlin trip was approved "
     "and will be paid with the next salary.\n\nEmma"),
    (10, "Newsletter", "news@technews.test", "Weekend deals",
     "2026-11-22 07:30", "Deals of the weekend on laptops, phones and headphones."),
    (11, "Carla Diaz", "carla@studio.test", "Invoice #2026-114",
     "2026-11-21 12:10", "Please find the invoice for the October design work. Payment within 30 "
     "days.\n\nCarla"),
    (12, "Fatima Zahra", "fatima@university.test", "Guest lecture invitation",
     "2026-11-20 18:20", "Dear Jordan, would you give a guest lecture on product design in "
     "February? Dates are flexible.\n\nKind regards,\nFatima"),
]


def inbox() -> List[dict]:
  """The mailbox's initial messages (tasks compute their expected answers from these)."""
  return [dict(id=r[0], from_name=r[1], from_address=r[2], to=[USER_ADDRESS], subject=r[3],
               date=r[4], body=r[5], folder="inbox", read=r[0] > 6, starred=r[0] in (3, 9))
          for r in _INBOX]


def addresses(text: str) -> List[str]:
  """The addresses of a To field (comma or semicolon separated, whitespace ignored)."""
  return [a.strip() for a in re.split(r"[,;]", text) if a.strip()]


class Mail(Site):
  name = "mail"
  title = "Mail"
  nav = (("Inbox", "/"), ("Starred", "/folder/starred"), ("Sent", "/folder/sent"),
         ("Trash", "/folder/trash"), ("Compose", "/compose"))
  style = """
.list{width:100%} .list td{vertical-align:top} tr.unread td{font-weight:bold}
.star{background:none;border:none;color:#b8860b;font-size:18px;padding:0 4px}
.body{white-space:pre-wrap;background:#fff;border:1px solid #ddd;padding:12px}
.actions form{display:inline} .actions{display:flex;gap:8px;margin:10px 0}
textarea{width:100%;height:200px} .field input{width:100%}
"""

  def __init__(self):
    super().__init__()
    self.messages: List[dict] = []
    for method, pattern, handler in (
        ("GET", "/", self.inbox_page), ("GET", r"/folder/(?P<folder>[a-z]+)", self.folder_page),
        ("GET", r"/message/(?P<id>\d+)", self.message_page),
        ("POST", r"/message/(?P<id>\d+)/(?P<op>star|unstar|delete|restore|unread)", self.flag),
        ("GET", "/compose", self.compose), ("POST", "/send", self.send)):
      self.route(method, pattern, handler)

  def reset(self, fixtures: dict) -> None:
    """fixtures: {"messages": [...]} replaces the default mailbox (optional)."""
    self.messages = copy.deepcopy(fixtures.get("messages") or inbox())
    self.flash = None

  def state(self) -> dict:
    return {"messages": copy.deepcopy(self.messages)}

  def _get(self, message_id: str) -> Optional[dict]:
    return next((m for m in self.messages if str(m["id"]) == str(message_id)), None)

  def _table(self, messages: List[dict], folder: str) -> str:
    if not messages:
      return "<p>No messages.</p>"
    rows = []
    for m in messages:
      who = (f"To: {esc(', '.join(m['to']))}" if m["folder"] == "sent"
             else esc(m["from_name"]))
      star = "unstar" if m["starred"] else "star"
      rows.append(
          f"<tr class='{'read' if m['read'] else 'unread'}' data-message-id='{m['id']}'><td>"
          f"<form method='post' action='/message/{m['id']}/{star}'><button class='star' "
          f"type='submit' aria-label='{star.title()} {esc(m['subject'])}'>"
          f"{'&#9733;' if m['starred'] else '&#9734;'}</button></form></td><td>{who}</td>"
          f"<td><a href='/message/{m['id']}'>{esc(m['subject'])}</a></td>"
          f"<td class='muted'>{esc(m['date'])}</td></tr>")
    return f"<table class='list'>{''.join(rows)}</table>"

  def _listing(self, folder: str, query: str = "") -> Response:
    if folder == "starred":
      shown = [m for m in self.messages if m["starred"] and m["folder"] != "trash"]
    else:
      shown = [m for m in self.messages if m["folder"] == folder]
    words = query.lower().split()
    if words:
      shown = [m for m in shown if all(
          w in f"{m['from_name']} {m['from_address']} {m['subject']} {m['body']}".lower()
          for w in words)]
    shown.sort(key=lambda m: m["date"], reverse=True)
    search = (f"<form method='get' action='/' role='search'><input type='search' name='q' "
              f"value='{esc(query)}' placeholder='Search mail' aria-label='Search mail'> "
              f"<button type='submit'>Search</button></form>") if folder == "inbox" else ""
    unread = sum(1 for m in self.messages if m["folder"] == "inbox" and not m["read"])
    title = folder.title() + (f" ({unread} unread)" if folder == "inbox" else "")
    return Response(self.page(folder.title(), f"<h1>{esc(title)}</h1>{search}"
                              f"{self._table(shown, folder)}"))

  def inbox_page(self, req: Request) -> Response:
    return self._listing("inbox", req.arg("q"))

  def folder_page(self, req: Request) -> Response:
    folder = req.params["folder"]
    if folder not in FOLDERS:
      return Response(self.page("Not found", f"<h1>No folder {esc(folder)}</h1>"), 404)
    return self._listing(folder)

  def message_page(self, req: Request) -> Response:
    m = self._get(req.params["id"])
    if m is None:
      return Response(self.page("Not found", "<h1>No such message</h1>"), 404)
    m["read"] = True
    star = "unstar" if m["starred"] else "star"
    delete = "restore" if m["folder"] == "trash" else "delete"
    buttons = (f"<a class='button' href='/compose?reply={m['id']}'>Reply</a>"
               f"<a class='button' href='/compose?forward={m['id']}'>Forward</a>"
               + "".join(f"<form method='post' action='/message/{m['id']}/{op}'><button "
                         f"type='submit' class='secondary'>{label}</button></form>"
                         for op, label in ((star, star.title()), (delete, delete.title()),
                                           ("unread", "Mark unread"))))
    body = (f"<h1>{esc(m['subject'])}</h1><p><b>From:</b> {esc(m['from_name'])} "
            f"&lt;{esc(m['from_address'])}&gt;<br><b>To:</b> {esc(', '.join(m['to']))}<br>"
            f"<b>Date:</b> {esc(m['date'])}</p><div class='actions'>{buttons}</div>"
            f"<div class='body'>{esc(m['body'])}</div>")
    return Response(self.page(m["subject"], body))

  def flag(self, req: Request) -> Response:
    m = self._get(req.params["id"])
    if m is None:
      return redirect("/")
    op = req.params["op"]
    if op in ("star", "unstar"):
      m["starred"] = op == "star"
      self.flash = f"{'Starred' if op == 'star' else 'Unstarred'} '{m['subject']}'."
    elif op == "delete":
      m["folder"] = "trash"
      self.flash = f"Moved '{m['subject']}' to the trash."
      return redirect("/")
    elif op == "restore":
      m["folder"] = "sent" if m["from_address"] == USER_ADDRESS else "inbox"
      self.flash = f"Restored '{m['subject']}'."
    elif op == "unread":
      m["read"] = False
      return redirect("/")
    return redirect(f"/message/{m['id']}")

  def compose(self, req: Request, errors=(), values=None) -> Response:
    values = dict(values or {})
    if not values:
      source = self._get(req.arg("reply") or req.arg("forward"))
      if source is not None and req.arg("reply"):
        values = {"to": source["from_address"], "subject": _prefixed("Re: ", source["subject"]),
                  "body": f"\n\nOn {source['date']}, {source['from_name']} wrote:\n"
                          + _quote(source["body"])}
      elif source is not None:
        values = {"to": "", "subject": _prefixed("Fwd: ", source["subject"]),
                  "body": f"\n\n---------- Forwarded message ----------\nFrom: "
                          f"{source['from_name']} <{source['from_address']}>\nSubject: "
                          f"{source['subject']}\n\n{source['body']}"}
    error_html = "".join(f"<p class='error' role='alert'>{esc(e)}</p>" for e in errors)
    body = (f"<h1>New message</h1>{error_html}<form method='post' action='/send' class='card'>"
            f"<div class='field'><label for='to'>To</label><input type='text' id='to' "
            f"name='to' value='{esc(values.get('to', ''))}'></div><div class='field'><label "
            f"for='subject'>Subject</label><input type='text' id='subject' name='subject' "
            f"value='{esc(values.get('subject', ''))}'></div><label for='body'>Message</label>"
            f"<textarea id='body' name='body'>{esc(values.get('body', ''))}</textarea>"
            f"<p><button type='submit' id='send'>Send</button></p></form>")
    return Response(self.page("Compose", body), 422 if errors else 200)

  def send(self, req: Request) -> Response:
    values = {k: req.form.get(k, [""])[0] for k in ("to", "subject", "body")}
    to = addresses(values["to"])
    errors = []
    if not to:
      errors.append("Please enter at least one recipient.")
    bad = [a for a in to if not _ADDRESS.match(a)]
    if bad:
      errors.append(f"Not a valid email address: {', '.join(bad)}")
    if not values["subject"].strip() and not values["body"].strip():
      errors.append("The message is empty: add a subject or some text.")
    if errors:
      return self.compose(req, errors, values)
    number = max((m["id"] for m in self.messages), default=0) + 1
    self.messages.append({"id": number, "from_name": USER_NAME, "from_address": USER_ADDRESS,
                          "to": to, "subject": values["subject"].strip(),
                          "date": "2026-11-28 12:00", "body": values["body"],
                          "folder": "sent", "read": True, "starred": False})
    self.flash = "Message sent."
    return redirect("/")


def _prefixed(prefix: str, subject: str) -> str:
  return subject if subject.lower().startswith(prefix.lower()) else prefix + subject


def _quote(body: str) -> str:
  return "\n".join("> " + line for line in body.splitlines())
