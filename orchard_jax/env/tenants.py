"""Tenants: who an API key is, and what it may see.

Every sandbox belongs to the tenant whose key created it. For any other tenant every route
answers as if the sandbox did not exist (404); admin keys, configured on their own, see and
manage every tenant's sandboxes. A tenant is named by the key's entry:

- `"secret"`: a key that is its own tenant, named `key-<first 12 hex digits of its SHA-256>`
  (the key itself is never written anywhere);
- `"alice:secret"`: key `secret` of tenant `alice` (several keys may share a tenant);
- a dict `{"alice": "secret"}` or `{"alice": ["k1", "k2"]}` in Python.

Tenant names are 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or
digit (they are Kubernetes label values). Keys are compared by their SHA-256 digests.
"""
import dataclasses
import hashlib
import re
from typing import Iterable, Mapping, Optional, Union

_TENANT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?\Z")
ADMIN_TENANT = "admin"


@dataclasses.dataclass(frozen=True)
class Principal:
  """Who made a request.

  Attributes:
    tenant: the tenant the key belongs to (owner of the sandboxes it creates).
    admin: True for an admin key (sees and manages every tenant's sandboxes).
  """
  tenant: str
  admin: bool = False

  def may_see(self, record: Optional[dict]) -> bool:
    """True if this principal may know that `record` exists."""
    return record is not None and (self.admin or record.get("tenant") == self.tenant)


def _digest(key: str) -> bytes:
  return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def default_tenant(key: str) -> str:
  return "key-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def check_tenant(name: str) -> str:
  """`name` if it is a valid tenant name; raises ValueError otherwise."""
  if not isinstance(name, str) or not _TENANT.match(name):
    raise ValueError(f"tenant name must be 1-63 letters, digits, '-', '_' or '.', starting and "
                     f"ending with a letter or digit; got {name!r}")
  return name


def _entries(keys: Union[None, Iterable[str], Mapping]) -> list:
  """[(tenant, key)] from a list of "[tenant:]key" entries or a {tenant: key(s)} dict."""
  out = []
  if keys is None:
    return out
  if isinstance(keys, Mapping):
    for tenant, value in keys.items():
      for key in ([value] if isinstance(value, str) else list(value)):
        out.append((check_tenant(tenant), key))
    return out
  for entry in keys:
    tenant, sep, key = entry.partition(":")
    if sep and _TENANT.match(tenant) and key:
      out.append((tenant, key))
    else:
      out.append((default_tenant(entry), entry))
  return out


class Tenants:
  """The keys a service accepts.

  Args:
    api_keys: tenant keys, as "[tenant:]key" entries or a {tenant: key or [keys]} dict.
    admin_keys: admin keys in the same forms (their tenant owns what they create).
  Raises:
    ValueError: no key at all, an empty key, a bad tenant name, or one key given twice.
  """

  def __init__(self, api_keys=None, admin_keys=None):
    self._by_digest = {}
    for admin, keys in ((False, api_keys), (True, admin_keys)):
      for tenant, key in _entries(keys):
        if not key:
          raise ValueError(f"tenant {tenant!r} has an empty key")
        digest = _digest(key)
        if digest in self._by_digest:
          raise ValueError(f"a key of tenant {tenant!r} is given twice")
        self._by_digest[digest] = Principal(tenant, admin)
    if not self._by_digest:
      raise ValueError("at least one API key is required")

  def __len__(self) -> int:
    return len(self._by_digest)

  def lookup(self, key: str) -> Optional[Principal]:
    """The principal of `key`, or None for a key this service does not accept."""
    return self._by_digest.get(_digest(key))

  @property
  def names(self) -> list:
    return sorted({p.tenant for p in self._by_digest.values()})


def first_key(keys) -> str:
  """The first key of a key list or dict, without its tenant (what a default client uses)."""
  return _entries(keys)[0][1]
