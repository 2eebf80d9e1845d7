"""Notes: titled text notes in folders, with tags, search and edits.

Fixtures (`fixtures.notes`):
  notes: [{id, title, body, folder, tags [...], pinned}]
"""
from __future__ import annotations

from typing import Any, Dict, List

from .core import BadArguments, Operation, Service, array, boolean, integer, obj, string

_NOTE_ID = string("id of a note", minLength=1)


class NotesService(Service):
  name = "notes"
  tables = {"notes": "id TEXT PRIMARY KEY, title TEXT, body TEXT, folder TEXT, tags TEXT, "
                     "pinned INTEGER, created TEXT, updated TEXT"}
  json_columns = {"notes": ("tags",)}
  id_prefixes = {"notes": "n_"}

  def load_fixtures(self, fixtures: Dict[str, Any]) -> None:
    for n in fixtures.get("notes") or ():
      self.insert("notes", {
          "id": n.get("id"), "title": n["title"], "body": n.get("body", ""),
          "folder": n.get("folder", "notes"), "tags": list(n.get("tags") or []),
          "pinned": int(bool(n.get("pinned", False))), "created": self.now_text,
          "updated": self.now_text})

  def _view(self, n: Dict[str, Any], full: bool = True) -> Dict[str, Any]:
    out = {k: n[k] for k in ("id", "title", "folder", "tags", "updated")}
    out["pinned"] = bool(n["pinned"])
    if full:
      out["body"] = n["body"]
    else:
      out["snippet"] = " ".join(n["body"].split())[:120]
    return out

  def operations(self) -> List[Operation]:
    return [
        Operation("notes_list", "/notes/list",
                  "List notes (pinned first, then most recently changed).",
                  obj({"folder": string("only this folder"), "tag": string("only this tag")}),
                  NotesService.list_notes),
        Operation("notes_search", "/notes/search",
                  "Find notes whose title or body contains every word of the query.",
                  obj({"query": string("words to look for", minLength=1),
                       "limit": integer("most results (default 20)", minimum=1, maximum=100)},
                      ["query"]), NotesService.search),
        Operation("notes_get", "/notes/get", "Read one note in full.",
                  obj({"note_id": _NOTE_ID}, ["note_id"]), NotesService.get_note),
        Operation("notes_create", "/notes/create", "Write a new note.",
                  obj({"title": string("title", minLength=1), "body": string("text"),
                       "folder": string("folder (default 'notes')", minLength=1),
                       "tags": array({"type": "string", "minLength": 1}, "labels"),
                       "pinned": boolean("keep at the top")}, ["title", "body"]),
                  NotesService.create, mutates=True),
        Operation("notes_update", "/notes/update",
                  "Change a note: replace its title, body, folder or tags, or `append` text to "
                  "its body.",
                  obj({"note_id": _NOTE_ID, "title": string("new title", minLength=1),
                       "body": string("new text (replaces the old)"),
                       "append": string("text added at the end, on a new line"),
                       "folder": string("move to this folder", minLength=1),
                       "tags": array({"type": "string", "minLength": 1}, "labels"),
                       "pinned": boolean("keep at the top")}, ["note_id"]),
                  NotesService.update_note, mutates=True),
        Operation("notes_delete", "/notes/delete", "Delete a note.",
                  obj({"note_id": _NOTE_ID}, ["note_id"]), NotesService.delete, mutates=True),
    ]

  def list_notes(self, a: Dict[str, Any]) -> Dict[str, Any]:
    rows = self.select("notes", order="pinned DESC, updated DESC, rowid DESC")
    if "folder" in a:
      rows = [n for n in rows if n["folder"].lower() == a["folder"].lower()]
    if "tag" in a:
      rows = [n for n in rows if a["tag"].lower() in (t.lower() for t in n["tags"])]
    return {"total": len(rows), "notes": [self._view(n, full=False) for n in rows]}

  def search(self, a: Dict[str, Any]) -> Dict[str, Any]:
    words = a["query"].lower().split()
    rows = [n for n in self.select("notes", order="updated DESC, rowid DESC")
            if all(w in f"{n['title']} {n['body']}".lower() for w in words)]
    return {"total": len(rows), "notes": [self._view(n, full=False)
                                          for n in rows[:a.get("limit", 20)]]}

  def get_note(self, a: Dict[str, Any]) -> Dict[str, Any]:
    return {"note": self._view(self.get("notes", a["note_id"], "note"))}

  def create(self, a: Dict[str, Any]) -> Dict[str, Any]:
    now = self.now()
    return {"note": self._view(self.insert("notes", {
        "title": a["title"], "body": a["body"], "folder": a.get("folder", "notes"),
        "tags": a.get("tags", []), "pinned": int(a.get("pinned", False)), "created": now,
        "updated": now}))}

  def update_note(self, a: Dict[str, Any]) -> Dict[str, Any]:
    old = self.get("notes", a["note_id"], "note")
    if "body" in a and "append" in a:
      raise BadArguments("arguments: give `body` (replace) or `append`, not both")
    values = {k: a[k] for k in ("title", "body", "folder", "tags") if k in a}
    if "pinned" in a:
      values["pinned"] = int(a["pinned"])
    if "append" in a:
      values["body"] = f"{old['body']}\n{a['append']}" if old["body"] else a["append"]
    if not values:
      raise BadArguments("arguments: give at least one of title, body, append, folder, tags, "
                         "pinned")
    values["updated"] = self.now()
    return {"note": self._view(self.update("notes", a["note_id"], values))}

  def delete(self, a: Dict[str, Any]) -> Dict[str, Any]:
    self.get("notes", a["note_id"], "note")
    self.db.execute("DELETE FROM notes WHERE id = ?", (a["note_id"],))
    return {"deleted": a["note_id"]}
