"""booking.test: a restaurant's table booking form, with availability, validation and cancellation.

Pages: / (the booking form: date, time, party size, contact details, requests, the policy
checkbox; full time slots are shown and refused), /confirmation/<ref>, /bookings (every
booking, with Cancel). State: the bookings with their status ("confirmed" or "cancelled");
`state()` is what a task's checker reads.
"""
from __future__ import annotations

import copy
import datetime
import re
from typing import List, Optional

from .web import Request, Response, Site, esc, redirect

TODAY = "2026-12-01"
DAYS = 14
TIMES = tuple(f"{h}:{m:02d}" for h in range(17, 22) for m in (0, 30))
MAX_PARTY = 10
_EMAIL = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\Z")
_PHONE = re.compile(r"^\+?[0-9][0-9 ()-]{6,}\Z")
DEFAULT_BOOKINGS = [
    {"ref": "TV-1001", "date": "2026-12-04", "time": "19:00", "party": 2, "name": "Sam Patel",
     "email": "sam@example.test", "phone": "555 0101", "requests": "", "status": "confirmed"},
    {"ref": "TV-1002", "date": "2026-12-05", "time": "20:00", "party": 4, "name": "Jordan Lee",
     "email": "jordan@mail.test", "phone": "555 0199", "requests": "Window seat",
     "status": "confirmed"},
    {"ref": "TV-1003", "date": "2026-12-09", "time": "18:30", "party": 6, "name": "Jordan Lee",
     "email": "jordan@mail.test", "phone": "555 0199", "requests": "", "status": "confirmed"},
]
DEFAULT_FULL = [("2026-12-05", "19:00"), ("2026-12-05", "19:30"), ("2026-12-12", "20:00"),
                ("2026-12-12", "20:30"), ("2026-12-06", "18:00")]


def dates(today: str = TODAY) -> List[str]:
  """The bookable dates (ISO), today and the next DAYS - 1 days."""
  start = datetime.date.fromisoformat(today)
  return [(start + datetime.timedelta(days=i)).isoformat() for i in range(DAYS)]


def label(date: str) -> str:
  """'Fri 4 Dec' for '2026-12-04'."""
  d = datetime.date.fromisoformat(date)
  return f"{d.strftime('%a')} {d.day} {d.strftime('%b')}"


class Booking(Site):
  name = "booking"
  title = "Trattoria Verde"
  nav = (("Book a table", "/"), ("My bookings", "/bookings"))
  style = """
.dates,.times{display:grid;grid-template-columns:repeat(7,auto);gap:6px;justify-content:start}
.times{grid-template-columns:repeat(5,auto)} .dates label,.times label{margin:0;padding:6px 8px;
background:#fff;border:1px solid #bbb;border-radius:4px} .full{color:#999;text-decoration:line-through}
form.card{max-width:760px} .row{display:flex;gap:16px} .row div{flex:1} .row input{width:100%}
textarea{width:100%;height:60px}
"""

  def __init__(self):
    super().__init__()
    self.today = TODAY
    self.bookings: List[dict] = []
    self.full = set()
    self.next_ref = 1001
    for method, pattern, handler in (
        ("GET", "/", self.form), ("POST", "/book", self.book),
        ("GET", r"/confirmation/(?P<ref>TV-\d+)", self.confirmation),
        ("GET", "/bookings", self.list_bookings),
        ("POST", r"/bookings/(?P<ref>TV-\d+)/cancel", self.cancel)):
      self.route(method, pattern, handler)

  def reset(self, fixtures: dict) -> None:
    """fixtures: {"today", "bookings", "full": [[date, time], ...]} (all optional)."""
    self.today = fixtures.get("today", TODAY)
    datetime.date.fromisoformat(self.today)
    self.bookings = copy.deepcopy(fixtures.get("bookings", DEFAULT_BOOKINGS))
    self.full = {tuple(slot) for slot in fixtures.get("full", DEFAULT_FULL)}
    self.next_ref = 1 + max([1000] + [int(b["ref"].split("-")[1]) for b in self.bookings])
    self.flash = None

  def state(self) -> dict:
    return {"bookings": copy.deepcopy(self.bookings),
            "full": sorted(list(slot) for slot in self.full)}

  def _find(self, ref: str) -> Optional[dict]:
    return next((b for b in self.bookings if b["ref"] == ref), None)

  def form(self, req: Request, errors=(), values=None) -> Response:
    values = values or {}
    chosen_date, chosen_time = values.get("date", ""), values.get("time", "")
    date_opts = "".join(
        f"<label><input type='radio' name='date' value='{d}'"
        f"{' checked' if d == chosen_date else ''}> {label(d)}</label>" for d in dates(self.today))
    full_on = {t for d, t in self.full if d == chosen_date}
    time_opts = "".join(
        f"<label class='{'full' if t in full_on else ''}'><input type='radio' name='time' "
        f"value='{t}'{' checked' if t == chosen_time else ''}> {t}</label>" for t in TIMES)
    full_list = ", ".join(f"{label(d)} {t}" for d, t in sorted(self.full)
                          if d in dates(self.today))
    fields = "".join(
        f"<div><label for='{k}'>{text}</label><input type='{kind}' id='{k}' name='{k}' "
        f"value='{esc(values.get(k, ''))}'></div>"
        for k, text, kind in (("name", "Name", "text"), ("email", "Email", "text"),
                              ("phone", "Phone", "text")))
    error_html = "".join(f"<p class='error' role='alert'>{esc(e)}</p>" for e in errors)
    body = (
        f"<h1>Book a table</h1><p class='muted'>Fully booked: {esc(full_list) or 'nothing'}</p>"
        f"{error_html}<form method='post' action='/book' class='card'>"
        f"<fieldset><legend>Date</legend><div class='dates'>{date_opts}</div></fieldset>"
        f"<fieldset><legend>Time</legend><div class='times'>{time_opts}</div></fieldset>"
        f"<label for='party'>Party size (1-{MAX_PARTY})</label><input type='number' id='party' "
        f"name='party' min='1' max='{MAX_PARTY}' value='{esc(values.get('party', '2'))}'>"
        f"<div class='row'>{fields}</div><label for='requests'>Special requests</label>"
        f"<textarea id='requests' name='requests'>{esc(values.get('requests', ''))}</textarea>"
        f"<label><input type='checkbox' name='policy' value='yes'"
        f"{' checked' if values.get('policy') else ''}> I accept the cancellation policy"
        f"</label><p><button type='submit' id='book'>Book now</button></p></form>")
    return Response(self.page("Book a table", body), 422 if errors else 200)

  def book(self, req: Request) -> Response:
    values = {k: req.arg(k) for k in ("date", "time", "party", "name", "email", "phone",
                                      "requests", "policy")}
    errors = []
    if values["date"] not in dates(self.today):
      errors.append("Please choose a date.")
    if values["time"] not in TIMES:
      errors.append("Please choose a time.")
    try:
      party = int(values["party"])
      if not 1 <= party <= MAX_PARTY:
        raise ValueError
    except ValueError:
      party = 0
      errors.append(f"Party size must be a whole number from 1 to {MAX_PARTY}.")
    if not values["name"]:
      errors.append("Please enter your name.")
    if not _EMAIL.match(values["email"]):
      errors.append("Please enter a valid email address.")
    if not _PHONE.match(values["phone"]):
      errors.append("Please enter a valid phone number.")
    if values["policy"] != "yes":
      errors.append("Please accept the cancellation policy.")
    if not errors and (values["date"], values["time"]) in self.full:
      errors.append(f"Sorry, {label(values['date'])} at {values['time']} is fully booked. "
                    "Please choose another time.")
    if errors:
      return self.form(req, errors, values)
    ref = f"TV-{self.next_ref}"
    self.next_ref += 1
    self.bookings.append({"ref": ref, "date": values["date"], "time": values["time"],
                          "party": party, "name": values["name"], "email": values["email"],
                          "phone": values["phone"], "requests": values["requests"],
                          "status": "confirmed"})
    return redirect(f"/confirmation/{ref}")

  def confirmation(self, req: Request) -> Response:
    b = self._find(req.params["ref"])
    if b is None:
      return Response(self.page("Not found", "<h1>No such booking</h1>"), 404)
    body = (f"<h1>Booking confirmed</h1><div class='card'><p>Reference <b id='ref'>{b['ref']}"
            f"</b></p><p>{label(b['date'])} at {b['time']} for {b['party']} "
            f"{'person' if b['party'] == 1 else 'people'}, under the name {esc(b['name'])}."
            f"</p></div><p><a href='/bookings'>See all bookings</a></p>")
    return Response(self.page("Confirmed", body))

  def list_bookings(self, req: Request) -> Response:
    rows = []
    for b in sorted(self.bookings, key=lambda b: (b["date"], b["time"], b["ref"])):
      action = (f"<form method='post' action='/bookings/{b['ref']}/cancel'><button type='submit'"
                f" class='secondary' aria-label='Cancel {b['ref']}'>Cancel</button></form>"
                if b["status"] == "confirmed" else "")
      rows.append(f"<tr data-ref='{b['ref']}'><td>{b['ref']}</td><td>{label(b['date'])}</td>"
                  f"<td>{b['time']}</td><td>{b['party']}</td><td>{esc(b['name'])}</td>"
                  f"<td>{b['status']}</td><td>{action}</td></tr>")
    body = (f"<h1>My bookings</h1><table><tr><th>Reference</th><th>Date</th><th>Time</th>"
            f"<th>Party</th><th>Name</th><th>Status</th><th></th></tr>{''.join(rows)}</table>")
    return Response(self.page("My bookings", body))

  def cancel(self, req: Request) -> Response:
    b = self._find(req.params["ref"])
    if b is not None and b["status"] == "confirmed":
      b["status"] = "cancelled"
      self.flash = f"Booking {b['ref']} has been cancelled."
    return redirect("/bookings")
