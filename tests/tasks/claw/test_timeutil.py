"""Recurrence expansion and date-time parsing of the calendar service, checked against
python-dateutil's rrule (the independent RFC 5545 implementation) and zoneinfo."""
import datetime as dt
import zoneinfo

import pytest
from dateutil import rrule
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax.tasks.claw.services import timeutil

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney"]
FREQS = {"DAILY": rrule.DAILY, "WEEKLY": rrule.WEEKLY, "MONTHLY": rrule.MONTHLY,
         "YEARLY": rrule.YEARLY}
DAYS = [rrule.MO, rrule.TU, rrule.WE, rrule.TH, rrule.FR, rrule.SA, rrule.SU]


@st.composite
def rules(draw):
  freq = draw(st.sampled_from(sorted(FREQS)))
  interval = draw(st.integers(1, 4))
  count = draw(st.integers(1, 30))
  byday = ()
  if freq == "WEEKLY" and draw(st.booleans()):
    byday = tuple(sorted(draw(st.sets(st.integers(0, 6), min_size=1, max_size=4))))
  tz = draw(st.sampled_from(ZONES))
  start = draw(st.datetimes(min_value=dt.datetime(2025, 1, 1), max_value=dt.datetime(2027, 12, 31)))
  start = start.replace(second=0, microsecond=0, minute=start.minute // 15 * 15)
  return freq, interval, count, byday, tz, start


@settings(max_examples=300, deadline=None)
@given(rules())
def test_expand_matches_dateutil(case):
  freq, interval, count, byday, tz, start_local = case
  text = f"FREQ={freq};INTERVAL={interval};COUNT={count}"
  if byday:
    text += ";BYDAY=" + ",".join(timeutil.WEEKDAYS[d] for d in byday)
  zone = zoneinfo.ZoneInfo(tz)
  start = start_local.replace(tzinfo=zone)
  ours = timeutil.expand(timeutil.parse_rule(text, tz), start, tz,
                         dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc),
                         dt.datetime(2400, 1, 1, tzinfo=dt.timezone.utc))
  kwargs = dict(freq=FREQS[freq], interval=interval, count=count, dtstart=start_local)
  if byday:
    kwargs["byweekday"] = [DAYS[d] for d in byday]
  reference = list(rrule.rrule(**kwargs))
  # Wall-clock times repeat; the instants follow each date's own UTC offset, a wall time in a
  # DST gap or overlap read with fold 0 (RFC 5545 3.3.5, as rrule's results carry), except the
  # start itself, which keeps the instant it was given (fold 1 included).
  assert [o.astimezone(zone).replace(tzinfo=None) for o in ours] == reference
  assert [o.astimezone(dt.timezone.utc) for o in ours] == [
      (start if r == start_local else r.replace(tzinfo=zone)).astimezone(dt.timezone.utc)
      for r in reference]


def test_a_start_given_with_fold_1_in_a_dst_gap_keeps_its_instant_and_the_rest_read_fold_0():
  """The example hypothesis found: 02:00 on 2025-03-09 does not exist in New York."""
  zone = zoneinfo.ZoneInfo("America/New_York")
  start = dt.datetime(2025, 3, 9, 2, 0, fold=1, tzinfo=zone)        # 06:00 UTC (EDT's offset)
  got = timeutil.expand(timeutil.parse_rule("FREQ=DAILY;COUNT=2", "America/New_York"), start,
                        "America/New_York", dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc),
                        dt.datetime(2400, 1, 1, tzinfo=dt.timezone.utc))
  assert [g.astimezone(dt.timezone.utc) for g in got] == [
      dt.datetime(2025, 3, 9, 6, 0, tzinfo=dt.timezone.utc),
      dt.datetime(2025, 3, 10, 6, 0, tzinfo=dt.timezone.utc)]          # 02:00 EDT


def test_until_and_window_and_exdates():
  tz = "Europe/Berlin"
  start = timeutil.parse_datetime("2026-03-02T09:00", tz)
  rule = timeutil.parse_rule("FREQ=DAILY;UNTIL=20260306", tz)
  got = timeutil.expand(rule, start, tz, start, start + dt.timedelta(days=30),
                        exdates=("2026-03-04T08:00:00Z",))
  assert [timeutil.to_local_text(g, tz)[:10] for g in got] == [
      "2026-03-02", "2026-03-03", "2026-03-05", "2026-03-06"]
  window = timeutil.expand(rule, start, tz, timeutil.parse_datetime("2026-03-05T00:00", tz),
                           timeutil.parse_datetime("2026-03-06T00:00", tz))
  assert [timeutil.to_local_text(g, tz) for g in window] == ["2026-03-05T09:00:00+01:00"]


def test_weekly_meeting_keeps_local_time_across_dst():
  tz = "America/New_York"
  start = timeutil.parse_datetime("2026-03-02T09:00", tz)       # EST, UTC-5
  got = timeutil.expand(timeutil.parse_rule("FREQ=WEEKLY;COUNT=3", tz), start, tz, start,
                        start + dt.timedelta(days=60))
  assert [timeutil.to_utc_text(g) for g in got] == [
      "2026-03-02T14:00:00Z", "2026-03-09T13:00:00Z", "2026-03-16T13:00:00Z"]


@pytest.mark.parametrize("text,problem", [
    ("", "empty"), ("FREQ=HOURLY", "FREQ must be"), ("FREQ=DAILY;COUNT=0", "COUNT"),
    ("FREQ=DAILY;COUNT=3;UNTIL=20260101", "not both"), ("FREQ=DAILY;BYDAY=MO", "WEEKLY only"),
    ("FREQ=WEEKLY;BYDAY=XX", "BYDAY"), ("FREQ=WEEKLY;BYSETPOS=1", "not supported"),
    ("FREQ=DAILY;FREQ=WEEKLY", "twice"), ("FREQ=DAILY;INTERVAL=abc", "INTERVAL"),
    ("FREQ=DAILY;UNTIL=soon", "UNTIL"),
])
def test_bad_rules_are_refused_with_a_reason(text, problem):
  with pytest.raises(ValueError, match=problem):
    timeutil.parse_rule(text)


def test_parse_datetime():
  assert timeutil.to_utc_text(timeutil.parse_datetime("2026-03-02T09:00", "Asia/Tokyo")) == \
      "2026-03-02T00:00:00Z"
  assert timeutil.to_utc_text(timeutil.parse_datetime("2026-03-02T09:00:00-05:00")) == \
      "2026-03-02T14:00:00Z"
  assert timeutil.to_utc_text(timeutil.parse_datetime("2026-03-02")) == "2026-03-02T00:00:00Z"
  for bad in ("2026-13-01T00:00", "2026-02-30", "09:00", "2026-03-02T09:00+24:00"):
    with pytest.raises(ValueError):
      timeutil.parse_datetime(bad)
  with pytest.raises(ValueError, match="unknown time zone"):
    timeutil.parse_datetime("2026-03-02T09:00", "Nowhere/City")
