"""Task families of shop.test: find by search and filters, buy through checkout, edit the cart."""
from __future__ import annotations

import itertools

from orchard_jax.tasks.gui.driver import shop as site
from orchard_jax.tasks.gui.expert import click, fill
from orchard_jax.tasks.gui.sitetasks.base import Template, fail, ok, same_text

PRODUCTS = {p["id"]: p for p in site.catalogue()}
START = "http://shop.test/"


def _describe(p: dict) -> str:
  return f"{p['name']} ({p['colour']})"


def _cart_is(state: dict, wanted: dict) -> tuple:
  """Whether the cart holds exactly `wanted` {product id: qty}, and what it holds."""
  held = {line["product_id"]: line["qty"] for line in state.get("cart", [])}
  shown = ", ".join(f"{q} x {_describe(PRODUCTS[i])}" for i, q in held.items()) or "nothing"
  return held == wanted, shown


def _search(view, words: str):
  yield from fill(view, "header input[name=q]", words)
  yield ("press_keys", {"keys": ["Enter"]})


def _sort_and_apply(view, sort: str):
  yield from click(view, f".filters input[name=sort][value={sort}]")
  yield from click(view, "#apply-filters")


def _add_first(view):
  yield from click(view, ".product button", text="Add to cart")


class Cheapest(Template):
  """Add the cheapest product matching a category and a colour or brand (unique answer)."""
  family = "shop/cheapest"
  site = "shop"

  def params(self):
    out = []
    for category in site.CATEGORIES:
      for key in ("colour", "brand"):
        values = sorted({p[key] for p in PRODUCTS.values() if p["category"] == category})
        for value in values:
          matches = [p for p in PRODUCTS.values() if p["category"] == category and p[key] == value]
          prices = sorted(p["price"] for p in matches)
          if len(matches) >= 2 and prices[0] < prices[1]:
            out.append({"category": category, key: value,
                        "answer": min(matches, key=lambda p: p["price"])["id"]})
    return out[::2]   # every other one: a family of 6 to 7, all checked by the CI tests

  def _words(self, p):
    return f"{p.get('colour') or p.get('brand')} {p['category']}"

  def instruction(self, p):
    what = (f"{p['colour']} product in the {p['category']} category" if "colour" in p else
            f"{p['brand']} product in the {p['category']} category")
    return f"Add the cheapest {what} to the shopping cart (one of it, and nothing else)."

  def check(self, p, state, answer):
    good, shown = _cart_is(state, {p["answer"]: 1})
    want = _describe(PRODUCTS[p["answer"]])
    return ok(f"the cart holds 1 x {want}") if good else fail(
        f"expected the cart to hold exactly 1 x {want}; it holds {shown}")

  def expert(self, p, view):
    yield from _search(view, self._words(p))
    yield from _sort_and_apply(view, "price_asc")
    yield from _add_first(view)
    yield ("done", {})

  def wrong(self, p, view):
    yield from _search(view, self._words(p))
    yield from _sort_and_apply(view, "price_desc")   # the most expensive instead
    yield from _add_first(view)
    yield ("done", {})


class BestRated(Template):
  """Add the best-rated product of a category under a price limit (filters: max price, sort by
  rating)."""
  family = "shop/best_rated"
  site = "shop"

  def params(self):
    out = []
    for category, limit in itertools.product(site.CATEGORIES, (20, 50, 100)):
      matches = [p for p in PRODUCTS.values()
                 if p["category"] == category and p["price"] <= limit * 100]
      ratings = sorted((p["rating"] for p in matches), reverse=True)
      everything = [p for p in PRODUCTS.values() if p["category"] == category]
      best_overall = max(everything, key=lambda p: (p["rating"], -p["id"]))
      if len(matches) >= 2 and ratings[0] > ratings[1]:
        answer = max(matches, key=lambda p: p["rating"])
        if answer["id"] != best_overall["id"]:   # the limit matters
          out.append({"category": category, "max_price": limit, "answer": answer["id"]})
    return out

  def instruction(self, p):
    return (f"Add the best-rated product in the {p['category']} category that costs at most "
            f"${p['max_price']} to the shopping cart (one of it, and nothing else).")

  def check(self, p, state, answer):
    good, shown = _cart_is(state, {p["answer"]: 1})
    want = _describe(PRODUCTS[p["answer"]])
    return ok(f"the cart holds 1 x {want}") if good else fail(
        f"expected the cart to hold exactly 1 x {want}; it holds {shown}")

  def _filter(self, p, view, limit: bool):
    yield from click(view, "header a", text="Home")
    yield from click(view, ".cats a", text=p["category"].title())
    if limit:
      yield from fill(view, "#max_price", str(p["max_price"]))
    yield from _sort_and_apply(view, "rating")

  def expert(self, p, view):
    yield from self._filter(p, view, limit=True)
    yield from _add_first(view)
    yield ("done", {})

  def wrong(self, p, view):
    yield from self._filter(p, view, limit=False)   # forgets the price limit
    yield from _add_first(view)
    yield ("done", {})


_PEOPLE = (("Maria Gonzalez", "12 Harbour Street", "Portsmouth"),
           ("Tom Becker", "4 Linden Allee", "Bremen"),
           ("Aisha Khan", "88 Elm Road", "Leeds"),
           ("Kenji Sato", "3-2 Sakura Lane", "Osaka"))


class Buy(Template):
  """Buy a quantity of one product through checkout, with a shipping method and an address."""
  family = "shop/buy"
  site = "shop"
  steps = 30

  def params(self):
    out = []
    chosen = [101, 202, 402, 502, 602]
    for i, pid in enumerate(chosen):
      name, address, city = _PEOPLE[i % len(_PEOPLE)]
      out.append({"product": pid, "qty": 1 + i % 3, "shipping": ("standard", "express")[i % 2],
                  "name": name, "address": address, "city": city})
    return out

  def instruction(self, p):
    prod = PRODUCTS[p["product"]]
    return (f"Buy {p['qty']} of the {prod['colour']} {prod['name']} with {p['shipping']} "
            f"shipping, to be delivered to {p['name']}, {p['address']}, {p['city']}.")

  def check(self, p, state, answer):
    orders = state.get("orders", [])
    if len(orders) != 1:
      return fail(f"expected exactly one order, found {len(orders)}")
    order = orders[0]
    lines = {line["product_id"]: line["qty"] for line in order["lines"]}
    problems = []
    if lines != {p["product"]: p["qty"]}:
      problems.append(f"items {lines} instead of {{{p['product']}: {p['qty']}}}")
    for key in ("name", "address", "city"):
      if not same_text(order.get(key, ""), p[key]):
        problems.append(f"{key} {order.get(key)!r} instead of {p[key]!r}")
    if order.get("shipping") != p["shipping"]:
      problems.append(f"shipping {order.get('shipping')!r} instead of {p['shipping']!r}")
    if problems:
      return fail("the order is wrong: " + "; ".join(problems))
    return ok(f"order #{order['id']} matches")

  def _order(self, p, view, qty: int, shipping: str):
    prod = PRODUCTS[p["product"]]
    yield from _search(view, f"{prod['name']} {prod['colour']}")
    yield from click(view, f".product[data-product-id='{prod['id']}'] h3 a")
    yield from fill(view, "#qty", str(qty))
    yield from click(view, "button", text="Add to cart")
    yield from click(view, "a.button", text="Proceed to checkout")
    for key in ("name", "address", "city"):
      yield from fill(view, f"#{key}", p[key])
    yield from click(view, f"input[name=shipping][value={shipping}]")
    yield from click(view, "#place-order")
    yield ("done", {})

  def expert(self, p, view):
    yield from self._order(p, view, p["qty"], p["shipping"])

  def wrong(self, p, view):
    other = "express" if p["shipping"] == "standard" else "standard"
    yield from self._order(p, view, p["qty"], other)


class EditCart(Template):
  """Remove one line of a cart and change another's quantity."""
  family = "shop/edit_cart"
  site = "shop"

  def params(self):
    return [{"cart": [[101, 1], [301, 2], [502, 1]], "remove": 301, "change": 502, "qty": 3},
            {"cart": [[204, 2], [403, 1]], "remove": 204, "change": 403, "qty": 2},
            {"cart": [[602, 1], [103, 3], [505, 2]], "remove": 505, "change": 103, "qty": 1},
            {"cart": [[201, 1], [501, 4]], "remove": 201, "change": 501, "qty": 2}]

  def fixtures(self, p):
    return {"shop": {"cart": [{"product_id": i, "qty": q} for i, q in p["cart"]]}}

  def instruction(self, p):
    removed, changed = PRODUCTS[p["remove"]], PRODUCTS[p["change"]]
    return (f"My shopping cart is ready. Remove the {_describe(removed)} from it and change "
            f"the quantity of the {_describe(changed)} to {p['qty']}. Do not check out.")

  def _wanted(self, p):
    wanted = {i: q for i, q in p["cart"] if i != p["remove"]}
    wanted[p["change"]] = p["qty"]
    return wanted

  def check(self, p, state, answer):
    if state.get("orders"):
      return fail("an order was placed; the task said not to check out")
    good, shown = _cart_is(state, self._wanted(p))
    return ok(f"the cart holds {shown}") if good else fail(
        f"expected the cart {self._wanted(p)}, it holds {shown}")

  def _edit(self, p, view, change_to: int, remove: bool):
    yield from click(view, "#cart-count")
    yield from fill(view, f"tr[data-product-id='{p['change']}'] input[name=qty]", str(change_to))
    yield from click(view, f"tr[data-product-id='{p['change']}'] button", text="Update")
    if remove:
      yield from click(view, f"tr[data-product-id='{p['remove']}'] button", text="Remove")
    yield ("done", {})

  def expert(self, p, view):
    yield from self._edit(p, view, p["qty"], remove=True)

  def wrong(self, p, view):
    yield from self._edit(p, view, p["qty"], remove=False)   # forgets the removal


TEMPLATES = (Cheapest(), BestRated(), Buy(), EditCart())
