"""shop.test: an online shop with search, filters, product pages, a cart and checkout.

Pages: / (search box, categories), /search (query, category, colour, brand, price and rating
filters, sorting), /product/<id> (details, quantity, add to cart), /cart (change quantities,
remove lines), /checkout (name, address, shipping) and /orders. State: the cart's lines and the
orders placed; `state()` is what a task's checker reads.
"""
from __future__ import annotations

import copy
from typing import Dict, List

from .web import Request, Response, Site, esc, redirect

# (id, name, category, brand, colour, price in cents, rating x10, stock)
_ROWS = [
    (101, "Classic Crew T-Shirt", "t-shirts", "Northwind", "red", 1499, 42, 25),
    (102, "Classic Crew T-Shirt", "t-shirts", "Northwind", "blue", 1499, 44, 30),
    (103, "Organic Cotton Tee", "t-shirts", "Greenleaf", "red", 1999, 47, 12),
    (104, "Organic Cotton Tee", "t-shirts", "Greenleaf", "green", 1999, 45, 8),
    (105, "Performance Running Tee", "t-shirts", "Stride", "black", 2499, 41, 40),
    (106, "Graphic Print Tee", "t-shirts", "Urbanite", "red", 1299, 36, 18),
    (107, "Heavyweight Pocket Tee", "t-shirts", "Northwind", "black", 2299, 46, 9),
    (201, "Trail Runner 2", "shoes", "Stride", "blue", 8999, 45, 14),
    (202, "City Sneaker", "shoes", "Urbanite", "white", 6499, 41, 22),
    (203, "Leather Derby", "shoes", "Hartwell", "brown", 11999, 47, 6),
    (204, "Canvas Slip-On", "shoes", "Urbanite", "black", 3999, 38, 35),
    (205, "Road Racer Pro", "shoes", "Stride", "red", 12999, 48, 5),
    (206, "Everyday Walker", "shoes", "Greenleaf", "green", 7499, 43, 11),
    (301, "Commuter Backpack 20L", "backpacks", "Packwise", "black", 5999, 44, 17),
    (302, "Hiking Daypack 28L", "backpacks", "Summit", "green", 7999, 46, 9),
    (303, "Laptop Sleeve Pack", "backpacks", "Packwise", "blue", 4999, 39, 21),
    (304, "Rolltop Waterproof Pack", "backpacks", "Summit", "red", 8999, 47, 7),
    (305, "Mini City Backpack", "backpacks", "Urbanite", "white", 3499, 37, 28),
    (401, "Studio Over-Ear Headphones", "headphones", "Sonora", "black", 14999, 46, 10),
    (402, "Wireless Earbuds", "headphones", "Sonora", "white", 7999, 42, 33),
    (403, "Sport Earphones", "headphones", "Stride", "red", 2999, 38, 40),
    (404, "Noise-Cancelling Headphones", "headphones", "Aurex", "blue", 19999, 48, 4),
    (405, "Kids Headphones", "headphones", "Aurex", "green", 2499, 40, 19),
    (501, "Stoneware Mug", "mugs", "Hearth", "white", 1199, 45, 60),
    (502, "Travel Mug 450ml", "mugs", "Packwise", "black", 2199, 43, 26),
    (503, "Enamel Camp Mug", "mugs", "Summit", "green", 1499, 41, 31),
    (504, "Espresso Cup Set", "mugs", "Hearth", "red", 2699, 46, 13),
    (505, "Double-Wall Glass Mug", "mugs", "Aurex", "white", 1899, 39, 20),
    (601, "Arc Floor Lamp", "lamps", "Lumen", "black", 12999, 44, 5),
    (602, "Desk Task Lamp", "lamps", "Lumen", "white", 4599, 46, 16),
    (603, "Bedside Lamp", "lamps", "Hearth", "green", 3999, 42, 12),
    (604, "Clip-On Reading Light", "lamps", "Aurex", "black", 1999, 37, 44),
    (605, "Rattan Pendant Lamp", "lamps", "Hearth", "brown", 8999, 45, 3),
]
CATEGORIES = ("t-shirts", "shoes", "backpacks", "headphones", "mugs", "lamps")
COLOURS = ("black", "blue", "brown", "green", "red", "white")
SHIPPING = {"standard": 499, "express": 1499}
SORTS = {"relevance": "Relevance", "price_asc": "Price: low to high",
         "price_desc": "Price: high to low", "rating": "Customer rating"}


def catalogue() -> List[dict]:
  """Every product as a dict (id, name, category, brand, colour, price in cents, rating as a
  float out of 5, stock). Tasks compute their expected answers from this same list."""
  return [dict(id=r[0], name=r[1], category=r[2], brand=r[3], colour=r[4], price=r[5],
               rating=r[6] / 10, stock=r[7]) for r in _ROWS]


def money(cents: int) -> str:
  return f"${cents // 100}.{cents % 100:02d}"


class Shop(Site):
  name = "shop"
  title = "Northwind Market"
  nav = (("Home", "/"), ("Cart", "/cart"), ("Orders", "/orders"))
  style = """
.grid{display:grid;grid-template-columns:repeat(3,1fr);gap:12px} .layout{display:flex;gap:20px}
.filters{width:220px;flex:none} .filters fieldset{border:1px solid #ccc;margin:0 0 10px;background:#fff}
.product h3{margin:0 0 6px;font-size:16px} .price{font-weight:bold;font-size:17px}
.stars{color:#b8860b} .search{display:flex;gap:6px;margin-left:auto} .search input{width:260px}
.cats a{display:inline-block;margin:4px 8px 4px 0;padding:8px 14px;background:#fff;border:1px solid #ccc;border-radius:16px;color:#233;text-decoration:none}
"""

  def __init__(self):
    super().__init__()
    self.products: Dict[int, dict] = {}
    self.cart: List[dict] = []
    self.orders: List[dict] = []
    for method, pattern, handler in (
        ("GET", "/", self.home), ("GET", "/search", self.search),
        ("GET", r"/product/(?P<id>\d+)", self.product), ("GET", "/cart", self.view_cart),
        ("POST", "/cart/add", self.add), ("POST", "/cart/update", self.update),
        ("POST", "/cart/remove", self.remove), ("GET", "/checkout", self.checkout_form),
        ("POST", "/checkout", self.checkout), ("GET", "/orders", self.view_orders)):
      self.route(method, pattern, handler)

  # ------------------------------------------------------------------ control
  def reset(self, fixtures: dict) -> None:
    """fixtures: {"cart": [{"product_id", "qty"}], "orders": [...]} (both optional)."""
    self.products = {p["id"]: p for p in catalogue()}
    self.cart = [{"product_id": int(line["product_id"]), "qty": int(line["qty"])}
                 for line in fixtures.get("cart", [])]
    for line in self.cart:
      if line["product_id"] not in self.products or line["qty"] < 1:
        raise ValueError(f"cart fixture line {line} names no product or has no quantity")
    self.orders = copy.deepcopy(list(fixtures.get("orders", [])))
    self.flash = None

  def state(self) -> dict:
    return {"cart": copy.deepcopy(self.cart), "orders": copy.deepcopy(self.orders)}

  # ------------------------------------------------------------------ pages
  def _search_box(self, query: str = "") -> str:
    return (f"<form class='search' action='/search' method='get' role='search'>"
            f"<input type='search' name='q' value='{esc(query)}' placeholder='Search products'"
            f" aria-label='Search products'><button type='submit'>Search</button></form>")

  def page(self, title: str, body: str, *, header_extra: str = "") -> str:
    count = sum(line["qty"] for line in self.cart)
    return super().page(title, body, header_extra=self._search_box() +
                        f"<a href='/cart' id='cart-count'>Cart ({count})</a>")

  def home(self, req: Request) -> Response:
    cats = "".join(f"<a href='/search?category={esc(c)}'>{esc(c.title())}</a>"
                   for c in CATEGORIES)
    featured = sorted(self.products.values(), key=lambda p: -p["rating"])[:6]
    return Response(self.page("Home", f"<h1>Welcome to {esc(self.title)}</h1>"
                              f"<h2>Shop by category</h2><div class='cats'>{cats}</div>"
                              f"<h2>Top rated</h2>{self._cards(featured)}"))

  def _cards(self, products: List[dict]) -> str:
    if not products:
      return "<p>No products match your search.</p>"
    cards = []
    for p in products:
      cards.append(
          f"<div class='card product' data-product-id='{p['id']}'>"
          f"<h3><a href='/product/{p['id']}'>{esc(p['name'])}</a></h3>"
          f"<div class='muted'>{esc(p['brand'])} &middot; {esc(p['colour'])}</div>"
          f"<div class='price'>{money(p['price'])}</div>"
          f"<div class='stars'>{'&#9733;' * round(p['rating'])} {p['rating']:.1f}</div>"
          f"<form method='post' action='/cart/add'><input type='hidden' name='product_id' "
          f"value='{p['id']}'><input type='hidden' name='qty' value='1'>"
          f"<button type='submit'>Add to cart</button></form></div>")
    return f"<div class='grid'>{''.join(cards)}</div>"

  def search(self, req: Request) -> Response:
    query = req.arg("q")
    category = req.arg("category")
    colours = req.args("colour")
    brand = req.arg("brand")
    max_price, min_rating = req.arg("max_price"), req.arg("min_rating")
    sort = req.arg("sort", "relevance")
    errors = []
    results = list(self.products.values())
    words = query.lower().split()
    if words:
      results = [p for p in results
                 if all(w in f"{p['name']} {p['brand']} {p['colour']} {p['category']}".lower()
                        for w in words)]
    if category:
      results = [p for p in results if p["category"] == category]
    if colours:
      results = [p for p in results if p["colour"] in colours]
    if brand:
      results = [p for p in results if p["brand"].lower() == brand.lower()]
    if max_price:
      try:
        results = [p for p in results if p["price"] <= round(float(max_price) * 100)]
      except ValueError:
        errors.append(f"Max price must be a number, not '{max_price}'.")
    if min_rating:
      try:
        results = [p for p in results if p["rating"] >= float(min_rating)]
      except ValueError:
        errors.append(f"Minimum rating must be a number, not '{min_rating}'.")
    key = {"price_asc": lambda p: (p["price"], p["id"]),
           "price_desc": lambda p: (-p["price"], p["id"]),
           "rating": lambda p: (-p["rating"], p["id"])}.get(sort, lambda p: p["id"])
    results.sort(key=key)
    brands = sorted({p["brand"] for p in self.products.values()})
    cat_opts = "".join(
        f"<label><input type='radio' name='category' value='{esc(c)}'"
        f"{' checked' if c == category else ''}> {esc(c.title() or 'All')}</label>"
        for c in ("",) + CATEGORIES)
    colour_opts = "".join(
        f"<label><input type='checkbox' name='colour' value='{c}'"
        f"{' checked' if c in colours else ''}> {c.title()}</label>" for c in COLOURS)
    brand_opts = "".join(
        f"<label><input type='radio' name='brand' value='{esc(b)}'"
        f"{' checked' if b == brand else ''}> {esc(b) or 'Any'}</label>" for b in [""] + brands)
    sort_opts = "".join(
        f"<label><input type='radio' name='sort' value='{k}'{' checked' if k == sort else ''}>"
        f" {v}</label>" for k, v in SORTS.items())
    error_html = "".join(f"<p class='error'>{esc(e)}</p>" for e in errors)
    filters = (
        f"<form class='filters' method='get' action='/search' aria-label='Filters'>"
        f"<input type='hidden' name='q' value='{esc(query)}'>"
        f"<fieldset><legend>Category</legend>{cat_opts}</fieldset>"
        f"<fieldset><legend>Colour</legend>{colour_opts}</fieldset>"
        f"<fieldset><legend>Brand</legend>{brand_opts}</fieldset>"
        f"<fieldset><legend>Price and rating</legend><label for='max_price'>Max price ($)"
        f"</label><input type='text' id='max_price' name='max_price' value='{esc(max_price)}' "
        f"size='6'><label for='min_rating'>Min rating</label><input type='text' "
        f"id='min_rating' name='min_rating' value='{esc(min_rating)}' size='6'></fieldset>"
        f"<fieldset><legend>Sort by</legend>{sort_opts}</fieldset>"
        f"<button type='submit' id='apply-filters'>Apply filters</button></form>")
    heading = f"Results for '{esc(query)}'" if query else "All products"
    body = (f"<div class='layout'>{filters}<section><h1>{heading}</h1>{error_html}"
            f"<p class='muted'>{len(results)} products</p>{self._cards(results)}</section></div>")
    return Response(self.page("Search", body))

  def product(self, req: Request) -> Response:
    p = self.products.get(int(req.params["id"]))
    if p is None:
      return Response(self.page("Not found", "<h1>No such product</h1>"), 404)
    body = (f"<div class='card product' data-product-id='{p['id']}'><h1>{esc(p['name'])}</h1>"
            f"<p>Brand: {esc(p['brand'])} &middot; Colour: {esc(p['colour'])} &middot; "
            f"Category: {esc(p['category'])}</p><p class='price'>{money(p['price'])}</p>"
            f"<p class='stars'>{'&#9733;' * round(p['rating'])} {p['rating']:.1f} / 5</p>"
            f"<p>{p['stock']} in stock</p><form method='post' action='/cart/add'>"
            f"<input type='hidden' name='product_id' value='{p['id']}'>"
            f"<label for='qty'>Quantity</label><input type='number' id='qty' name='qty' "
            f"value='1' min='1' max='{p['stock']}'> <button type='submit'>Add to cart</button>"
            f"</form></div>")
    return Response(self.page(p["name"], body))

  def _quantity(self, req: Request, product: dict):
    try:
      qty = int(req.arg("qty", "1"))
    except ValueError:
      return None, f"Quantity must be a whole number, not '{req.arg('qty')}'."
    if qty < 1:
      return None, "Quantity must be at least 1."
    if qty > product["stock"]:
      return None, f"Only {product['stock']} of {product['name']} in stock."
    return qty, None

  def add(self, req: Request) -> Response:
    try:
      product = self.products[int(req.arg("product_id"))]
    except (KeyError, ValueError):
      self.flash = "That product does not exist."
      return redirect("/cart")
    qty, error = self._quantity(req, product)
    if error:
      self.flash = error
      return redirect(f"/product/{product['id']}")
    for line in self.cart:
      if line["product_id"] == product["id"]:
        line["qty"] = min(line["qty"] + qty, product["stock"])
        break
    else:
      self.cart.append({"product_id": product["id"], "qty": qty})
    self.flash = f"Added {qty} x {product['name']} ({product['colour']}) to your cart."
    return redirect("/cart")

  def update(self, req: Request) -> Response:
    for line in self.cart:
      if str(line["product_id"]) == req.arg("product_id"):
        qty, error = self._quantity(req, self.products[line["product_id"]])
        if error:
          self.flash = error
        else:
          line["qty"] = qty
          self.flash = "Cart updated."
    return redirect("/cart")

  def remove(self, req: Request) -> Response:
    before = len(self.cart)
    self.cart = [line for line in self.cart if str(line["product_id"]) != req.arg("product_id")]
    self.flash = "Item removed." if len(self.cart) < before else None
    return redirect("/cart")

  def _subtotal(self) -> int:
    return sum(self.products[line["product_id"]]["price"] * line["qty"] for line in self.cart)

  def view_cart(self, req: Request) -> Response:
    if not self.cart:
      return Response(self.page("Cart", "<h1>Your cart</h1><p>Your cart is empty.</p>"))
    rows = []
    for line in self.cart:
      p = self.products[line["product_id"]]
      rows.append(
          f"<tr data-product-id='{p['id']}'><td><a href='/product/{p['id']}'>{esc(p['name'])}"
          f"</a> ({esc(p['colour'])})</td><td>{money(p['price'])}</td><td><form method='post' "
          f"action='/cart/update'><input type='hidden' name='product_id' value='{p['id']}'>"
          f"<input type='number' name='qty' value='{line['qty']}' min='1' aria-label='Quantity "
          f"of {esc(p['name'])}' style='width:60px'> <button type='submit' class='secondary'>"
          f"Update</button></form></td><td>{money(p['price'] * line['qty'])}</td><td>"
          f"<form method='post' action='/cart/remove'><input type='hidden' name='product_id' "
          f"value='{p['id']}'><button type='submit' class='secondary'>Remove</button></form>"
          f"</td></tr>")
    body = (f"<h1>Your cart</h1><table><tr><th>Product</th><th>Price</th><th>Quantity</th>"
            f"<th>Total</th><th></th></tr>{''.join(rows)}</table><p>Subtotal: "
            f"<b id='subtotal'>{money(self._subtotal())}</b></p>"
            f"<a class='button' href='/checkout'>Proceed to checkout</a>")
    return Response(self.page("Cart", body))

  def checkout_form(self, req: Request, errors=(), values=None) -> Response:
    if not self.cart:
      return redirect("/cart")
    values = values or {}
    shipping = values.get("shipping", "standard")
    error_html = "".join(f"<p class='error' role='alert'>{esc(e)}</p>" for e in errors)
    options = "".join(
        f"<label><input type='radio' name='shipping' value='{k}'"
        f"{' checked' if k == shipping else ''}> {k.title()} ({money(v)})</label>"
        for k, v in SHIPPING.items())
    fields = "".join(
        f"<label for='{k}'>{label}</label><input type='text' id='{k}' name='{k}' "
        f"value='{esc(values.get(k, ''))}' size='40'>"
        for k, label in (("name", "Full name"), ("address", "Street address"), ("city", "City")))
    body = (f"<h1>Checkout</h1>{error_html}<form method='post' action='/checkout' class='card'>"
            f"{fields}<fieldset><legend>Shipping</legend>{options}</fieldset>"
            f"<p>Subtotal: {money(self._subtotal())}</p>"
            f"<button type='submit' id='place-order'>Place order</button></form>")
    return Response(self.page("Checkout", body), 200 if not errors else 422)

  def checkout(self, req: Request) -> Response:
    values = {k: req.arg(k) for k in ("name", "address", "city", "shipping")}
    errors = [f"Please enter your {label}." for k, label in
              (("name", "full name"), ("address", "street address"), ("city", "city"))
              if not values[k]]
    if values["shipping"] not in SHIPPING:
      errors.append("Please choose a shipping method.")
    if not self.cart:
      errors.append("Your cart is empty.")
    if errors:
      return self.checkout_form(req, errors, values)
    number = 1001 + len(self.orders)
    lines = [dict(line) for line in self.cart]
    self.orders.append({"id": number, "lines": lines, "name": values["name"],
                        "address": values["address"], "city": values["city"],
                        "shipping": values["shipping"],
                        "total": self._subtotal() + SHIPPING[values["shipping"]]})
    self.cart = []
    self.flash = f"Thank you! Your order #{number} has been placed."
    return redirect("/orders")

  def view_orders(self, req: Request) -> Response:
    if not self.orders:
      return Response(self.page("Orders", "<h1>Your orders</h1><p>No orders yet.</p>"))
    items = []
    for order in reversed(self.orders):
      lines = ", ".join(f"{line['qty']} x {esc(self.products[line['product_id']]['name'])}"
                        for line in order["lines"])
      items.append(f"<div class='card'><b>Order #{order['id']}</b> &middot; {lines} &middot; "
                   f"{esc(order['shipping'])} shipping to {esc(order['name'])}, "
                   f"{esc(order['address'])}, {esc(order['city'])} &middot; total "
                   f"{money(order['total'])}</div>")
    return Response(self.page("Orders", "<h1>Your orders</h1>" + "".join(items)))
