"""Egress allow-lists: the network endpoints a sandbox may reach beyond what `network` gives it.

A sandbox is created with `network=False` (the default: no network at all) or `network=True`
(outbound access through its own network namespace, never the host's loopback services), and
optionally `egress=[...]`: endpoints it may reach in either case, e.g. the recording proxy an
agent harness inside the sandbox sends its model calls to:

    box = env.create_sandbox(egress=["http://127.0.0.1:8123"])
    box.egress_url("http://127.0.0.1:8123/s/session-7/v1")   # the URL to give the harness

An endpoint is `scheme://host:port` with scheme http, https or tcp (the port defaults to 80 for
http and 443 for https; tcp needs one); a path in the text is allowed and ignored: the
allow-list is by endpoint, not by URL. What the sandbox connects to is the endpoint *as seen
from inside*, which the service reports for every entry (`Sandbox.egress`, the `egress` field
of the sandbox record) and `egress_url` applies to any URL:

- local backend: the service listens inside the sandbox's network namespace and relays each
  connection to the endpoint from the host. A loopback endpoint keeps its address
  (127.0.0.1:8123 inside is the host's 127.0.0.1:8123, and nothing else of the host's loopback
  is); another endpoint gets a loopback address of its own inside (127.0.100.N, same port),
  and a host name is mapped to it in the sandbox's /etc/hosts, so the URL is unchanged.
- Kubernetes: a NetworkPolicy egress rule to the endpoint's addresses and port (host names are
  resolved when the sandbox is created and pinned in the pod's /etc/hosts with hostAliases),
  so the URL inside is the URL given.

Standard library only (the SDK and the in-pod agent import it).
"""
import dataclasses
import ipaddress
import re
from typing import Optional
from urllib.parse import urlsplit

MAX_ENDPOINTS = 16
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SCHEMES = ("http", "https", "tcp")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")
_OWN_ADDRESS = "127.0.100.{}"   # inside address of the N-th non-loopback endpoint (local)


@dataclasses.dataclass(frozen=True)
class Endpoint:
  """One allowed endpoint.

  Attributes:
    scheme: "http", "https" or "tcp".
    host: an IP address (no brackets) or a DNS name, lower-case.
    port: 1-65535.
  """
  scheme: str
  host: str
  port: int

  @property
  def origin(self) -> str:
    """`scheme://host:port` (IPv6 addresses in brackets): the canonical form of the entry."""
    host = f"[{self.host}]" if ":" in self.host else self.host
    return f"{self.scheme}://{host}:{self.port}"

  @property
  def address(self) -> Optional[ipaddress._BaseAddress]:
    """The host as an IP address, or None for a name."""
    try:
      return ipaddress.ip_address(self.host)
    except ValueError:
      return None

  @property
  def is_loopback(self) -> bool:
    address = self.address
    return self.host == "localhost" or (address is not None and address.is_loopback)


def parse_endpoint(text: str) -> Endpoint:
  """An Endpoint from `scheme://host[:port][/path]` (the path is ignored).

  Raises:
    ValueError: naming what was expected and what was seen.
  """
  if not isinstance(text, str) or not text or len(text) > 2048:
    raise ValueError(f"an egress endpoint is a URL like 'http://127.0.0.1:8123'; got {text!r}")
  if any(ord(c) < 33 or ord(c) == 127 for c in text):
    raise ValueError(f"an egress endpoint may not contain spaces or control characters; "
                     f"got {text!r}")
  parts = urlsplit(text)
  scheme = parts.scheme.lower()
  if scheme not in _SCHEMES:
    raise ValueError(f"an egress endpoint's scheme must be one of {list(_SCHEMES)}; got "
                     f"{text!r}")
  if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
    raise ValueError(f"an egress endpoint is scheme://host:port (no credentials, query or "
                     f"fragment); got {text!r}")
  try:
    port = parts.port
  except ValueError:
    raise ValueError(f"an egress endpoint's port must be 1-65535; got {text!r}") from None
  host = (parts.hostname or "").lower()
  if not host:
    raise ValueError(f"an egress endpoint needs a host; got {text!r}")
  try:
    ipaddress.ip_address(host)
  except ValueError:
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
      raise ValueError(f"an egress endpoint's host must be an IP address or a DNS name; "
                       f"got {parts.hostname!r} in {text!r}") from None
    host = host.rstrip(".")
  if port is None:
    port = _DEFAULT_PORTS.get(scheme)
    if port is None:
      raise ValueError(f"a tcp egress endpoint needs a port; got {text!r}")
  if not 1 <= port <= 65535:
    raise ValueError(f"an egress endpoint's port must be 1-65535; got {text!r}")
  return Endpoint(scheme, host, port)


def parse_endpoints(items) -> list:
  """Endpoints of an egress list, duplicates removed, order kept.

  Raises:
    ValueError: a malformed entry, or more than MAX_ENDPOINTS.
  """
  if items is None:
    return []
  if len(items) > MAX_ENDPOINTS:
    raise ValueError(f"egress allows at most {MAX_ENDPOINTS} endpoints; got {len(items)}")
  out = []
  for item in items:
    endpoint = parse_endpoint(item)
    if endpoint not in out:
      out.append(endpoint)
  return out


def local_inside(endpoints: list) -> list:
  """How the local backend shows each endpoint inside a sandbox: a list of dicts
  {"endpoint": origin, "url": the origin inside, "listen": [ip, port] inside, "target":
  [host, port] dialled from the host, "hosts_name": name to map in /etc/hosts or None}.

  Raises:
    ValueError: two endpoints would need the same address inside.
  """
  out, taken = [], {}
  other = 0
  for endpoint in endpoints:
    if endpoint.is_loopback:
      inside = "127.0.0.1" if endpoint.host == "localhost" else str(endpoint.address)
      if ":" in inside:   # ::1: the sandbox's own ::1 works the same way
        inside = "::1"
      name = None
    else:
      other += 1
      inside = _OWN_ADDRESS.format(other)
      name = endpoint.host if endpoint.address is None else None
    key = (inside, endpoint.port)
    if key in taken:
      raise ValueError(f"egress endpoints {taken[key]} and {endpoint.origin} would both be "
                       f"{inside}:{endpoint.port} inside the sandbox; give one of them")
    taken[key] = endpoint.origin
    if endpoint.is_loopback:
      shown = endpoint.host if ":" not in endpoint.host else f"[{endpoint.host}]"
    else:
      shown = name or inside
    out.append({"endpoint": endpoint.origin,
                "url": f"{endpoint.scheme}://{shown}:{endpoint.port}",
                "listen": [inside, endpoint.port],
                "target": ["127.0.0.1" if endpoint.host == "localhost" else endpoint.host,
                           endpoint.port],
                "hosts_name": name})
  return out


def rewrite_url(url: str, egress: list) -> str:
  """`url` with its endpoint replaced by the address the sandbox reaches it at.

  Args:
    url: a URL whose scheme, host and port are one of the sandbox's egress endpoints (a path,
      query and fragment are kept).
    egress: the sandbox's `egress` field (dicts with "endpoint" and "url").
  Raises:
    ValueError: the URL's endpoint is not in the allow-list.
  """
  parts = urlsplit(url)
  head = f"{parts.scheme}://{parts.netloc}"
  endpoint = parse_endpoint(head)
  rest = url[len(head):]
  for entry in egress or ():
    if parse_endpoint(entry["endpoint"]) == endpoint:
      return entry["url"] + rest
  raise ValueError(f"{endpoint.origin} is not in this sandbox's egress allow-list "
                   f"{[e['endpoint'] for e in egress or ()]}")
