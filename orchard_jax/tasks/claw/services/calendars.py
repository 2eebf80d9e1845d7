"""Calendar: events, invitations, free/busy, time zones and recurrence (a Google-Calendar-like
calendar of one user).

Fixtures (`fixtures.calendar`):
  events: [{id, title, start, end, timezone, location, description, organizer,
            attendees: [addr or {email, response}], recurrence (RRULE), exdates [...]}]
  busy:   [{email, start, end}]   other people's busy time, for free/busy queries
Times without an offset are wall-clock times in the event's `timezone` (default the user's,
`user.timezone`, else UTC). Stored instants are UTC; answers show wall-clock times with their
offset in the time zone asked for (`timezone` argument, default the user's).
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, Optional

from . import timeutil
from .core import (BadArguments, Conflict, NotFound, Operation, Service, array, obj, string)

RESPONSES = ("accepted", "declined", "tentative")
_MAX_EVENT = dt.timedelta(days=14)
_MAX_WINDOW = dt.timedelta(days=400)
_EVENT_ID = string("id of an event", minLength=1)
_TZ = string("IANA time zone, e.g. Europe/Paris (default: the user's)", format="time-zone")
_WHEN = "ISO 8601 date-time; without an offset it is wall-clock time in `timezone`"


def _time(text: str, tz: str, field: str) -> dt.datetime:
  try:
    return timeutil.parse_datetime(text, tz)
  except ValueError as e:
    raise BadArguments(f"arguments.{field}: {e}") from None


class CalendarService(Service):
  name = "calendar"
  tables = {
      "events": "id TEXT PRIMARY KEY, title TEXT, start TEXT, end TEXT, timezone TEXT, "
                "location TEXT, description TEXT, organizer TEXT, attendees TEXT, "
                "recurrence TEXT, exdates TEXT",
      "busy": "id TEXT PRIMARY KEY, email TEXT, start TEXT, end TEXT",
  }
  json_columns = {"events": ("attendees", "exdates")}
  id_prefixes = {"events": "evt_", "busy": "busy_"}

  @property
  def me(self) -> str:
    return str(self.user.get("email") or "alex@example.com").lower()

  @property
  def user_tz(self) -> str:
    return str(self.user.get("timezone") or "UTC")

  # ------------------------------------------------------------------ fixtures
  def load_fixtures(self, fixtures: Dict[str, Any]) -> None:
    for e in fixtures.get("events") or ():
      tz = e.get("timezone") or self.user_tz
      timeutil.time_zone(tz)
      start = timeutil.parse_datetime(e["start"], tz)
      end = timeutil.parse_datetime(e["end"], tz)
      if e.get("recurrence"):
        timeutil.parse_rule(e["recurrence"], tz)
      attendees = []
      for x in e.get("attendees") or ():
        entry = {"email": x, "response": "needs_action"} if isinstance(x, str) else dict(x)
        entry["email"] = entry["email"].lower()
        entry.setdefault("response", "needs_action")
        attendees.append(entry)
      self.insert("events", {
          "id": e.get("id"), "title": e.get("title", ""), "start": timeutil.to_utc_text(start),
          "end": timeutil.to_utc_text(end), "timezone": tz, "location": e.get("location", ""),
          "description": e.get("description", ""),
          "organizer": (e.get("organizer") or self.me).lower(), "attendees": attendees,
          "recurrence": e.get("recurrence"), "exdates": [
              timeutil.to_utc_text(timeutil.parse_datetime(x, tz))
              for x in e.get("exdates") or ()]})
    for b in fixtures.get("busy") or ():
      self.insert("busy", {"email": b["email"].lower(),
                           "start": timeutil.to_utc_text(timeutil.parse_datetime(b["start"])),
                           "end": timeutil.to_utc_text(timeutil.parse_datetime(b["end"]))})

  # ------------------------------------------------------------------ helpers
  def _event(self, event_id: str) -> Dict[str, Any]:
    return self.get("events", event_id, "event")

  def _my_response(self, e: Dict[str, Any]) -> str:
    if e["organizer"] == self.me:
      return "organizer"
    for a in e["attendees"]:
      if a["email"] == self.me:
        return a["response"]
    return "none"

  def occurrences(self, e: Dict[str, Any], start: dt.datetime, end: dt.datetime) -> List[tuple]:
    """(start, end) pairs of the event's occurrences overlapping [start, end)."""
    first, last = timeutil.utc(e["start"]), timeutil.utc(e["end"])
    duration = last - first
    if not e["recurrence"]:
      return [(first, last)] if first < end and last > start else []
    rule = timeutil.parse_rule(e["recurrence"], e["timezone"])
    starts = timeutil.expand(rule, first, e["timezone"], start - duration, end,
                             tuple(e["exdates"] or ()))
    return [(s, s + duration) for s in starts if s + duration > start]

  def _view(self, e: Dict[str, Any], tz: str, occurrence: Optional[tuple] = None) -> Dict:
    start, end = occurrence or (timeutil.utc(e["start"]), timeutil.utc(e["end"]))
    view = {"event_id": e["id"], "title": e["title"],
            "start": timeutil.to_local_text(start, tz), "end": timeutil.to_local_text(end, tz),
            "timezone": tz, "event_timezone": e["timezone"], "location": e["location"],
            "organizer": e["organizer"], "attendees": e["attendees"],
            "my_response": self._my_response(e), "recurrence": e["recurrence"]}
    if e["description"]:
      view["description"] = e["description"]
    return view

  def _window(self, a: Dict[str, Any], tz: str) -> tuple:
    start, end = _time(a["start"], tz, "start"), _time(a["end"], tz, "end")
    if end <= start:
      raise BadArguments(f"arguments.end: expected a time after start ({a['start']}), got "
                         f"{a['end']!r}")
    if end - start > _MAX_WINDOW:
      raise BadArguments(f"arguments: the window may span at most {_MAX_WINDOW.days} days, got "
                         f"{(end - start).days}")
    return start, end

  def _times(self, a: Dict[str, Any], tz: str, old: Optional[Dict] = None) -> tuple:
    start = _time(a["start"], tz, "start") if "start" in a else timeutil.utc(old["start"])
    if "end" in a:
      end = _time(a["end"], tz, "end")
    elif old is not None:
      end = start + (timeutil.utc(old["end"]) - timeutil.utc(old["start"]))
    else:
      raise BadArguments("arguments: missing required field(s) end")
    if end <= start:
      raise BadArguments(f"arguments.end: expected a time after the start "
                         f"({timeutil.to_local_text(start, tz)}), got "
                         f"{timeutil.to_local_text(end, tz)}")
    if end - start > _MAX_EVENT:
      raise BadArguments(f"arguments.end: an event may last at most {_MAX_EVENT.days} days")
    return start, end

  def _rule(self, a: Dict[str, Any], tz: str) -> Optional[str]:
    text = a.get("recurrence")
    if not text:
      return None
    try:
      timeutil.parse_rule(text, tz)
    except ValueError as e:
      raise BadArguments(f"arguments.recurrence: {e}") from None
    return text.strip()[6:] if text.strip().upper().startswith("RRULE:") else text.strip()

  # ------------------------------------------------------------------ operations
  def operations(self) -> List[Operation]:
    attendees = array({"type": "string", "format": "email"}, "attendee email addresses")
    return [
        Operation("calendar_list_events", "/events/list",
                  "List event occurrences overlapping a time window, earliest first "
                  "(recurring events appear once per occurrence).",
                  obj({"start": string(f"window start: {_WHEN}"),
                       "end": string(f"window end: {_WHEN}"), "timezone": _TZ,
                       "query": string("only events whose title, location or description "
                                       "contains this text")}, ["start", "end"]),
                  CalendarService.list_events),
        Operation("calendar_get_event", "/events/get", "Read one event in full.",
                  obj({"event_id": _EVENT_ID, "timezone": _TZ}, ["event_id"]),
                  CalendarService.get_event),
        Operation("calendar_create_event", "/events/create",
                  "Create an event organised by the user; attendees are invited.",
                  obj({"title": string("event title", minLength=1),
                       "start": string(f"start: {_WHEN}"), "end": string(f"end: {_WHEN}"),
                       "timezone": _TZ, "attendees": attendees,
                       "location": string("where"), "description": string("details"),
                       "recurrence": string("RRULE, e.g. FREQ=WEEKLY;BYDAY=MO;COUNT=4 "
                                            "(FREQ DAILY/WEEKLY/MONTHLY/YEARLY, INTERVAL, "
                                            "COUNT, UNTIL, BYDAY)")},
                      ["title", "start", "end"]), CalendarService.create_event, mutates=True),
        Operation("calendar_update_event", "/events/update",
                  "Change an event the user organises (given fields are replaced; moving the "
                  "start keeps the duration unless `end` is given).",
                  obj({"event_id": _EVENT_ID, "title": string("event title", minLength=1),
                       "start": string(f"new start: {_WHEN}"), "end": string(f"new end: {_WHEN}"),
                       "timezone": _TZ, "attendees": attendees, "location": string("where"),
                       "description": string("details"),
                       "recurrence": string("new RRULE, or '' to stop repeating")},
                      ["event_id"]), CalendarService.update_event, mutates=True),
        Operation("calendar_delete_event", "/events/delete",
                  "Delete an event the user organises, or with `occurrence_start` only that "
                  "occurrence of a recurring event.",
                  obj({"event_id": _EVENT_ID,
                       "occurrence_start": string(f"start of the one occurrence to delete: "
                                                  f"{_WHEN}"), "timezone": _TZ},
                      ["event_id"]), CalendarService.delete_event, mutates=True),
        Operation("calendar_list_invitations", "/invitations/list",
                  "List invitations the user has not answered yet.",
                  obj({"timezone": _TZ}), CalendarService.list_invitations),
        Operation("calendar_respond", "/invitations/respond",
                  "Accept, decline or tentatively accept an invitation.",
                  obj({"event_id": _EVENT_ID,
                       "response": string("accepted, declined or tentative",
                                          enum=list(RESPONSES))}, ["event_id", "response"]),
                  CalendarService.respond, mutates=True),
        Operation("calendar_free_busy", "/freebusy",
                  "Busy intervals of people (the user included) in a time window.",
                  obj({"emails": array({"type": "string", "format": "email"},
                                       "whose busy time to return", minItems=1),
                       "start": string(f"window start: {_WHEN}"),
                       "end": string(f"window end: {_WHEN}"), "timezone": _TZ},
                      ["emails", "start", "end"]), CalendarService.free_busy),
    ]

  def list_events(self, a: Dict[str, Any]) -> Dict[str, Any]:
    tz = a.get("timezone") or self.user_tz
    start, end = self._window(a, tz)
    query = (a.get("query") or "").lower()
    found = []
    for e in self.select("events"):
      if query and query not in f"{e['title']} {e['location']} {e['description']}".lower():
        continue
      for occurrence in self.occurrences(e, start, end):
        found.append((occurrence[0], self._view(e, tz, occurrence)))
    found.sort(key=lambda pair: (pair[0], pair[1]["event_id"]))
    return {"timezone": tz, "events": [view for _, view in found]}

  def get_event(self, a: Dict[str, Any]) -> Dict[str, Any]:
    e = self._event(a["event_id"])
    view = self._view(e, a.get("timezone") or self.user_tz)
    view["exdates"] = e["exdates"]
    return {"event": view}

  def create_event(self, a: Dict[str, Any]) -> Dict[str, Any]:
    tz = a.get("timezone") or self.user_tz
    start, end = self._times(a, tz)
    e = self.insert("events", {
        "title": a["title"], "start": timeutil.to_utc_text(start),
        "end": timeutil.to_utc_text(end), "timezone": tz, "location": a.get("location", ""),
        "description": a.get("description", ""), "organizer": self.me,
        "attendees": [{"email": x.lower(), "response": "needs_action"}
                      for x in _unique(a.get("attendees", []))],
        "recurrence": self._rule(a, tz), "exdates": []})
    return {"event": self._view(e, tz)}

  def _mine(self, event_id: str, action: str) -> Dict[str, Any]:
    e = self._event(event_id)
    if e["organizer"] != self.me:
      raise Conflict(f"event {event_id!r} is organised by {e['organizer']}; only its organiser "
                     f"can {action} it (answer the invitation with calendar_respond instead)")
    return e

  def update_event(self, a: Dict[str, Any]) -> Dict[str, Any]:
    e = self._mine(a["event_id"], "change")
    tz = a.get("timezone") or e["timezone"]
    values: Dict[str, Any] = {}
    if "start" in a or "end" in a:
      start, end = self._times(a, tz, e)
      values.update(start=timeutil.to_utc_text(start), end=timeutil.to_utc_text(end))
    if "timezone" in a:
      values["timezone"] = tz
    for field in ("title", "location", "description"):
      if field in a:
        values[field] = a[field]
    if "attendees" in a:
      old = {x["email"]: x["response"] for x in e["attendees"]}
      values["attendees"] = [{"email": x.lower(), "response": old.get(x.lower(), "needs_action")}
                             for x in _unique(a["attendees"])]
    if "recurrence" in a:
      values["recurrence"] = self._rule(a, tz)
    e = self.update("events", e["id"], values)
    return {"event": self._view(e, a.get("timezone") or self.user_tz)}

  def delete_event(self, a: Dict[str, Any]) -> Dict[str, Any]:
    e = self._mine(a["event_id"], "delete")
    if "occurrence_start" not in a:
      self.db.execute("DELETE FROM events WHERE id = ?", (e["id"],))
      return {"deleted": e["id"]}
    if not e["recurrence"]:
      raise BadArguments(f"arguments.occurrence_start: event {e['id']!r} does not repeat; "
                         "delete it without occurrence_start")
    tz = a.get("timezone") or self.user_tz
    moment = _time(a["occurrence_start"], tz, "occurrence_start")
    hits = [s for s, _ in self.occurrences(e, moment, moment + dt.timedelta(seconds=1))
            if s == moment]
    if not hits:
      raise NotFound(f"event {e['id']!r} has no occurrence starting at "
                     f"{timeutil.to_local_text(moment, tz)}")
    exdates = list(e["exdates"] or []) + [timeutil.to_utc_text(moment)]
    self.update("events", e["id"], {"exdates": exdates})
    return {"deleted_occurrence": timeutil.to_local_text(moment, tz), "event_id": e["id"]}

  def list_invitations(self, a: Dict[str, Any]) -> Dict[str, Any]:
    tz = a.get("timezone") or self.user_tz
    pending = [self._view(e, tz) for e in self.select("events", order="start, rowid")
               if self._my_response(e) == "needs_action"]
    return {"invitations": pending}

  def respond(self, a: Dict[str, Any]) -> Dict[str, Any]:
    e = self._event(a["event_id"])
    if e["organizer"] == self.me:
      raise Conflict(f"the user organises event {e['id']!r}; there is no invitation to answer")
    attendees = e["attendees"]
    for x in attendees:
      if x["email"] == self.me:
        x["response"] = a["response"]
        break
    else:
      raise Conflict(f"the user is not invited to event {e['id']!r}")
    e = self.update("events", e["id"], {"attendees": attendees})
    return {"event": self._view(e, self.user_tz)}

  def free_busy(self, a: Dict[str, Any]) -> Dict[str, Any]:
    tz = a.get("timezone") or self.user_tz
    start, end = self._window(a, tz)
    result = {}
    for email in _unique([x.lower() for x in a["emails"]]):
      intervals = []
      for b in self.select("busy", "email = ?", (email,)):
        s, t = timeutil.utc(b["start"]), timeutil.utc(b["end"])
        if s < end and t > start:
          intervals.append((s, t))
      for e in self.select("events"):
        going = e["organizer"] == email or any(
            x["email"] == email and x["response"] != "declined" for x in e["attendees"])
        if going:
          intervals.extend(self.occurrences(e, start, end))
      result[email] = [{"start": timeutil.to_local_text(s, tz), "end": timeutil.to_local_text(t, tz)}
                       for s, t in _merge(intervals)]
    return {"timezone": tz, "busy": result}


def _unique(values: List[str]) -> List[str]:
  seen, out = set(), []
  for v in values:
    if v.lower() not in seen:
      seen.add(v.lower())
      out.append(v)
  return out


def _merge(intervals: List[tuple]) -> List[tuple]:
  merged: List[list] = []
  for s, t in sorted(intervals):
    if merged and s <= merged[-1][1]:
      merged[-1][1] = max(merged[-1][1], t)
    else:
      merged.append([s, t])
  return [tuple(x) for x in merged]
