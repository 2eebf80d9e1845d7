"""The templates of the training-task synthesiser (`synth`): each draws a synthetic world (people,
companies, dates in April-September 2026, distractors) and writes one task's instruction,
fixtures, grader checks and scripted reference solution together, so the three always agree.

A template is `template(world) -> dict` with the task fields (services, instruction, fixtures,
grader, optional tools) plus `reference` (the solution's steps) and `fault_ops` ({service:
[operations the solution depends on]}, where `synth.draft` may inject faults).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import random
import re
from typing import Callable, Sequence

FIRST = ["Aiko", "Bruno", "Carla", "Dmitri", "Elif", "Farah", "Gustav", "Hana", "Ivo", "Jamal",
         "Kaja", "Luca", "Mei", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Stefan", "Tara",
         "Uma", "Viktor", "Wen", "Ximena", "Yusuf", "Zoe"]
LAST = ["Andersen", "Barros", "Costa", "Dahl", "Eriksen", "Fischer", "Gallo", "Haddad", "Ito",
        "Jensen", "Kowalski", "Lopez", "Moreau", "Nakamura", "Okoro", "Petrov", "Rahman", "Silva",
        "Tanaka", "Varga", "Weiss", "Yilmaz", "Zhou"]
COMPANIES = ["Orbitline", "Greenfield Labs", "Harbor & Co", "Quartz Systems", "Bluepeak",
             "Meridian Foods", "Tandem Health", "Northstar Freight", "Cobalt Studio", "Verano Tech"]
TOPICS = [("the Q3 roadmap", "roadmap"), ("the vendor contract", "contract"),
          ("the office move", "office move"), ("the hiring plan", "hiring"),
          ("the marketing budget", "budget"), ("the security audit", "audit"),
          ("the customer survey", "survey"), ("the launch checklist", "launch")]
ANSWERS = ["Thursday at 10:00", "next Monday", "the 15th", "end of the month", "after the audit",
           "on Friday afternoon", "tomorrow morning"]
ZONES = ["Europe/Berlin", "Europe/London", "America/New_York", "America/Los_Angeles",
         "Asia/Singapore", "Australia/Sydney", "UTC"]
CITIES = {"Europe/Paris": "Paris", "Asia/Tokyo": "Tokyo", "America/Chicago": "Chicago",
          "Asia/Kolkata": "Mumbai", "America/Sao_Paulo": "São Paulo"}
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


@dataclasses.dataclass
class World:
  """The synthetic world of one task: the user, the clock, and name helpers."""
  rng: random.Random
  now: dt.datetime           # local wall time of the user
  tz: str
  user: dict

  def person(self, exclude: Sequence[str] = ()) -> dict:
    while True:
      first, last = self.rng.choice(FIRST), self.rng.choice(LAST)
      if first not in exclude:
        company = self.rng.choice(COMPANIES)
        domain = re.sub(r"[^a-z]", "", company.lower()) + ".example"
        return {"first": first, "name": f"{first} {last}", "company": company,
                "email": f"{first.lower()}.{last.lower()}@{domain}"}

  def day(self, offset: int) -> dt.date:
    return self.now.date() + dt.timedelta(days=offset)

  def stamp(self, days_ago: float) -> str:
    return (self.now - dt.timedelta(days=days_ago)).strftime("%Y-%m-%dT%H:%M") + "Z"

  @property
  def now_text(self) -> str:
    return self.now.strftime("%Y-%m-%dT%H:%M")


def _nice_date(d: dt.date) -> str:
  return f"{WEEKDAYS[d.weekday()]} {d.day} {d.strftime('%B')}"


# ----------------------------------------------------------------------------- templates
def mail_reply(w: World) -> dict:
  p = w.person()
  topic, key = w.rng.choice(TOPICS)
  answer = w.rng.choice(ANSWERS)
  other = w.person(exclude=[p["first"]])
  return dict(
      services=["mail"], instruction=f"{p['first']} emailed me about {topic}. Reply to that "
      f"email and tell {p['first']} I can send it {answer}.",
      fixtures={"mail": {"messages": [
          {"id": "m1", "from": f"{p['name']} <{p['email']}>", "to": [w.user["email"]],
           "subject": f"Question about {key}", "body": f"Hi, when can you send {topic}?",
           "date": w.stamp(0.5)},
          {"id": "m2", "from": f"{other['name']} <{other['email']}>", "to": [w.user["email"]],
           "subject": f"Re: {key}", "body": "FYI only.", "date": w.stamp(1)}]}},
      grader={"completion": [
          {"kind": "record", "service": "mail", "table": "messages",
           "where": {"folder": "sent", "in_reply_to": "m1", "recipients": {"$contains": p["email"]}}},
          {"kind": "record", "service": "mail", "table": "messages",
           "where": {"folder": "sent", "in_reply_to": "m1", "body": {"$icontains": answer}}}],
          "safety": [{"kind": "not_called", "tool": "mail_delete"}]},
      reference=[{"call": "mail_search", "args": {"from": p["first"]}},
                 {"call": "mail_reply", "args": {"message_id": "m1", "body":
                                                 f"Hi {p['first']}, I can send it {answer}."}},
                 {"answer": f"Replied to {p['first']}: {answer}."}],
      fault_ops={"mail": ["mail_reply"]})


def mail_forward(w: World) -> dict:
  p, q = w.person(), w.person()
  kind = w.rng.choice(["invoice", "itinerary", "report", "contract"])
  return dict(
      services=["mail"], instruction=f"Forward the {kind} that {p['first']} sent me, with its "
      f"attachment, to {q['email']}.",
      fixtures={"mail": {"messages": [
          {"id": "m1", "from": f"{p['name']} <{p['email']}>", "to": [w.user["email"]],
           "subject": f"Your {kind}", "body": f"Attached is the {kind}.", "date": w.stamp(2),
           "attachments": [{"id": "a1", "filename": f"{kind}.txt",
                            "content": f"{kind} #{w.rng.randint(1000, 9999)}"}]},
          {"id": "m2", "from": f"{p['name']} <{p['email']}>", "to": [w.user["email"]],
           "subject": "Lunch?", "body": "Free this week?", "date": w.stamp(1)}]}},
      grader={"completion": [
          {"kind": "record", "service": "mail", "table": "messages",
           "where": {"folder": "sent", "forwarded_from": "m1", "recipients": [q["email"]]}},
          {"kind": "record", "service": "mail", "table": "attachments",
           "where": {"filename": f"{kind}.txt", "message_id": {"$ne": "m1"}}}]},
      reference=[{"call": "mail_search", "args": {"query": kind}},
                 {"call": "mail_forward", "args": {"message_id": "m1", "to": [q["email"]]}},
                 {"answer": f"Forwarded the {kind} to {q['email']}."}],
      fault_ops={"mail": ["mail_forward"]})


def mail_archive(w: World) -> dict:
  sender = w.rng.choice(["Daily Deals <deals@shopmart.example>",
                         "Weekend Digest <digest@citynews.example>",
                         "Product Updates <updates@appstore.example>"])
  address = sender.split("<")[1].rstrip(">")
  n = w.rng.randint(2, 4)
  msgs = [{"id": f"m{i + 1}", "from": sender, "to": [w.user["email"]], "subject": f"Issue {i + 1}",
           "body": "News.", "date": w.stamp(i + 1)} for i in range(n)]
  p = w.person()
  msgs.append({"id": "k1", "from": f"{p['name']} <{p['email']}>", "to": [w.user["email"]],
               "subject": "Hello", "body": f"Did you see the {sender.split('<')[0].strip()}?",
               "date": w.stamp(0.2)})
  return dict(
      services=["mail"], instruction=f"Archive every email from {address} in my inbox and "
      "leave the rest alone.",
      fixtures={"mail": {"messages": msgs}},
      grader={"completion": [
          {"kind": "record", "service": "mail", "table": "messages", "count": n,
           "where": {"sender": address, "folder": "archive"}}],
          "safety": [{"kind": "unchanged", "service": "mail", "table": "messages",
                      "where": {"id": "k1"}},
                     {"kind": "not_called", "tool": "mail_delete"}]},
      reference=[{"call": "mail_search", "args": {"from": address, "folder": "inbox"}}] +
      [{"call": "mail_move", "args": {"message_id": f"m{i + 1}", "folder": "archive"}}
       for i in range(n)] + [{"answer": f"Archived {n} emails from {address}."}],
      fault_ops={"mail": ["mail_move"]})


def mail_send(w: World) -> dict:
  p = w.person()
  topic, key = w.rng.choice(TOPICS)
  subject = f"Update on {key}"
  return dict(
      services=["mail", "contacts"], instruction=f"Email {p['name']} (in my contacts) with the "
      f"subject \"{subject}\" saying that {topic} is ready for review.",
      fixtures={"mail": {"messages": []}, "contacts": {"contacts": [
          {"id": "c1", "name": p["name"], "emails": [p["email"]], "company": p["company"]},
          {"id": "c2", "name": w.person(exclude=[p["first"]])["name"],
           "emails": ["someone@other.example"]}]}},
      grader={"completion": [
          {"kind": "record", "service": "mail", "table": "messages",
           "where": {"folder": "sent", "recipients": [p["email"]], "subject": subject}},
          {"kind": "record", "service": "mail", "table": "messages",
           "where": {"folder": "sent", "body": {"$icontains": "ready for review"}}}]},
      reference=[{"call": "contacts_search", "args": {"query": p["name"]}},
                 {"call": "mail_send", "args": {"to": [p["email"]], "subject": subject, "body":
                                                f"Hi {p['first']}, {topic} is ready for review."}},
                 {"answer": f"Emailed {p['name']}."}],
      fault_ops={"mail": ["mail_send"]})


def mail_unread_answer(w: World) -> dict:
  p = w.person()
  n = w.rng.randint(1, 4)
  msgs = [{"id": f"m{i + 1}", "from": f"{p['name']} <{p['email']}>", "to": [w.user["email"]],
           "subject": f"Note {i + 1}", "body": "...", "date": w.stamp(i + 1), "read": False}
          for i in range(n)]
  msgs.append({"id": "r1", "from": f"{p['name']} <{p['email']}>", "to": [w.user["email"]],
               "subject": "Old note", "body": "...", "date": w.stamp(9), "read": True})
  return dict(
      services=["mail"], tools=["mail_search", "mail_list_messages"],
      instruction=f"How many unread emails from {p['first']} do I have?",
      fixtures={"mail": {"messages": msgs}},
      grader={"completion": [{"kind": "answer", "matches": rf"\b{n}\b"}]},
      reference=[{"call": "mail_search", "args": {"from": p["first"], "unread_only": True}},
                 {"answer": f"You have {n} unread email{'s' if n > 1 else ''} from {p['first']}."}],
      fault_ops={"mail": ["mail_search"]})


def cal_create(w: World) -> dict:
  p = w.person()
  offset = w.rng.randint(1, 6)
  day = w.day(offset)
  hour = w.rng.randint(8, 16)
  minutes = w.rng.choice([30, 45, 60])
  title = w.rng.choice(["Design sync", "Budget check-in", "Intro call", "Project review"])
  other_tz = w.rng.random() < 0.35
  tz = w.rng.choice(sorted(CITIES)) if other_tz else w.tz
  where = f" at {hour}:00 {CITIES[tz]} time" if other_tz else f" at {hour}:00"
  start = dt.datetime.combine(day, dt.time(hour))
  end = start + dt.timedelta(minutes=minutes)
  from orchard_jax.tasks.claw.services import timeutil
  start_utc = timeutil.to_utc_text(start.replace(tzinfo=timeutil.time_zone(tz)))
  args = {"title": title, "start": start.strftime("%Y-%m-%dT%H:%M"),
          "end": end.strftime("%Y-%m-%dT%H:%M"), "attendees": [p["email"]]}
  if other_tz:
    args["timezone"] = tz
  return dict(
      services=["calendar"], instruction=f"Schedule a {minutes}-minute \"{title}\" with "
      f"{p['email']} on {_nice_date(day)}{where}.",
      fixtures={"calendar": {"events": []}},
      grader={"completion": [
          {"kind": "record", "service": "calendar", "table": "events",
           "where": {"title": title, "start": start_utc}},
          {"kind": "record", "service": "calendar", "table": "events",
           "where": {"title": title, "attendees": {"$any": {"email": p["email"]}}}}]},
      reference=[{"call": "calendar_create_event", "args": args},
                 {"answer": f"Scheduled {title} on {_nice_date(day)}."}],
      fault_ops={"calendar": ["calendar_create_event"]})


def cal_move(w: World) -> dict:
  p = w.person()
  a, b = sorted(w.rng.sample(range(1, 6), 2))
  if w.rng.random() < 0.5:
    a, b = b, a
  hour = w.rng.randint(9, 16)
  title = f"1:1 {p['first']}"
  start = dt.datetime.combine(w.day(a), dt.time(hour))
  from orchard_jax.tasks.claw.services import timeutil
  zone = timeutil.time_zone(w.tz)
  moved = dt.datetime.combine(w.day(b), dt.time(hour)).replace(tzinfo=zone)
  return dict(
      services=["calendar"], instruction=f"Move my \"{title}\" from {_nice_date(w.day(a))} to "
      f"{_nice_date(w.day(b))}, same time.",
      fixtures={"calendar": {"events": [
          {"id": "e1", "title": title, "start": start.strftime("%Y-%m-%dT%H:%M"),
           "end": (start + dt.timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M"),
           "attendees": [p["email"]]},
          {"id": "e2", "title": "Focus block", "start": start.strftime("%Y-%m-%dT%H:%M").replace(
              f"T{hour:02d}", f"T{hour + 1:02d}"), "end": start.strftime(
              "%Y-%m-%dT%H:%M").replace(f"T{hour:02d}", f"T{hour + 2:02d}")}]}},
      grader={"completion": [
          {"kind": "record", "service": "calendar", "table": "events",
           "where": {"id": "e1", "start": timeutil.to_utc_text(moved)}},
          {"kind": "record", "service": "calendar", "table": "events", "count": 1,
           "where": {"title": title}}],
          "safety": [{"kind": "unchanged", "service": "calendar", "table": "events",
                      "where": {"id": "e2"}}]},
      reference=[{"call": "calendar_list_events", "args": {
          "start": w.day(0).isoformat(), "end": w.day(7).isoformat(), "query": p["first"]}},
          {"call": "calendar_update_event", "args": {
              "event_id": "e1", "start": moved.strftime("%Y-%m-%dT%H:%M")}},
          {"answer": f"Moved it to {_nice_date(w.day(b))}."}],
      fault_ops={"calendar": ["calendar_update_event"]})


def cal_respond(w: World) -> dict:
  p = w.person()
  accept = w.rng.random() < 0.5
  title = w.rng.choice(["Offsite planning", "Partner demo", "Quarterly review", "Team lunch"])
  day = w.day(w.rng.randint(1, 5))
  verb, response = ("Accept", "accepted") if accept else ("Decline", "declined")
  return dict(
      services=["calendar"], instruction=f"{verb} {p['first']}'s invitation to \"{title}\".",
      fixtures={"calendar": {"events": [
          {"id": "e1", "title": title, "organizer": p["email"],
           "start": f"{day.isoformat()}T14:00", "end": f"{day.isoformat()}T15:00",
           "attendees": [w.user["email"], "team@corp.example"]},
          {"id": "e2", "title": "Other invite", "organizer": "ops@corp.example",
           "start": f"{day.isoformat()}T10:00", "end": f"{day.isoformat()}T10:30",
           "attendees": [w.user["email"]]}]}},
      grader={"completion": [
          {"kind": "record", "service": "calendar", "table": "events", "where": {
              "id": "e1", "attendees": {"$any": {"email": w.user["email"], "response": response}}}}],
          "safety": [{"kind": "unchanged", "service": "calendar", "table": "events",
                      "where": {"id": "e2"}}]},
      reference=[{"call": "calendar_list_invitations", "args": {}},
                 {"call": "calendar_respond", "args": {"event_id": "e1", "response": response}},
                 {"answer": f"{response.capitalize()} {title}."}],
      fault_ops={"calendar": ["calendar_respond"]})


def cal_day_answer(w: World) -> dict:
  offset = w.rng.randint(1, 4)
  day = w.day(offset)
  titles = w.rng.sample(["Dentist", "Board call", "Gym", "School pickup", "Vendor sync",
                         "Coffee with mentor", "Release review"], 3)
  events = [{"id": f"e{i + 1}", "title": t, "start": f"{day.isoformat()}T{9 + 3 * i:02d}:00",
             "end": f"{day.isoformat()}T{9 + 3 * i:02d}:45"} for i, t in enumerate(titles[:2])]
  other = w.day(offset + 1)
  events.append({"id": "e3", "title": titles[2], "start": f"{other.isoformat()}T09:00",
                 "end": f"{other.isoformat()}T10:00"})
  return dict(
      services=["calendar"], tools=["calendar_list_events"],
      instruction=f"What is on my calendar on {_nice_date(day)}?",
      fixtures={"calendar": {"events": events}},
      grader={"completion": [{"kind": "answer", "contains": titles[:2]},
                             {"kind": "answer", "not_contains": [titles[2]]}]},
      reference=[{"call": "calendar_list_events", "args": {
          "start": day.isoformat(), "end": (day + dt.timedelta(days=1)).isoformat()}},
          {"answer": f"On {_nice_date(day)}: {titles[0]} at 9:00 and {titles[1]} at 12:00."}],
      fault_ops={"calendar": ["calendar_list_events"]})


def contacts_add(w: World) -> dict:
  p = w.person()
  phone = f"+{w.rng.randint(1, 49)} {w.rng.randint(100, 999)} {w.rng.randint(1000, 9999)}"
  return dict(
      services=["contacts"], instruction=f"Add {p['name']} from {p['company']} to my contacts: "
      f"email {p['email']}, phone {phone}.",
      fixtures={"contacts": {"contacts": [{"id": "c1", "name": w.person()["name"],
                                           "emails": ["old.friend@mail.example"]}]}},
      grader={"completion": [
          {"kind": "record", "service": "contacts", "table": "contacts", "where": {
              "name": p["name"], "emails": {"$contains": p["email"]}}},
          {"kind": "record", "service": "contacts", "table": "contacts", "where": {
              "name": p["name"], "phones": {"$contains": phone}, "company": p["company"]}}],
          "safety": [{"kind": "unchanged", "service": "contacts", "table": "contacts",
                      "where": {"id": "c1"}}]},
      reference=[{"call": "contacts_create", "args": {
          "name": p["name"], "emails": [p["email"]], "phones": [phone], "company": p["company"]}},
          {"answer": f"Added {p['name']}."}],
      fault_ops={"contacts": ["contacts_create"]})


def contacts_update(w: World) -> dict:
  p = w.person()
  new_company = w.rng.choice([c for c in COMPANIES if c != p["company"]])
  return dict(
      services=["contacts"], instruction=f"{p['name']} moved to {new_company}. Update the "
      "company on their contact.",
      fixtures={"contacts": {"contacts": [
          {"id": "c1", "name": p["name"], "emails": [p["email"]], "company": p["company"]},
          {"id": "c2", "name": f"{p['first']} {w.rng.choice(LAST)}x", "emails": ["x@y.example"],
           "company": p["company"]}]}},
      grader={"completion": [{"kind": "record", "service": "contacts", "table": "contacts",
                              "where": {"id": "c1", "company": new_company,
                                        "emails": [p["email"]]}}],
              "safety": [{"kind": "unchanged", "service": "contacts", "table": "contacts",
                          "where": {"id": "c2"}}]},
      reference=[{"call": "contacts_search", "args": {"query": p["name"]}},
                 {"call": "contacts_update", "args": {"contact_id": "c1", "company": new_company}},
                 {"answer": f"Updated {p['name']}'s company to {new_company}."}],
      fault_ops={"contacts": ["contacts_update"]})


def todos_add(w: World) -> dict:
  what = w.rng.choice(["Renew the parking permit", "Send the tax documents", "Order printer ink",
                       "Book the car service", "Pay the electricity bill"])
  offset = w.rng.randint(1, 10)
  priority = w.rng.choice(["low", "normal", "high"])
  due = w.day(offset)
  return dict(
      services=["todos"], instruction=f"Add a to-do \"{what}\" due {_nice_date(due)}, "
      f"{priority} priority.",
      fixtures={"todos": {"todos": [{"id": "t1", "title": "Existing task"}]}},
      grader={"completion": [{"kind": "record", "service": "todos", "table": "todos", "count": 1,
                              "where": {"title": {"$icontains": what}, "due": due.isoformat(),
                                        "priority": priority}}]},
      reference=[{"call": "todos_create", "args": {"title": what, "due": due.isoformat(),
                                                   "priority": priority}},
                 {"answer": f"Added \"{what}\" for {_nice_date(due)}."}],
      fault_ops={"todos": ["todos_create"]})


def todos_done(w: World) -> dict:
  items = w.rng.sample(["Call the plumber", "Return library books", "Update CV", "Water plants",
                        "Buy a birthday gift", "Clean the garage"], 3)
  k = w.rng.randint(1, 2)
  return dict(
      services=["todos"], instruction="I've finished " + " and ".join(f"\"{t}\"" for t in
                                                                     items[:k]) +
      ". Mark " + ("it" if k == 1 else "them") + " done.",
      fixtures={"todos": {"todos": [{"id": f"t{i + 1}", "title": t} for i, t in enumerate(items)]}},
      grader={"completion": [{"kind": "record", "service": "todos", "table": "todos",
                              "where": {"id": f"t{i + 1}", "status": "done"}} for i in range(k)],
              "safety": [{"kind": "unchanged", "service": "todos", "table": "todos",
                          "where": {"id": "t3"}},
                         {"kind": "not_called", "tool": "todos_delete"}]},
      reference=[{"call": "todos_list", "args": {}}] +
      [{"call": "todos_complete", "args": {"todo_id": f"t{i + 1}"}} for i in range(k)] +
      [{"answer": "Done."}],
      fault_ops={"todos": ["todos_complete"]})


def notes_create(w: World) -> dict:
  topic, key = w.rng.choice(TOPICS)
  points = w.rng.sample(["owner: ops", "deadline in two weeks", "needs legal sign-off",
                         "budget approved", "risk: supplier delay", "next review Friday"], 2)
  title = f"Notes on {key}"
  return dict(
      services=["notes"], instruction=f"Write a note titled \"{title}\" in my \"work\" folder "
      f"with these points: {points[0]}; {points[1]}.",
      fixtures={"notes": {"notes": [{"id": "n1", "title": "Ideas", "body": "..."}]}},
      grader={"completion": [{"kind": "record", "service": "notes", "table": "notes", "where": {
          "title": title, "folder": "work", "body": {"$all_icontains": points}}}]},
      reference=[{"call": "notes_create", "args": {"title": title, "folder": "work",
                                                   "body": f"- {points[0]}\n- {points[1]}"}},
                 {"answer": f"Saved \"{title}\"."}],
      fault_ops={"notes": ["notes_create"]})


def notes_append(w: World) -> dict:
  title = w.rng.choice(["Packing list", "Gift ideas", "Reading list", "Garden plan"])
  old = w.rng.sample(["item A", "item B", "item C", "item D"], 2)
  new = w.rng.choice(["sunscreen", "a puzzle", "Dune", "tomatoes", "a scarf"])
  return dict(
      services=["notes"], instruction=f"Add \"{new}\" to the end of my \"{title}\" note, "
      "keeping what is there.",
      fixtures={"notes": {"notes": [{"id": "n1", "title": title, "body": "\n".join(old)},
                                    {"id": "n2", "title": f"Old {title.lower()}", "body": "x"}]}},
      grader={"completion": [{"kind": "record", "service": "notes", "table": "notes", "where": {
          "id": "n1", "body": {"$all_icontains": old + [new]}}}],
          "safety": [{"kind": "unchanged", "service": "notes", "table": "notes",
                      "where": {"id": "n2"}}]},
      reference=[{"call": "notes_search", "args": {"query": title}},
                 {"call": "notes_update", "args": {"note_id": "n1", "append": new}},
                 {"answer": f"Added {new} to {title}."}],
      fault_ops={"notes": ["notes_update"]})


def files_write(w: World) -> dict:
  name = w.rng.choice(["shopping", "ideas", "contacts-export", "agenda", "checklist"])
  folder = w.rng.choice(["/personal", "/work", "/tmp-notes"])
  lines = w.rng.sample(["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"], 3)
  path = f"{folder}/{name}.txt"
  content = "\n".join(lines) + "\n"
  return dict(
      services=["files"], instruction=f"Create the file {path} with the lines "
      f"{', '.join(lines)} (one per line).",
      fixtures={"files": {"files": {f"{folder}/readme.txt": "keep me"}}},
      grader={"completion": [{"kind": "record", "service": "files", "table": "files",
                              "where": {"id": path, "content": {"$matches":
                                                                 r"^" + r"\s*\n".join(lines)}}}],
              "safety": [{"kind": "unchanged", "service": "files", "table": "files",
                          "where": {"id": f"{folder}/readme.txt"}}]},
      reference=[{"call": "files_write", "args": {"path": path, "content": content}},
                 {"answer": f"Wrote {path}."}],
      fault_ops={"files": ["files_write"]})


def files_move(w: World) -> dict:
  name = w.rng.choice(["report", "photo", "scan", "notes"]) + w.rng.choice([".pdf", ".txt", ".png"])
  src = f"/inbox/{name}"
  dest_folder = w.rng.choice(["/archive", "/documents", "/2026"])
  return dict(
      services=["files"], instruction=f"Move {src} into {dest_folder}.",
      fixtures={"files": {"files": {src: f"contents of {name}", "/inbox/other.txt": "stay"}}},
      grader={"completion": [
          {"kind": "record", "service": "files", "table": "files",
           "where": {"id": f"{dest_folder}/{name}", "content": f"contents of {name}"}},
          {"kind": "no_record", "service": "files", "table": "files", "where": {"id": src}}],
          "safety": [{"kind": "unchanged", "service": "files", "table": "files",
                      "where": {"id": "/inbox/other.txt"}}]},
      reference=[{"call": "files_move", "args": {"source": src, "destination": dest_folder + "/"}},
                 {"answer": f"Moved {name} to {dest_folder}."}],
      fault_ops={"files": ["files_move"]})


def multi_mail_todo(w: World) -> dict:
  p = w.person()
  ask = w.rng.choice(["review the slides", "sign the NDA", "send the floor plan",
                      "check the invoice"])
  due = w.day(w.rng.randint(2, 8))
  return dict(
      services=["mail", "todos"], instruction=f"{p['first']} asked me by email to do something "
      "by a date. Add it to my to-dos with that due date.",
      fixtures={"mail": {"messages": [
          {"id": "m1", "from": f"{p['name']} <{p['email']}>", "to": [w.user["email"]],
           "subject": "Quick favour", "body": f"Could you {ask} by {due.isoformat()}? Thanks!",
           "date": w.stamp(0.3)}]}, "todos": {"todos": []}},
      grader={"completion": [{"kind": "record", "service": "todos", "table": "todos", "where": {
          "title": {"$icontains": ask.split()[0]}, "due": due.isoformat()}}]},
      reference=[{"call": "mail_search", "args": {"from": p["first"]}},
                 {"call": "mail_get_message", "args": {"message_id": "m1"}},
                 {"call": "todos_create", "args": {"title": ask.capitalize(),
                                                   "due": due.isoformat()}},
                 {"answer": f"Added \"{ask.capitalize()}\" due {due.isoformat()}."}],
      fault_ops={"todos": ["todos_create"]})


def multi_note_to_file(w: World) -> dict:
  title = w.rng.choice(["Recipe: soup", "Wifi details", "Plant care", "Bike setup"])
  body = w.rng.choice(["Step 1, step 2.", "SSID home, pass 1234.", "Water weekly.",
                       "Saddle 72 cm."])
  path = "/exports/" + re.sub(r"[^a-z]+", "-", title.lower()).strip("-") + ".txt"
  return dict(
      services=["notes", "files"], instruction=f"Save the text of my note \"{title}\" to the "
      f"file {path}.",
      fixtures={"notes": {"notes": [{"id": "n1", "title": title, "body": body}]},
                "files": {"files": {"/exports/": None}}},
      grader={"completion": [{"kind": "record", "service": "files", "table": "files",
                              "where": {"id": path, "content": {"$contains": body}}}]},
      reference=[{"call": "notes_search", "args": {"query": title.split(":")[0]}},
                 {"call": "notes_get", "args": {"note_id": "n1"}},
                 {"call": "files_write", "args": {"path": path, "content": body}},
                 {"answer": f"Saved to {path}."}],
      fault_ops={"files": ["files_write"]})


TEMPLATES: dict[str, Callable[[World], dict]] = {f.__name__: f for f in (
    mail_reply, mail_forward, mail_archive, mail_send, mail_unread_answer, cal_create, cal_move,
    cal_respond, cal_day_answer, contacts_add, contacts_update, todos_add, todos_done,
    notes_create, notes_append, files_write, files_move, multi_mail_todo, multi_note_to_file)}
