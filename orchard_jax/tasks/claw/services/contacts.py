"""Contacts: an address book with search, tags and edits.

Fixtures (`fixtures.contacts`):
  contacts: [{id, name, emails [...] (or email), phones [...] (or phone), company, title,
              birthday (YYYY-MM-DD), address, notes, tags [...]}]
"""
from __future__ import annotations

from typing import Any, Dict, List

from . import timeutil
from .core import BadArguments, Conflict, Operation, Service, array, integer, obj, string

_CONTACT_ID = string("id of a contact", minLength=1)
_FIELDS = {
    "name": string("full name", minLength=1),
    "emails": array({"type": "string", "format": "email"}, "email addresses"),
    "phones": array({"type": "string", "minLength": 3}, "phone numbers"),
    "company": string("organisation"), "title": string("job title"),
    "birthday": string("YYYY-MM-DD", format="date"), "address": string("postal address"),
    "notes": string("free text"), "tags": array({"type": "string", "minLength": 1}, "labels"),
}


class ContactsService(Service):
  name = "contacts"
  tables = {"contacts": "id TEXT PRIMARY KEY, name TEXT, emails TEXT, phones TEXT, company TEXT, "
                        "title TEXT, birthday TEXT, address TEXT, notes TEXT, tags TEXT, "
                        "updated TEXT"}
  json_columns = {"contacts": ("emails", "phones", "tags")}
  id_prefixes = {"contacts": "c_"}

  def load_fixtures(self, fixtures: Dict[str, Any]) -> None:
    for c in fixtures.get("contacts") or ():
      emails = c.get("emails") or ([c["email"]] if c.get("email") else [])
      phones = c.get("phones") or ([c["phone"]] if c.get("phone") else [])
      if c.get("birthday"):
        timeutil.parse_date(c["birthday"])
      self.insert("contacts", {
          "id": c.get("id"), "name": c["name"], "emails": [e.lower() for e in emails],
          "phones": list(phones), "company": c.get("company", ""), "title": c.get("title", ""),
          "birthday": c.get("birthday"), "address": c.get("address", ""),
          "notes": c.get("notes", ""), "tags": list(c.get("tags") or []),
          "updated": self.now_text})

  def operations(self) -> List[Operation]:
    return [
        Operation("contacts_search", "/contacts/search",
                  "Find contacts whose name, email, phone, company or tags contain the text.",
                  obj({"query": string("text to look for", minLength=1),
                       "limit": integer("most results (default 20)", minimum=1, maximum=100)},
                      ["query"]), ContactsService.search),
        Operation("contacts_list", "/contacts/list",
                  "List contacts by name, optionally only those with a tag or company.",
                  obj({"tag": string("only contacts with this tag"),
                       "company": string("only contacts at this company"),
                       "limit": integer("most results (default 50)", minimum=1, maximum=200)}),
                  ContactsService.list_contacts),
        Operation("contacts_get", "/contacts/get", "Read one contact in full.",
                  obj({"contact_id": _CONTACT_ID}, ["contact_id"]), ContactsService.get_contact),
        Operation("contacts_create", "/contacts/create", "Add a contact.",
                  obj(dict(_FIELDS), ["name"]), ContactsService.create, mutates=True),
        Operation("contacts_update", "/contacts/update",
                  "Change a contact: given fields replace the old values (lists included).",
                  obj({"contact_id": _CONTACT_ID, **_FIELDS}, ["contact_id"]),
                  ContactsService.update_contact, mutates=True),
        Operation("contacts_delete", "/contacts/delete", "Delete a contact.",
                  obj({"contact_id": _CONTACT_ID}, ["contact_id"]), ContactsService.delete,
                  mutates=True),
    ]

  def search(self, a: Dict[str, Any]) -> Dict[str, Any]:
    query = a["query"].lower().strip()
    found = []
    for c in self.select("contacts", order="name COLLATE NOCASE, rowid"):
      text = " ".join([c["name"], c["company"], c["title"], *c["emails"], *c["phones"],
                       *c["tags"]]).lower()
      if all(word in text for word in query.split()):
        found.append(c)
    return {"total": len(found), "contacts": found[:a.get("limit", 20)]}

  def list_contacts(self, a: Dict[str, Any]) -> Dict[str, Any]:
    rows = self.select("contacts", order="name COLLATE NOCASE, rowid")
    if "tag" in a:
      rows = [c for c in rows if a["tag"].lower() in (t.lower() for t in c["tags"])]
    if "company" in a:
      rows = [c for c in rows if c["company"].lower() == a["company"].lower()]
    return {"total": len(rows), "contacts": rows[:a.get("limit", 50)]}

  def get_contact(self, a: Dict[str, Any]) -> Dict[str, Any]:
    return {"contact": self.get("contacts", a["contact_id"], "contact")}

  def _check_unique_emails(self, emails: List[str], except_id: str = "") -> None:
    for c in self.select("contacts", "id != ?", (except_id,)):
      clash = set(c["emails"]) & {e.lower() for e in emails}
      if clash:
        raise Conflict(f"{sorted(clash)[0]} already belongs to contact {c['id']!r} "
                       f"({c['name']}); update that contact instead")

  def create(self, a: Dict[str, Any]) -> Dict[str, Any]:
    emails = [e.lower() for e in a.get("emails", [])]
    self._check_unique_emails(emails)
    values = {k: a.get(k, "") for k in ("name", "company", "title", "address", "notes")}
    values.update(emails=emails, phones=a.get("phones", []), tags=a.get("tags", []),
                  birthday=a.get("birthday"), updated=self.now())
    return {"contact": self.insert("contacts", values)}

  def update_contact(self, a: Dict[str, Any]) -> Dict[str, Any]:
    self.get("contacts", a["contact_id"], "contact")
    values = {k: v for k, v in a.items() if k != "contact_id"}
    if not values:
      raise BadArguments(f"arguments: give at least one field to change ({', '.join(_FIELDS)})")
    if "emails" in values:
      values["emails"] = [e.lower() for e in values["emails"]]
      self._check_unique_emails(values["emails"], a["contact_id"])
    values["updated"] = self.now()
    return {"contact": self.update("contacts", a["contact_id"], values)}

  def delete(self, a: Dict[str, Any]) -> Dict[str, Any]:
    self.get("contacts", a["contact_id"], "contact")
    self.db.execute("DELETE FROM contacts WHERE id = ?", (a["contact_id"],))
    return {"deleted": a["contact_id"]}
