"""The local sites and their page server, without a browser: requests straight to the site
objects and to a real PageServer on a loopback socket. Search and filters are checked against a
reference filter written here; forms validate and lose nothing; hostile input is escaped; the
control routes need the rollout's token; static files never leave the MiniWoB++ folder."""
import http.client
import json
import re
import socket
import threading
import urllib.parse

import pytest
from hypothesis import given, settings, strategies as st

from orchard_jax.tasks.gui.driver import booking, mail, pages, shop
from orchard_jax.tasks.gui.sandbox import default_miniwob_dir
from orchard_jax.tasks.gui.sitetasks import TEMPLATES


def get(site, target):
  return site.handle("GET", target, b"")


def post(site, target, **form):
  return site.handle("POST", target, urllib.parse.urlencode(form, doseq=True).encode())


def product_ids(response):
  return [int(i) for i in re.findall(rb"class='card product' data-product-id='(\d+)'",
                                     response.body)]


@pytest.fixture
def store():
  site = shop.Shop()
  site.reset({})
  return site


@given(words=st.lists(st.sampled_from(["red", "tee", "shoes", "Stride", "lamp", "mug", "zzz"]),
                      max_size=2),
       category=st.sampled_from(("",) + shop.CATEGORIES),
       colours=st.lists(st.sampled_from(shop.COLOURS), max_size=2, unique=True),
       max_price=st.sampled_from(["", "20", "59.99", "200"]),
       min_rating=st.sampled_from(["", "4", "4.5"]),
       sort=st.sampled_from(list(shop.SORTS)))
@settings(max_examples=60, deadline=None)
def test_search_and_filters_match_a_reference_filter(words, category, colours, max_price,
                                                     min_rating, sort):
  site = shop.Shop()
  site.reset({})
  query = {"q": " ".join(words), "category": category, "colour": colours,
           "max_price": max_price, "min_rating": min_rating, "sort": sort}
  got = product_ids(get(site, "/search?" + urllib.parse.urlencode(query, doseq=True)))
  expected = []
  for p in shop.catalogue():
    text = f"{p['name']} {p['brand']} {p['colour']} {p['category']}".lower()
    if not all(w.lower() in text for w in words):
      continue
    if category and p["category"] != category or colours and p["colour"] not in colours:
      continue
    if max_price and p["price"] > float(max_price) * 100:
      continue
    if min_rating and p["rating"] < float(min_rating):
      continue
    expected.append(p)
  order = {"price_asc": lambda p: (p["price"], p["id"]), "price_desc": lambda p: (-p["price"],
           p["id"]), "rating": lambda p: (-p["rating"], p["id"])}.get(sort, lambda p: p["id"])
  assert got == [p["id"] for p in sorted(expected, key=order)]


def test_cart_and_checkout_keep_state_and_refuse_bad_input(store):
  assert post(store, "/cart/add", product_id=101, qty=2).status == 303
  assert post(store, "/cart/add", product_id=101, qty=1).status == 303
  assert store.state()["cart"] == [{"product_id": 101, "qty": 3}]
  for bad in ("0", "x", "999"):   # refused with a message, the cart unchanged
    post(store, "/cart/update", product_id=101, qty=bad)
    assert store.state()["cart"] == [{"product_id": 101, "qty": 3}]
    assert store.flash
    store.flash = None
  page = post(store, "/checkout", name="", address="1 Road", city="", shipping="drone")
  assert page.status == 422 and b"Please enter your full name" in page.body
  assert b"Please choose a shipping method" in page.body and b"1 Road" in page.body
  assert store.state()["orders"] == []
  assert post(store, "/checkout", name="Ann", address="1 Road", city="Leeds",
              shipping="express").status == 303
  state = store.state()
  assert state["cart"] == [] and state["orders"][0]["lines"] == [{"product_id": 101, "qty": 3}]
  assert state["orders"][0]["total"] == 3 * 1499 + shop.SHIPPING["express"]


def test_hostile_input_is_escaped_everywhere(store):
  attack = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"
  for response in (get(store, "/search?q=" + urllib.parse.quote(attack)),
                   post(store, "/checkout", name=attack, address="", city="",
                        shipping="standard")):
    assert b"<script>alert" not in response.body and b"<img src=x" not in response.body
  box = mail.Mail()
  box.reset({})
  page = post(box, "/send", to=attack, subject=attack, body=attack)
  assert page.status == 422 and b"<script>alert" not in page.body
  assert b"Not a valid email address" in page.body
  assert all(m["folder"] != "sent" for m in box.state()["messages"])


def test_mail_reply_is_prefilled_and_sending_checks_addresses():
  box = mail.Mail()
  box.reset({})
  page = get(box, "/compose?reply=1").body.decode()
  assert "value='alice@acme.test'" in page and "Re: Q3 budget review" in page
  assert "&gt; Hi Jordan," in page
  assert post(box, "/send", to="a@x.test; b@y.test", subject="Hi", body="x").status == 303
  sent = [m for m in box.state()["messages"] if m["folder"] == "sent"]
  assert sent[0]["to"] == ["a@x.test", "b@y.test"]
  assert post(box, "/message/2/delete").status == 303
  assert next(m for m in box.state()["messages"] if m["id"] == 2)["folder"] == "trash"


def test_booking_refuses_full_slots_and_invalid_forms():
  site = booking.Booking()
  site.reset({})
  date, time = booking.DEFAULT_FULL[0]
  good = dict(date=date, time=time, party="2", name="Ann", email="ann@x.test",
              phone="555 0100", policy="yes")
  page = post(site, "/book", **good)
  assert page.status == 422 and b"fully booked" in page.body
  page = post(site, "/book", **{**good, "time": "17:00", "party": "11", "policy": ""})
  assert b"from 1 to 10" in page.body and b"cancellation policy" in page.body
  assert len(site.state()["bookings"]) == len(booking.DEFAULT_BOOKINGS)
  assert post(site, "/book", **{**good, "time": "17:00"}).headers["Location"] == \
      "/confirmation/TV-1004"
  assert post(site, "/bookings/TV-1001/cancel").status == 303
  assert {b["ref"]: b["status"] for b in site.state()["bookings"]}["TV-1001"] == "cancelled"


def test_checkers_accept_the_exact_state_and_refuse_near_misses():
  cheapest = TEMPLATES["shop/cheapest"]
  p = cheapest.params()[0]
  assert cheapest.check(p, {"cart": [{"product_id": p["answer"], "qty": 1}]}, "").success
  assert not cheapest.check(p, {"cart": [{"product_id": p["answer"], "qty": 2}]}, "").success
  assert not cheapest.check(p, {"cart": [{"product_id": p["answer"], "qty": 1},
                                         {"product_id": 501, "qty": 1}]}, "").success
  compose = TEMPLATES["mail/compose"]
  p = compose.params()[1]
  message = {"folder": "sent", "to": list(reversed(p["to"])), "subject": p["subject"] + " ",
             "body": p["body"]}
  assert compose.check(p, {"messages": [message]}, "").success   # order, spaces don't matter
  assert not compose.check(p, {"messages": [{**message, "to": p["to"][:1]}]}, "").success
  assert not compose.check(p, {"messages": [message, message]}, "").success
  cancel = TEMPLATES["booking/cancel"]
  p = cancel.params()[0]
  state = {"bookings": [dict(b, status="cancelled" if b["ref"] == p["ref"] else "confirmed")
                        for b in booking.DEFAULT_BOOKINGS]}
  assert cancel.check(p, state, "").success
  state["bookings"][-1]["status"] = "cancelled"
  assert not cancel.check(p, state, "").success


@pytest.fixture(scope="module")
def page_server():
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen(16)
  server = pages.PageServer(sock, token="t" * 32, miniwob_dir=default_miniwob_dir(),
                            sites={"shop": {}, "mail": {}})
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield sock.getsockname()[1]
  server.shutdown()
  server.server_close()


def request(port, method, path, host, body=None, headers=None):
  connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
  connection.request(method, path, body=body, headers={"Host": host, **(headers or {})})
  response = connection.getresponse()
  return response.status, response.read()


def test_page_server_routes_by_host_and_guards_control_and_files(page_server):
  status, body = request(page_server, "GET", "/", "shop.test")
  assert status == 200 and b"Northwind Market" in body
  status, body = request(page_server, "GET", "/miniwob/click-test.html", "miniwob.test")
  assert status == 200 and b"Click Test Task" in body
  for path in ("/../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/miniwob/../../../../etc/hosts"):
    status, body = request(page_server, "GET", path, "miniwob.test")
    assert status == 404 and b"root:" not in body
  assert request(page_server, "GET", "/", "booking.test")[0] == 404   # not in this sandbox
  assert request(page_server, "GET", "/", "evil.example")[0] == 404
  assert request(page_server, "GET", "/__orchard/state", "shop.test")[0] == 403
  status, body = request(page_server, "GET", "/__orchard/state", "shop.test",
                         headers={pages.TOKEN_HEADER: "t" * 32})
  assert status == 200 and json.loads(body)["state"] == {"cart": [], "orders": []}
  status, body = request(page_server, "POST", "/__orchard/reset", "shop.test",
                         body=json.dumps({"cart": [{"product_id": 999, "qty": 1}]}),
                         headers={pages.TOKEN_HEADER: "t" * 32})
  assert status == 400 and b"names no product" in body
