"""Task families of booking.test: book a table (possibly the next free time), cancel a booking."""
from __future__ import annotations

from orchard_jax.tasks.gui.driver import booking as site
from orchard_jax.tasks.gui.expert import click, fill
from orchard_jax.tasks.gui.sitetasks.base import Template, fail, ok, same_text

START = "http://booking.test/"
_GUESTS = (("Priya Raman", "priya@example.test", "555 0142"),
           ("Lucas Moreau", "lucas@example.test", "+33 6 12 34 56 78"),
           ("Jordan Lee", "jordan@mail.test", "555 0199"),
           ("Olga Petrova", "olga@example.test", "555 0177"))


def _new_bookings(state: dict) -> list:
  known = {b["ref"] for b in site.DEFAULT_BOOKINGS}
  return [b for b in state.get("bookings", []) if b["ref"] not in known]


def _book(view, p, date, time, party, *, accept=True):
  yield from click(view, ".dates label", contains=site.label(date))
  yield from click(view, ".times label", text=time)
  yield from fill(view, "#party", str(party))
  for key in ("name", "email", "phone"):
    yield from fill(view, f"#{key}", p[key])
  if p.get("requests"):
    yield from fill(view, "#requests", p["requests"])
  if accept:
    yield from click(view, "input[name=policy]")
  yield from click(view, "#book")
  yield ("done", {})


def _matches(b: dict, p: dict, time: str) -> list:
  problems = []
  for key, want in (("date", p["date"]), ("time", time), ("party", p["party"])):
    if b.get(key) != want:
      problems.append(f"{key} {b.get(key)!r} instead of {want!r}")
  for key in ("name", "email", "phone"):
    if not same_text(b.get(key, ""), p[key]):
      problems.append(f"{key} {b.get(key)!r} instead of {p[key]!r}")
  if p.get("requests") and not same_text(b.get("requests", ""), p["requests"]):
    problems.append(f"requests {b.get('requests')!r} instead of {p['requests']!r}")
  return problems


class Book(Template):
  """Book a table with given date, time, party size, contact and request."""
  family = "booking/book"
  site = "booking"
  steps = 30

  def params(self):
    slots = (("2026-12-03", "19:30", 2, ""), ("2026-12-07", "18:00", 4, "A high chair, please"),
             ("2026-12-10", "20:30", 6, ""), ("2026-12-13", "17:30", 3, "Vegetarian menu"),
             ("2026-12-02", "21:00", 1, ""), ("2026-12-11", "19:00", 8, "Birthday cake at 21:00"))
    out = []
    for i, (date, time, party, requests) in enumerate(slots):
      name, email, phone = _GUESTS[i % len(_GUESTS)]
      out.append({"date": date, "time": time, "party": party, "name": name, "email": email,
                  "phone": phone, "requests": requests})
    return out

  def instruction(self, p):
    text = (f"Book a table for {p['party']} on {site.label(p['date'])} at {p['time']} under the "
            f"name {p['name']} (email {p['email']}, phone {p['phone']})")
    return text + (f", with the special request \"{p['requests']}\"." if p["requests"] else ".")

  def check(self, p, state, answer):
    new = _new_bookings(state)
    if len(new) != 1:
      return fail(f"expected exactly one new booking, found {len(new)}")
    problems = _matches(new[0], p, p["time"])
    return fail("; ".join(problems)) if problems else ok(f"booking {new[0]['ref']} matches")

  def expert(self, p, view):
    yield from _book(view, p, p["date"], p["time"], p["party"])

  def wrong(self, p, view):   # one person too many
    yield from _book(view, p, p["date"], p["time"], p["party"] + 1)


class NextFree(Template):
  """Book a time that turns out to be full: the next free time that evening."""
  family = "booking/next_free"
  site = "booking"
  steps = 30

  def params(self):
    out = []
    for i, (date, time) in enumerate(sorted(site.DEFAULT_FULL)):
      if (date, site.TIMES[site.TIMES.index(time) - 1] if site.TIMES.index(time) else "") in \
          site.DEFAULT_FULL:
        continue   # ask for the first full slot of a run
      name, email, phone = _GUESTS[(i + 1) % len(_GUESTS)]
      later = [t for t in site.TIMES[site.TIMES.index(time):] if (date, t) not in site.DEFAULT_FULL]
      out.append({"date": date, "time": time, "party": 2 + i % 3, "name": name,
                  "email": email, "phone": phone, "requests": "", "answer": later[0]})
    return out

  def instruction(self, p):
    return (f"Book a table for {p['party']} on {site.label(p['date'])} at {p['time']} under the "
            f"name {p['name']} (email {p['email']}, phone {p['phone']}). If that time is fully "
            f"booked, book the next available time that evening instead.")

  def check(self, p, state, answer):
    new = [b for b in _new_bookings(state) if b["status"] == "confirmed"]
    if len(new) != 1:
      return fail(f"expected exactly one new booking, found {len(new)}")
    problems = _matches(new[0], p, p["answer"])
    return fail("; ".join(problems)) if problems else ok(f"booking {new[0]['ref']} matches")

  def expert(self, p, view):
    yield from _book(view, p, p["date"], p["answer"], p["party"])

  def wrong(self, p, view):   # takes the time after the next free one
    later = site.TIMES[site.TIMES.index(p["answer"]) + 1]
    yield from _book(view, p, p["date"], later, p["party"])


class Cancel(Template):
  """Cancel one of several bookings (the others stay)."""
  family = "booking/cancel"
  site = "booking"

  def params(self):
    return [{"ref": b["ref"]} for b in site.DEFAULT_BOOKINGS]

  def _booking(self, p):
    return next(b for b in site.DEFAULT_BOOKINGS if b["ref"] == p["ref"])

  def instruction(self, p):
    b = self._booking(p)
    return (f"Cancel the booking for {b['party']} on {site.label(b['date'])} at {b['time']} "
            f"under the name {b['name']}. Keep the other bookings.")

  def check(self, p, state, answer):
    status = {b["ref"]: b["status"] for b in state.get("bookings", [])}
    wrong = [r for r, s in status.items() if (s == "cancelled") != (r == p["ref"])]
    if wrong:
      return fail(f"bookings in the wrong state: {', '.join(f'{r} {status[r]}' for r in wrong)}")
    return ok(f"{p['ref']} is cancelled and the others are not")

  def _cancel(self, view, ref):
    yield from click(view, "header nav a", text="My bookings")
    yield from click(view, f"tr[data-ref='{ref}'] button")
    yield ("done", {})

  def expert(self, p, view):
    yield from self._cancel(view, p["ref"])

  def wrong(self, p, view):
    other = next(b["ref"] for b in site.DEFAULT_BOOKINGS if b["ref"] != p["ref"])
    yield from self._cancel(view, other)


TEMPLATES = (Book(), NextFree(), Cancel())
