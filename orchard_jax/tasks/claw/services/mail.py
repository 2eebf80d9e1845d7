"""Mail: folders, search, send, reply, forward, drafts and attachments (a Gmail-like mailbox).

Fixtures (`fixtures.mail`):
  messages: [{id, folder (inbox|sent|drafts|archive|trash), from ("Name <addr>" or addr),
              to [...], cc [...], bcc [...], subject, body, date, read, starred, thread_id,
              attachments: [{id, filename, content, content_type}]}]
The mailbox owner is the reset's `user.email` (default alex@example.com); messages the agent
sends are from that address.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List

from . import timeutil
from .core import (BadArguments, Conflict, NotFound, Operation, Service, array, boolean,
                   integer, obj, string)

FOLDERS = ("inbox", "sent", "drafts", "archive", "trash")
MOVABLE = ("inbox", "archive", "trash")
DEFAULT_USER = "alex@example.com"
_ADDRESS_RE = re.compile(r"^\s*(?:\"?([^\"<]*?)\"?\s*<([^>]+)>|([^<>\s]+))\s*\Z")

_EMAIL = {"type": "string", "format": "email"}
_EMAILS = {"type": "array", "items": _EMAIL}
_MESSAGE_ID = string("id of a message, e.g. from mail_list_messages or mail_search",
                     minLength=1)
_LIMIT = integer("most results to return (default 20)", minimum=1, maximum=100)
_NEW_ATTACHMENT = obj({
    "filename": string("file name of a new attachment", minLength=1),
    "content": string("text content of a new attachment"),
    "message_id": string("message holding an existing attachment to include"),
    "attachment_id": string("id of that existing attachment")})


def parse_address(text: str) -> tuple:
  """'Dana Lee <dana@acme.com>' -> ('Dana Lee', 'dana@acme.com'); a bare address has name ''."""
  match = _ADDRESS_RE.match(text or "")
  if not match:
    raise ValueError(f"expected an address 'Name <name@host>' or 'name@host', got {text!r}")
  if match.group(3):
    return "", match.group(3).lower()
  return (match.group(1) or "").strip(), match.group(2).strip().lower()


class MailService(Service):
  name = "mail"
  tables = {
      "messages": "id TEXT PRIMARY KEY, folder TEXT, sender TEXT, sender_name TEXT, "
                  "recipients TEXT, cc TEXT, bcc TEXT, subject TEXT, body TEXT, date TEXT, "
                  "read INTEGER, starred INTEGER, thread_id TEXT, in_reply_to TEXT, "
                  "forwarded_from TEXT",
      "attachments": "id TEXT PRIMARY KEY, message_id TEXT, filename TEXT, content_type TEXT, "
                     "content TEXT, size INTEGER",
  }
  json_columns = {"messages": ("recipients", "cc", "bcc")}
  id_prefixes = {"messages": "msg_", "attachments": "att_"}

  @property
  def me(self) -> str:
    return str(self.user.get("email") or DEFAULT_USER).lower()

  # ------------------------------------------------------------------ fixtures
  def load_fixtures(self, fixtures: Dict[str, Any]) -> None:
    for i, m in enumerate(fixtures.get("messages") or ()):
      name, sender = parse_address(m.get("from") or self.me)
      folder = m.get("folder", "inbox")
      if folder not in FOLDERS:
        raise ValueError(f"messages[{i}].folder must be one of {FOLDERS}, got {folder!r}")
      date = timeutil.to_utc_text(timeutil.parse_datetime(m.get("date") or self.now_text))
      message = self.insert("messages", {
          "id": m.get("id"), "folder": folder, "sender": sender,
          "sender_name": m.get("from_name", name), "recipients": _addresses(m.get("to")),
          "cc": _addresses(m.get("cc")), "bcc": _addresses(m.get("bcc")),
          "subject": m.get("subject", ""), "body": m.get("body", ""), "date": date,
          "read": int(bool(m.get("read", folder != "inbox"))),
          "starred": int(bool(m.get("starred", False))), "thread_id": m.get("thread_id"),
          "in_reply_to": m.get("in_reply_to"), "forwarded_from": None})
      if message["thread_id"] is None:
        self.update("messages", message["id"], {"thread_id": message["id"]})
      for a in m.get("attachments") or ():
        self._attach(message["id"], a.get("filename") or "attachment.txt",
                     a.get("content", ""), a.get("content_type"), a.get("id"))

  def _attach(self, message_id: str, filename: str, content: str,
              content_type: str | None = None, attachment_id: str | None = None) -> Dict:
    return self.insert("attachments", {
        "id": attachment_id, "message_id": message_id, "filename": filename,
        "content_type": content_type or _content_type(filename), "content": content,
        "size": len(content.encode("utf-8"))})

  # ------------------------------------------------------------------ views
  def _attachments(self, message_id: str) -> List[Dict[str, Any]]:
    return [{"id": a["id"], "filename": a["filename"], "content_type": a["content_type"],
             "size": a["size"]}
            for a in self.select("attachments", "message_id = ?", (message_id,))]

  def _summary(self, m: Dict[str, Any]) -> Dict[str, Any]:
    snippet = " ".join(m["body"].split())[:120]
    return {"id": m["id"], "folder": m["folder"], "from": _display(m), "to": m["recipients"],
            "subject": m["subject"], "date": m["date"], "read": bool(m["read"]),
            "starred": bool(m["starred"]), "snippet": snippet,
            "has_attachments": bool(self._attachments(m["id"]))}

  def _full(self, m: Dict[str, Any]) -> Dict[str, Any]:
    return {"id": m["id"], "folder": m["folder"], "from": _display(m), "to": m["recipients"],
            "cc": m["cc"], "bcc": m["bcc"] if m["sender"] == self.me else [],
            "subject": m["subject"], "date": m["date"], "read": bool(m["read"]),
            "starred": bool(m["starred"]), "thread_id": m["thread_id"],
            "in_reply_to": m["in_reply_to"], "body": m["body"],
            "attachments": self._attachments(m["id"])}

  def _message(self, message_id: str) -> Dict[str, Any]:
    return self.get("messages", message_id, "message")

  # ------------------------------------------------------------------ operations
  def operations(self) -> List[Operation]:
    return [
        Operation("mail_list_messages", "/messages/list",
                  "List messages in a folder, newest first.",
                  obj({"folder": string("inbox (default), sent, drafts, archive or trash",
                                        enum=list(FOLDERS)),
                       "unread_only": boolean("only unread messages"),
                       "limit": _LIMIT,
                       "offset": integer("skip this many results first", minimum=0)}),
                  MailService.list_messages),
        Operation("mail_search", "/messages/search",
                  "Search messages (all folders but trash unless `folder` is given). Every word "
                  "of `query` must appear in the subject, body or sender.",
                  obj({"query": string("words to look for"),
                       "from": string("part of the sender's address or name"),
                       "to": string("part of a recipient's address"),
                       "folder": string("limit to one folder", enum=list(FOLDERS)),
                       "after": string("only messages on or after this date/date-time",
                                       format="date-time"),
                       "before": string("only messages before this date/date-time",
                                        format="date-time"),
                       "has_attachment": boolean("only messages with attachments"),
                       "unread_only": boolean("only unread messages"),
                       "limit": _LIMIT}),
                  MailService.search),
        Operation("mail_get_message", "/messages/get",
                  "Read one message in full: headers, body and its attachments' ids.",
                  obj({"message_id": _MESSAGE_ID}, ["message_id"]), MailService.get_message),
        Operation("mail_get_attachment", "/attachments/get",
                  "Read the content of one attachment of a message.",
                  obj({"message_id": _MESSAGE_ID,
                       "attachment_id": string("id of the attachment", minLength=1)},
                      ["message_id", "attachment_id"]), MailService.get_attachment),
        Operation("mail_send", "/messages/send",
                  "Send a new email from the user's address.",
                  obj({"to": array(_EMAIL, "recipient addresses", minItems=1),
                       "subject": string("subject line"),
                       "body": string("plain-text body"),
                       "cc": array(_EMAIL, "carbon-copy addresses"),
                       "bcc": array(_EMAIL, "blind-copy addresses"),
                       "attachments": array(_NEW_ATTACHMENT, "new text attachments "
                                            "{filename, content} or existing ones "
                                            "{message_id, attachment_id}")},
                      ["to", "subject", "body"]), MailService.send, mutates=True),
        Operation("mail_reply", "/messages/reply",
                  "Reply to a message (to its sender; with reply_all also to its other "
                  "recipients). The subject gets 'Re: '.",
                  obj({"message_id": _MESSAGE_ID, "body": string("plain-text reply"),
                       "reply_all": boolean("also reply to every other recipient")},
                      ["message_id", "body"]), MailService.reply, mutates=True),
        Operation("mail_forward", "/messages/forward",
                  "Forward a message, with its attachments, to new recipients.",
                  obj({"message_id": _MESSAGE_ID,
                       "to": array(_EMAIL, "recipient addresses", minItems=1),
                       "body": string("note written above the forwarded message"),
                       "include_attachments": boolean("keep the attachments (default true)")},
                      ["message_id", "to"]), MailService.forward, mutates=True),
        Operation("mail_create_draft", "/drafts/create",
                  "Save a draft without sending it.",
                  obj({"to": _EMAILS, "cc": _EMAILS, "subject": string("subject line"),
                       "body": string("plain-text body"),
                       "reply_to_message_id": string("message this draft answers")}),
                  MailService.create_draft, mutates=True),
        Operation("mail_update_draft", "/drafts/update",
                  "Change a draft's recipients, subject or body (given fields are replaced).",
                  obj({"draft_id": string("id of the draft", minLength=1), "to": _EMAILS,
                       "cc": _EMAILS, "subject": string("subject line"),
                       "body": string("plain-text body")}, ["draft_id"]),
                  MailService.update_draft, mutates=True),
        Operation("mail_send_draft", "/drafts/send", "Send a saved draft.",
                  obj({"draft_id": string("id of the draft", minLength=1)}, ["draft_id"]),
                  MailService.send_draft, mutates=True),
        Operation("mail_mark", "/messages/mark", "Mark a message read/unread or starred.",
                  obj({"message_id": _MESSAGE_ID, "read": boolean("read (true) or unread"),
                       "starred": boolean("starred or not")}, ["message_id"]),
                  MailService.mark, mutates=True),
        Operation("mail_move", "/messages/move",
                  "Move a message to the inbox, the archive or the trash.",
                  obj({"message_id": _MESSAGE_ID,
                       "folder": string("inbox, archive or trash", enum=list(MOVABLE))},
                      ["message_id", "folder"]), MailService.move, mutates=True),
        Operation("mail_delete", "/messages/delete",
                  "Delete a message permanently (it cannot be recovered; prefer moving it to "
                  "the trash).",
                  obj({"message_id": _MESSAGE_ID}, ["message_id"]), MailService.delete,
                  mutates=True),
    ]

  def list_messages(self, a: Dict[str, Any]) -> Dict[str, Any]:
    folder = a.get("folder", "inbox")
    where, params = "folder = ?", [folder]
    if a.get("unread_only"):
      where += " AND read = 0"
    rows = self.select("messages", where, params, order="date DESC, rowid DESC")
    offset, limit = a.get("offset", 0), a.get("limit", 20)
    return {"folder": folder, "total": len(rows),
            "messages": [self._summary(m) for m in rows[offset:offset + limit]]}

  def search(self, a: Dict[str, Any]) -> Dict[str, Any]:
    rows = self.select("messages", order="date DESC, rowid DESC")
    words = (a.get("query") or "").lower().split()
    after = timeutil.parse_datetime(a["after"]) if "after" in a else None
    before = timeutil.parse_datetime(a["before"]) if "before" in a else None
    found = []
    for m in rows:
      if "folder" in a:
        if m["folder"] != a["folder"]:
          continue
      elif m["folder"] == "trash":
        continue
      text = " ".join((m["subject"], m["body"], m["sender"], m["sender_name"] or "")).lower()
      if any(w not in text for w in words):
        continue
      if "from" in a and a["from"].lower() not in f"{m['sender']} {m['sender_name']}".lower():
        continue
      if "to" in a and not any(a["to"].lower() in r for r in m["recipients"] + m["cc"]):
        continue
      moment = timeutil.utc(m["date"])
      if (after and moment < after) or (before and moment >= before):
        continue
      if a.get("has_attachment") and not self._attachments(m["id"]):
        continue
      if a.get("unread_only") and m["read"]:
        continue
      found.append(self._summary(m))
    return {"total": len(found), "messages": found[:a.get("limit", 20)]}

  def get_message(self, a: Dict[str, Any]) -> Dict[str, Any]:
    return self._full(self._message(a["message_id"]))

  def get_attachment(self, a: Dict[str, Any]) -> Dict[str, Any]:
    self._message(a["message_id"])
    rows = self.select("attachments", "id = ? AND message_id = ?",
                       (a["attachment_id"], a["message_id"]))
    if not rows:
      known = [x["id"] for x in self._attachments(a["message_id"])]
      raise NotFound(f"message {a['message_id']!r} has no attachment {a['attachment_id']!r}; "
                     f"its attachments are {known or 'none'}")
    att = rows[0]
    return {"id": att["id"], "message_id": att["message_id"], "filename": att["filename"],
            "content_type": att["content_type"], "content": att["content"]}

  def _new_message(self, folder: str, to: List[str], cc: List[str], bcc: List[str],
                   subject: str, body: str, *, thread_id: str | None = None,
                   in_reply_to: str | None = None, forwarded_from: str | None = None) -> Dict:
    message = self.insert("messages", {
        "folder": folder, "sender": self.me, "sender_name": self.user.get("name", ""),
        "recipients": _lower(to), "cc": _lower(cc), "bcc": _lower(bcc), "subject": subject,
        "body": body, "date": self.now(), "read": 1, "starred": 0, "thread_id": thread_id,
        "in_reply_to": in_reply_to, "forwarded_from": forwarded_from})
    if thread_id is None:
      message = self.update("messages", message["id"], {"thread_id": message["id"]})
    return message

  def _copy_attachments(self, specs: List[Dict[str, Any]], message_id: str) -> None:
    for i, spec in enumerate(specs):
      if "message_id" in spec or "attachment_id" in spec:
        if not ("message_id" in spec and "attachment_id" in spec) or "content" in spec:
          raise BadArguments(f"arguments.attachments[{i}]: expected {{message_id, "
                             f"attachment_id}} or {{filename, content}}, got {sorted(spec)}")
        source = self.get_attachment(spec)
        self._attach(message_id, spec.get("filename") or source["filename"],
                     source["content"], source["content_type"])
      elif "filename" in spec and "content" in spec:
        self._attach(message_id, spec["filename"], spec["content"])
      else:
        raise BadArguments(f"arguments.attachments[{i}]: expected {{filename, content}} or "
                           f"{{message_id, attachment_id}}, got {sorted(spec)}")

  def send(self, a: Dict[str, Any]) -> Dict[str, Any]:
    message = self._new_message("sent", a["to"], a.get("cc", []), a.get("bcc", []),
                                a["subject"], a["body"])
    self._copy_attachments(a.get("attachments", []), message["id"])
    return {"sent": True, "message": self._full(message)}

  def reply(self, a: Dict[str, Any]) -> Dict[str, Any]:
    original = self._message(a["message_id"])
    if original["folder"] == "drafts":
      raise Conflict(f"{a['message_id']!r} is a draft; only received or sent messages can be "
                     "answered")
    if original["sender"] == self.me:
      to, cc = list(original["recipients"]), list(original["cc"]) if a.get("reply_all") else []
    else:
      to, cc = [original["sender"]], []
      if a.get("reply_all"):
        to += [r for r in original["recipients"] if r != self.me and r not in to]
        cc = [r for r in original["cc"] if r != self.me and r not in to]
    message = self._new_message("sent", to, cc, [], _prefixed("Re: ", original["subject"]),
                                a["body"], thread_id=original["thread_id"],
                                in_reply_to=original["id"])
    return {"sent": True, "message": self._full(message)}

  def forward(self, a: Dict[str, Any]) -> Dict[str, Any]:
    original = self._message(a["message_id"])
    quoted = (f"---------- Forwarded message ----------\nFrom: {_display(original)}\n"
              f"Date: {original['date']}\nSubject: {original['subject']}\n"
              f"To: {', '.join(original['recipients'])}\n\n{original['body']}")
    note = a.get("body", "")
    message = self._new_message("sent", a["to"], [], [], _prefixed("Fwd: ", original["subject"]),
                                f"{note}\n\n{quoted}" if note else quoted,
                                forwarded_from=original["id"])
    if a.get("include_attachments", True):
      for att in self.select("attachments", "message_id = ?", (original["id"],)):
        self._attach(message["id"], att["filename"], att["content"], att["content_type"])
    return {"sent": True, "message": self._full(message)}

  def create_draft(self, a: Dict[str, Any]) -> Dict[str, Any]:
    thread_id = in_reply_to = None
    subject = a.get("subject", "")
    if "reply_to_message_id" in a:
      original = self._message(a["reply_to_message_id"])
      thread_id, in_reply_to = original["thread_id"], original["id"]
      subject = subject or _prefixed("Re: ", original["subject"])
    draft = self._new_message("drafts", a.get("to", []), a.get("cc", []), [], subject,
                              a.get("body", ""), thread_id=thread_id, in_reply_to=in_reply_to)
    return {"draft": self._full(draft)}

  def _draft(self, draft_id: str) -> Dict[str, Any]:
    draft = self._message(draft_id)
    if draft["folder"] != "drafts":
      raise Conflict(f"{draft_id!r} is not a draft (it is in {draft['folder']})")
    return draft

  def update_draft(self, a: Dict[str, Any]) -> Dict[str, Any]:
    self._draft(a["draft_id"])
    values = {k: v for k, v in (("recipients", a.get("to")), ("cc", a.get("cc")),
                                ("subject", a.get("subject")), ("body", a.get("body")))
              if v is not None}
    if "recipients" in values:
      values["recipients"] = _lower(values["recipients"])
    if "cc" in values:
      values["cc"] = _lower(values["cc"])
    return {"draft": self._full(self.update("messages", a["draft_id"], values))}

  def send_draft(self, a: Dict[str, Any]) -> Dict[str, Any]:
    draft = self._draft(a["draft_id"])
    if not draft["recipients"]:
      raise Conflict(f"draft {a['draft_id']!r} has no recipient; set `to` with "
                     "mail_update_draft first")
    message = self.update("messages", draft["id"], {"folder": "sent", "date": self.now()})
    return {"sent": True, "message": self._full(message)}

  def mark(self, a: Dict[str, Any]) -> Dict[str, Any]:
    self._message(a["message_id"])
    values = {}
    if "read" in a:
      values["read"] = int(a["read"])
    if "starred" in a:
      values["starred"] = int(a["starred"])
    if not values:
      raise BadArguments("arguments: give `read` and/or `starred`")
    return {"message": self._summary(self.update("messages", a["message_id"], values))}

  def move(self, a: Dict[str, Any]) -> Dict[str, Any]:
    message = self._message(a["message_id"])
    if message["folder"] in ("sent", "drafts") and a["folder"] == "inbox":
      raise Conflict(f"a message in {message['folder']} cannot move to the inbox")
    return {"message": self._summary(self.update("messages", a["message_id"],
                                                 {"folder": a["folder"]}))}

  def delete(self, a: Dict[str, Any]) -> Dict[str, Any]:
    self._message(a["message_id"])
    self.db.execute("DELETE FROM attachments WHERE message_id = ?", (a["message_id"],))
    self.db.execute("DELETE FROM messages WHERE id = ?", (a["message_id"],))
    return {"deleted": a["message_id"]}


def _addresses(values: Any) -> List[str]:
  if values is None:
    return []
  if isinstance(values, str):
    values = [values]
  return [parse_address(v)[1] for v in values]


def _lower(values: List[str]) -> List[str]:
  return [v.lower() for v in values]


def _display(m: Dict[str, Any]) -> str:
  return f"{m['sender_name']} <{m['sender']}>" if m.get("sender_name") else m["sender"]


def _prefixed(prefix: str, subject: str) -> str:
  return subject if subject.lower().startswith(prefix.lower()) else prefix + subject


def _content_type(filename: str) -> str:
  ext = filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
  return {"txt": "text/plain", "csv": "text/csv", "md": "text/markdown", "json":
          "application/json", "ics": "text/calendar", "html": "text/html"}.get(ext, "text/plain")
