"""Dates, times, time zones and recurrence rules for the assistant services (standard library).

Times cross the wire as ISO 8601 text. A date-time with an offset (`2026-03-02T09:00:00+01:00`,
`...Z`) is an instant; one without is a wall-clock time in the time zone the operation names
(an IANA name, resolved with `zoneinfo`). Instants are stored in UTC as
`YYYY-MM-DDTHH:MM:SSZ`.

Recurrence follows RFC 5545's RRULE for the parts a personal calendar uses: FREQ (DAILY,
WEEKLY, MONTHLY, YEARLY), INTERVAL, COUNT, UNTIL and BYDAY (weekly rules only, weeks starting
on Monday). Occurrences are generated in the event's own time zone, so a weekly 09:00 meeting
stays at 09:00 local time across daylight-saving changes; dates a rule names that do not exist
(31 April, 29 February in other years) are skipped, as RFC 5545 requires. `expand` is checked
against python-dateutil's rrule in the tests.
"""
from __future__ import annotations

import calendar as _calendar
import datetime as dt
import functools
import re
from typing import Iterator, List, Optional, Tuple

try:
  import zoneinfo
except ImportError:  # pragma: no cover - Python < 3.9
  zoneinfo = None

UTC = dt.timezone.utc
WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
FREQUENCIES = ("DAILY", "WEEKLY", "MONTHLY", "YEARLY")
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}\Z")
_DATETIME_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?"
    r"(Z|z|[+-]\d{2}:?\d{2})?$")
_MAX_OCCURRENCES = 5000   # a runaway rule stops here (about 13 years of a daily event)


@functools.lru_cache(maxsize=256)
def time_zone(name: str) -> dt.tzinfo:
  """The tzinfo of an IANA name ("UTC" always works).

  Raises:
    ValueError: not a known time zone.
  """
  if name in ("UTC", "Etc/UTC", "Z"):
    return UTC
  if zoneinfo is None or not name or "\x00" in name or name.startswith(("/", ".")) or ".." in name:
    raise ValueError(f"unknown time zone {name!r}")
  try:
    return zoneinfo.ZoneInfo(name)
  except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
    raise ValueError(f"unknown time zone {name!r}; expected an IANA name such as "
                     "Europe/Paris") from None


def is_time_zone(name: str) -> bool:
  try:
    time_zone(name)
    return True
  except ValueError:
    return False


def parse_date(text: str) -> dt.date:
  """`YYYY-MM-DD` -> date. Raises ValueError."""
  if not isinstance(text, str) or not _DATE_RE.match(text):
    raise ValueError(f"expected a date YYYY-MM-DD, got {text!r}")
  return dt.date.fromisoformat(text)


def parse_datetime(text: str, tz: Optional[str] = None) -> dt.datetime:
  """ISO 8601 date-time -> an aware datetime.

  Args:
    text: `YYYY-MM-DDTHH:MM[:SS[.ffffff]]` with an optional `Z` or `+HH:MM` offset; a bare date
      means its midnight.
    tz: the time zone of a text without offset (default UTC).
  Raises:
    ValueError: not a date-time, impossible values, or an unknown `tz`.
  """
  if not isinstance(text, str):
    raise ValueError(f"expected an ISO 8601 date-time, got {text!r}")
  if _DATE_RE.match(text):
    text += "T00:00"
  match = _DATETIME_RE.match(text.strip())
  if not match:
    raise ValueError(f"expected an ISO 8601 date-time such as 2026-03-02T09:30:00+01:00, got "
                     f"{text!r}")
  year, month, day, hour, minute = (int(match.group(i)) for i in range(1, 6))
  second = int(match.group(6) or 0)
  micro = int((match.group(7) or "0").ljust(6, "0"))
  naive = dt.datetime(year, month, day, hour, minute, second, micro)
  offset = match.group(8)
  if offset is None:
    return naive.replace(tzinfo=time_zone(tz or "UTC"))
  if offset in ("Z", "z"):
    return naive.replace(tzinfo=UTC)
  sign = 1 if offset[0] == "+" else -1
  digits = offset[1:].replace(":", "")
  hours, minutes = int(digits[:2]), int(digits[2:])
  if hours > 23 or minutes > 59:
    raise ValueError(f"offset {offset!r} out of range")
  return naive.replace(tzinfo=dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes)))


def to_utc_text(moment: dt.datetime) -> str:
  """An aware datetime as stored: `YYYY-MM-DDTHH:MM:SSZ` in UTC (seconds precision)."""
  return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_local_text(moment: dt.datetime, tz: str) -> str:
  """An aware datetime as wall-clock time in `tz`, with its offset (`...T09:00:00+01:00`)."""
  local = moment.astimezone(time_zone(tz)).replace(microsecond=0)
  return local.isoformat()


def utc(text: str) -> dt.datetime:
  """A stored UTC text back to an aware datetime."""
  return parse_datetime(text)


# ----------------------------------------------------------------------------- recurrence
class Rule:
  """A parsed RRULE (module docstring for the supported parts).

  Attributes:
    freq: DAILY, WEEKLY, MONTHLY or YEARLY.
    interval: every n-th period (>= 1).
    count: number of occurrences, or None.
    until: last possible start (aware), or None; a date-only UNTIL covers that whole day in
      the event's time zone.
    byday: weekday numbers (0 = Monday) for WEEKLY rules, sorted, or ().
  """

  def __init__(self, freq: str, interval: int = 1, count: Optional[int] = None,
               until: Optional[dt.datetime] = None, byday: Tuple[int, ...] = ()):
    self.freq, self.interval, self.count, self.until, self.byday = (
        freq, interval, count, until, byday)


def parse_rule(text: str, tz: str = "UTC") -> Rule:
  """`FREQ=WEEKLY;BYDAY=MO,WE;COUNT=6` (an optional `RRULE:` prefix is allowed) -> Rule.

  Raises:
    ValueError: one line saying which part is wrong and what is supported.
  """
  if not isinstance(text, str) or not text.strip():
    raise ValueError("expected an RRULE such as FREQ=WEEKLY;BYDAY=MO;COUNT=4, got an empty rule")
  body = text.strip()
  if body.upper().startswith("RRULE:"):
    body = body[6:]
  parts = {}
  for item in body.split(";"):
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"RRULE part {item!r} is not NAME=VALUE")
    name, value = item.split("=", 1)
    name = name.strip().upper()
    if name in parts:
      raise ValueError(f"RRULE part {name} appears twice")
    parts[name] = value.strip()
  supported = {"FREQ", "INTERVAL", "COUNT", "UNTIL", "BYDAY", "WKST"}
  unknown = sorted(set(parts) - supported)
  if unknown:
    raise ValueError(f"RRULE part(s) {', '.join(unknown)} not supported; use "
                     f"{', '.join(sorted(supported))}")
  freq = parts.get("FREQ", "").upper()
  if freq not in FREQUENCIES:
    raise ValueError(f"RRULE FREQ must be one of {', '.join(FREQUENCIES)}, got {freq or 'none'!r}")
  if parts.get("WKST", "MO").upper() != "MO":
    raise ValueError("RRULE WKST other than MO is not supported")
  interval = _positive(parts.get("INTERVAL", "1"), "INTERVAL")
  count = _positive(parts["COUNT"], "COUNT") if "COUNT" in parts else None
  until = None
  if "UNTIL" in parts:
    if count is not None:
      raise ValueError("RRULE may have COUNT or UNTIL, not both")
    until = _parse_until(parts["UNTIL"], tz)
  byday: Tuple[int, ...] = ()
  if "BYDAY" in parts:
    if freq != "WEEKLY":
      raise ValueError("RRULE BYDAY is supported with FREQ=WEEKLY only")
    days = [d.strip().upper() for d in parts["BYDAY"].split(",") if d.strip()]
    bad = [d for d in days if d not in WEEKDAYS]
    if bad or not days:
      raise ValueError(f"RRULE BYDAY must list days of {','.join(WEEKDAYS)}, got "
                       f"{parts['BYDAY']!r}")
    byday = tuple(sorted({WEEKDAYS.index(d) for d in days}))
  return Rule(freq, interval, count, until, byday)


def _positive(text: str, name: str) -> int:
  if not text.isdigit() or int(text) < 1 or int(text) > 10000:
    raise ValueError(f"RRULE {name} must be an integer from 1 to 10000, got {text!r}")
  return int(text)


def _parse_until(text: str, tz: str) -> dt.datetime:
  compact = re.match(r"^(\d{4})(\d{2})(\d{2})(?:T(\d{2})(\d{2})(\d{2})(Z?))?\Z", text)
  try:
    if compact:
      y, m, d = int(compact.group(1)), int(compact.group(2)), int(compact.group(3))
      if compact.group(4) is None:
        return dt.datetime(y, m, d, 23, 59, 59, tzinfo=time_zone(tz))
      naive = dt.datetime(y, m, d, int(compact.group(4)), int(compact.group(5)),
                          int(compact.group(6)))
      return naive.replace(tzinfo=UTC if compact.group(7) else time_zone(tz))
    if _DATE_RE.match(text):
      return parse_datetime(text + "T23:59:59", tz)
    return parse_datetime(text, tz)
  except ValueError:
    raise ValueError(f"RRULE UNTIL must be a date or date-time (20260401 or "
                     f"20260401T120000Z), got {text!r}") from None


def _local_starts(rule: Rule, start_local: dt.datetime) -> Iterator[dt.datetime]:
  """Naive wall-clock starts of the rule's periods from `start_local` on (unbounded)."""
  if rule.freq == "DAILY":
    k = 0
    while True:
      yield start_local + dt.timedelta(days=k * rule.interval)
      k += 1
  elif rule.freq == "WEEKLY":
    days = rule.byday or (start_local.weekday(),)
    week0 = start_local - dt.timedelta(days=start_local.weekday())
    k = 0
    while True:
      week = week0 + dt.timedelta(weeks=k * rule.interval)
      for day in days:
        moment = week + dt.timedelta(days=day)
        if moment >= start_local:
          yield moment
      k += 1
  elif rule.freq == "MONTHLY":
    k = 0
    while True:
      month0 = start_local.month - 1 + k * rule.interval
      year, month = start_local.year + month0 // 12, month0 % 12 + 1
      if year > dt.MAXYEAR:
        return
      if start_local.day <= _calendar.monthrange(year, month)[1]:
        yield start_local.replace(year=year, month=month)
      k += 1
  else:
    k = 0
    while True:
      year = start_local.year + k * rule.interval
      if year > dt.MAXYEAR:
        return
      if start_local.day <= _calendar.monthrange(year, start_local.month)[1]:
        yield start_local.replace(year=year)
      k += 1


def expand(rule: Rule, start: dt.datetime, tz: str, window_start: dt.datetime,
           window_end: dt.datetime, exdates: Tuple[str, ...] = ()) -> List[dt.datetime]:
  """Starts (aware, in `tz`) of the occurrences that begin in [window_start, window_end).

  Args:
    rule: the parsed rule.
    start: the first occurrence's start (aware); its wall time in `tz` repeats.
    tz: the event's IANA time zone.
    window_start, window_end: aware bounds.
    exdates: stored UTC texts of occurrences that were deleted.
  """
  zone = time_zone(tz)
  given = start.astimezone(zone)
  # The occurrences repeat the start's wall time, each read as RFC 5545 section 3.3.5 reads a
  # local time: one skipped by a DST gap with the UTC offset before the gap, an ambiguous one
  # as its first occurrence (fold 0). Only the start itself keeps the instant it was given
  # (e.g. the second 01:30 of a night the clocks go back, or fold 1 inside a gap).
  start_local = given.replace(tzinfo=None, fold=0)
  excluded = set(exdates)
  found: List[dt.datetime] = []
  for n, local in enumerate(_local_starts(rule, start_local)):
    if n >= _MAX_OCCURRENCES or (rule.count is not None and n >= rule.count):
      break
    moment = given if local == start_local else local.replace(tzinfo=zone, fold=0)
    if rule.until is not None and moment > rule.until:
      break
    if moment >= window_end:
      break
    if moment >= window_start and to_utc_text(moment) not in excluded:
      found.append(moment)
  return found
