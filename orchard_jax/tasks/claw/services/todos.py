"""To-dos: tasks with due dates, priorities, lists and tags.

Fixtures (`fixtures.todos`):
  todos: [{id, title, notes, due (YYYY-MM-DD), priority (low|normal|high), status (open|done),
           list, tags [...]}]
"""
from __future__ import annotations

from typing import Any, Dict, List

from . import timeutil
from .core import BadArguments, Conflict, Operation, Service, array, obj, string

PRIORITIES = ("low", "normal", "high")
STATUSES = ("open", "done")
_TODO_ID = string("id of a to-do", minLength=1)
_FIELDS = {
    "title": string("what to do", minLength=1), "notes": string("details"),
    "due": string("due date YYYY-MM-DD", format="date"),
    "priority": string("low, normal or high", enum=list(PRIORITIES)),
    "list": string("list name (default 'inbox')", minLength=1),
    "tags": array({"type": "string", "minLength": 1}, "labels"),
}


class TodosService(Service):
  name = "todos"
  tables = {"todos": "id TEXT PRIMARY KEY, title TEXT, notes TEXT, due TEXT, priority TEXT, "
                     "status TEXT, list TEXT, tags TEXT, created TEXT, completed TEXT"}
  json_columns = {"todos": ("tags",)}
  id_prefixes = {"todos": "t_"}

  def load_fixtures(self, fixtures: Dict[str, Any]) -> None:
    for t in fixtures.get("todos") or ():
      if t.get("due"):
        timeutil.parse_date(t["due"])
      priority, status = t.get("priority", "normal"), t.get("status", "open")
      if priority not in PRIORITIES or status not in STATUSES:
        raise ValueError(f"todo {t.get('title')!r}: priority must be one of {PRIORITIES} and "
                         f"status one of {STATUSES}")
      self.insert("todos", {
          "id": t.get("id"), "title": t["title"], "notes": t.get("notes", ""),
          "due": t.get("due"), "priority": priority, "status": status,
          "list": t.get("list", "inbox"), "tags": list(t.get("tags") or []),
          "created": self.now_text, "completed": self.now_text if status == "done" else None})

  def operations(self) -> List[Operation]:
    return [
        Operation("todos_list", "/todos/list",
                  "List to-dos (open ones by default), soonest due first.",
                  obj({"status": string("open (default), done or all",
                                        enum=["open", "done", "all"]),
                       "list": string("only this list"), "tag": string("only this tag"),
                       "due_before": string("only due on or before this date", format="date")}),
                  TodosService.list_todos),
        Operation("todos_create", "/todos/create", "Add a to-do.",
                  obj(dict(_FIELDS), ["title"]), TodosService.create, mutates=True),
        Operation("todos_update", "/todos/update",
                  "Change a to-do (given fields are replaced; due '' clears the date).",
                  obj({"todo_id": _TODO_ID, **_FIELDS,
                       "due": {"type": "string", "description": "YYYY-MM-DD, or '' to clear",
                               "pattern": r"^(\d{4}-\d{2}-\d{2})?$"},
                       "status": string("open or done", enum=list(STATUSES))}, ["todo_id"]),
                  TodosService.update_todo, mutates=True),
        Operation("todos_complete", "/todos/complete", "Mark a to-do done.",
                  obj({"todo_id": _TODO_ID}, ["todo_id"]), TodosService.complete, mutates=True),
        Operation("todos_delete", "/todos/delete", "Delete a to-do.",
                  obj({"todo_id": _TODO_ID}, ["todo_id"]), TodosService.delete, mutates=True),
    ]

  def list_todos(self, a: Dict[str, Any]) -> Dict[str, Any]:
    status = a.get("status", "open")
    rows = self.select("todos", order="due IS NULL, due, rowid")
    if status != "all":
      rows = [t for t in rows if t["status"] == status]
    if "list" in a:
      rows = [t for t in rows if t["list"].lower() == a["list"].lower()]
    if "tag" in a:
      rows = [t for t in rows if a["tag"].lower() in (x.lower() for x in t["tags"])]
    if "due_before" in a:
      rows = [t for t in rows if t["due"] and t["due"] <= a["due_before"]]
    return {"total": len(rows), "todos": rows}

  def create(self, a: Dict[str, Any]) -> Dict[str, Any]:
    return {"todo": self.insert("todos", {
        "title": a["title"], "notes": a.get("notes", ""), "due": a.get("due"),
        "priority": a.get("priority", "normal"), "status": "open",
        "list": a.get("list", "inbox"), "tags": a.get("tags", []), "created": self.now(),
        "completed": None})}

  def update_todo(self, a: Dict[str, Any]) -> Dict[str, Any]:
    old = self.get("todos", a["todo_id"], "to-do")
    values = {k: v for k, v in a.items() if k != "todo_id"}
    if not values:
      raise BadArguments("arguments: give at least one field to change")
    if "due" in values:
      if values["due"]:
        try:
          timeutil.parse_date(values["due"])
        except ValueError as e:
          raise BadArguments(f"arguments.due: {e}") from None
      else:
        values["due"] = None
    if "status" in values and values["status"] != old["status"]:
      values["completed"] = self.now() if values["status"] == "done" else None
    return {"todo": self.update("todos", a["todo_id"], values)}

  def complete(self, a: Dict[str, Any]) -> Dict[str, Any]:
    old = self.get("todos", a["todo_id"], "to-do")
    if old["status"] == "done":
      raise Conflict(f"to-do {a['todo_id']!r} is already done")
    return {"todo": self.update("todos", a["todo_id"], {"status": "done",
                                                          "completed": self.now()})}

  def delete(self, a: Dict[str, Any]) -> Dict[str, Any]:
    self.get("todos", a["todo_id"], "to-do")
    self.db.execute("DELETE FROM todos WHERE id = ?", (a["todo_id"],))
    return {"deleted": a["todo_id"]}
