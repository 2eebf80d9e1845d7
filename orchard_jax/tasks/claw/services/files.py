"""Files: the user's file area, a tree of folders and text files (a Dropbox-like store).

The tree lives in the service's database, not on the sandbox's disk, so the agent changes it
only through the tools. Paths are absolute POSIX paths ("/reports/q1.txt"); `.` and repeated
slashes are normalised, `..` and NUL are refused. Writing a file creates its parent folders.

Fixtures (`fixtures.files`): {"/path/file.txt": "content", "/empty/folder/": null, ...}
(a path ending with "/" or a null content is a folder).
"""
from __future__ import annotations

import fnmatch
import posixpath
from typing import Any, Dict, List

from .core import BadArguments, Conflict, NotFound, Operation, Service, boolean, integer, obj, \
    string

MAX_FILE_CHARS = 200_000
_PATH = string("absolute path, e.g. /reports/q1.txt", minLength=1, maxLength=500)


def normalise(path: str, field: str = "path") -> str:
  """'/a//b/./c/' -> '/a/b/c'. Raises BadArguments for relative paths, '..' or NUL."""
  if "\x00" in path:
    raise BadArguments(f"arguments.{field}: a path may not contain NUL")
  if not path.startswith("/"):
    raise BadArguments(f"arguments.{field}: expected an absolute path starting with '/', got "
                       f"{path!r}")
  parts = [p for p in path.split("/") if p not in ("", ".")]
  if ".." in parts:
    raise BadArguments(f"arguments.{field}: '..' is not allowed in a path, got {path!r}")
  return "/" + "/".join(parts)


class FilesService(Service):
  name = "files"
  tables = {"files": "id TEXT PRIMARY KEY, kind TEXT, content TEXT, size INTEGER, modified TEXT"}

  def load_fixtures(self, fixtures: Dict[str, Any]) -> None:
    entries = fixtures.get("files") or {}
    if isinstance(entries, list):
      entries = {e["path"]: e.get("content") for e in entries}
    for path, content in entries.items():
      clean = normalise(path)
      if content is None or path.endswith("/"):
        self._mkdirs(clean, self.now_text)
      else:
        self._mkdirs(posixpath.dirname(clean), self.now_text)
        self._put(clean, str(content), self.now_text)

  # ------------------------------------------------------------------ tree helpers
  def _entry(self, path: str):
    if path == "/":
      return {"id": "/", "kind": "folder", "content": None, "size": 0, "modified": None}
    rows = self.select("files", "id = ?", (path,))
    return rows[0] if rows else None

  def _mkdirs(self, path: str, when: str) -> None:
    parts = [p for p in path.split("/") if p]
    current = ""
    for part in parts:
      current += "/" + part
      entry = self._entry(current)
      if entry is None:
        self.insert("files", {"id": current, "kind": "folder", "content": None, "size": 0,
                              "modified": when})
      elif entry["kind"] != "folder":
        raise Conflict(f"{current} is a file, so it cannot hold {path}")

  def _put(self, path: str, content: str, when: str) -> Dict[str, Any]:
    if len(content) > MAX_FILE_CHARS:
      raise BadArguments(f"arguments.content: expected at most {MAX_FILE_CHARS} characters, got "
                         f"{len(content)}")
    size = len(content.encode("utf-8"))
    if self._entry(path) is None:
      self.insert("files", {"id": path, "kind": "file", "content": content, "size": size,
                            "modified": when})
    else:
      self.update("files", path, {"content": content, "size": size, "modified": when})
    return self._view(self._entry(path))

  def _existing(self, path: str, field: str = "path") -> Dict[str, Any]:
    entry = self._entry(path)
    if entry is None:
      parent = posixpath.dirname(path)
      hint = f"; {parent} holds {', '.join(self._names(parent)) or 'nothing'}" \
          if self._entry(parent) is not None else ""
      raise NotFound(f"no file or folder at {path}{hint}")
    return entry

  def _names(self, folder: str) -> List[str]:
    return [posixpath.basename(e["id"]) for e in self._children(folder)][:20]

  def _children(self, folder: str, recursive: bool = False) -> List[Dict[str, Any]]:
    prefix = folder.rstrip("/") + "/"
    rows = self.select("files", "substr(id, 1, ?) = ?", (len(prefix), prefix), order="id")
    if not recursive:
      rows = [r for r in rows if "/" not in r["id"][len(prefix):]]
    return rows

  def _view(self, e: Dict[str, Any]) -> Dict[str, Any]:
    return {"path": e["id"], "name": posixpath.basename(e["id"]) or "/", "type": e["kind"],
            "size": e["size"], "modified": e["modified"]}

  # ------------------------------------------------------------------ operations
  def operations(self) -> List[Operation]:
    return [
        Operation("files_list", "/files/list", "List a folder's files and folders.",
                  obj({"path": string("folder (default /)", minLength=1),
                       "recursive": boolean("include everything below")}),
                  FilesService.list_files),
        Operation("files_read", "/files/read", "Read a text file.",
                  obj({"path": _PATH}, ["path"]), FilesService.read),
        Operation("files_write", "/files/write",
                  "Write a text file (parent folders are created). mode: create (default; "
                  "fails if the file exists), overwrite or append.",
                  obj({"path": _PATH, "content": string("text to write"),
                       "mode": string("create, overwrite or append",
                                      enum=["create", "overwrite", "append"])},
                      ["path", "content"]), FilesService.write, mutates=True),
        Operation("files_mkdir", "/files/mkdir", "Create a folder (and its parents).",
                  obj({"path": _PATH}, ["path"]), FilesService.mkdir, mutates=True),
        Operation("files_move", "/files/move",
                  "Move or rename a file or folder; a destination ending in / is a folder to "
                  "move it into (created if needed).",
                  obj({"source": _PATH, "destination": _PATH,
                       "overwrite": boolean("replace an existing destination file")},
                      ["source", "destination"]), FilesService.move, mutates=True),
        Operation("files_copy", "/files/copy", "Copy a file.",
                  obj({"source": _PATH, "destination": _PATH,
                       "overwrite": boolean("replace an existing destination file")},
                      ["source", "destination"]), FilesService.copy, mutates=True),
        Operation("files_delete", "/files/delete",
                  "Delete a file, or a folder (a non-empty one needs recursive).",
                  obj({"path": _PATH, "recursive": boolean("delete a folder's contents too")},
                      ["path"]), FilesService.delete, mutates=True),
        Operation("files_search", "/files/search",
                  "Find files by name pattern (e.g. *.csv) and/or text they contain.",
                  obj({"name": string("file-name pattern with * and ?"),
                       "query": string("text the file contains (case-insensitive)"),
                       "path": string("folder to search (default /)", minLength=1),
                       "limit": integer("most results (default 20)", minimum=1, maximum=100)}),
                  FilesService.search),
    ]

  def list_files(self, a: Dict[str, Any]) -> Dict[str, Any]:
    path = normalise(a.get("path", "/"))
    entry = self._existing(path)
    if entry["kind"] != "folder":
      raise Conflict(f"{path} is a file; use files_read to read it")
    return {"path": path, "entries": [self._view(e) for e in
                                      self._children(path, a.get("recursive", False))]}

  def read(self, a: Dict[str, Any]) -> Dict[str, Any]:
    path = normalise(a["path"])
    entry = self._existing(path)
    if entry["kind"] == "folder":
      raise Conflict(f"{path} is a folder; use files_list to see what it holds")
    return {"path": path, "size": entry["size"], "content": entry["content"]}

  def write(self, a: Dict[str, Any]) -> Dict[str, Any]:
    path = normalise(a["path"])
    if path == "/":
      raise BadArguments("arguments.path: expected a file path, got the root folder")
    mode = a.get("mode", "create")
    entry = self._entry(path)
    if entry is not None and entry["kind"] == "folder":
      raise Conflict(f"{path} is a folder")
    if entry is not None and mode == "create":
      raise Conflict(f"{path} already exists; use mode overwrite or append to change it")
    content = a["content"]
    if entry is not None and mode == "append":
      content = entry["content"] + content
    self._mkdirs(posixpath.dirname(path), self.now())
    return {"written": self._put(path, content, self.now())}

  def mkdir(self, a: Dict[str, Any]) -> Dict[str, Any]:
    path = normalise(a["path"])
    self._mkdirs(path, self.now())
    return {"folder": self._view(self._entry(path))}

  def _target(self, a: Dict[str, Any], source: Dict[str, Any]) -> str:
    destination = normalise(a["destination"], "destination")
    existing = self._entry(destination)
    if existing is None and a["destination"].endswith("/"):   # "into this folder": create it
      self._mkdirs(destination, self.now())
      existing = self._entry(destination)
    if existing is not None and existing["kind"] == "folder":
      destination = posixpath.join(destination, posixpath.basename(source["id"]))
      existing = self._entry(destination)
    if destination == source["id"]:
      raise Conflict(f"{destination} is the source itself")
    if existing is not None:
      if existing["kind"] == "folder" or source["kind"] == "folder" or not a.get("overwrite"):
        raise Conflict(f"{destination} already exists; pass overwrite to replace a file")
    if source["kind"] == "folder" and destination.startswith(source["id"] + "/"):
      raise Conflict(f"cannot move {source['id']} into itself")
    return destination

  def move(self, a: Dict[str, Any]) -> Dict[str, Any]:
    source = self._existing(normalise(a["source"], "source"), "source")
    if source["id"] == "/":
      raise BadArguments("arguments.source: the root folder cannot move")
    destination = self._target(a, source)
    self._mkdirs(posixpath.dirname(destination), self.now())
    if self._entry(destination) is not None:
      self.db.execute("DELETE FROM files WHERE id = ?", (destination,))
    moved = [source] + (self._children(source["id"], True) if source["kind"] == "folder" else [])
    for e in moved:
      self.db.execute("UPDATE files SET id = ?, modified = ? WHERE id = ?",
                      (destination + e["id"][len(source["id"]):], self.now(), e["id"]))
    return {"moved": {"from": source["id"], "to": destination}}

  def copy(self, a: Dict[str, Any]) -> Dict[str, Any]:
    source = self._existing(normalise(a["source"], "source"), "source")
    if source["kind"] == "folder":
      raise Conflict(f"{source['id']} is a folder; only files can be copied")
    destination = self._target(a, source)
    self._mkdirs(posixpath.dirname(destination), self.now())
    return {"copied": self._put(destination, source["content"], self.now())}

  def delete(self, a: Dict[str, Any]) -> Dict[str, Any]:
    path = normalise(a["path"])
    if path == "/":
      raise BadArguments("arguments.path: the root folder cannot be deleted")
    entry = self._existing(path)
    children = self._children(path, True) if entry["kind"] == "folder" else []
    if children and not a.get("recursive"):
      raise Conflict(f"{path} is a folder holding {len(children)} entries; pass recursive to "
                     "delete them too")
    for e in children + [entry]:
      self.db.execute("DELETE FROM files WHERE id = ?", (e["id"],))
    return {"deleted": path, "entries": len(children) + 1}

  def search(self, a: Dict[str, Any]) -> Dict[str, Any]:
    root = normalise(a.get("path", "/"))
    self._existing(root)
    if "name" not in a and "query" not in a:
      raise BadArguments("arguments: give `name` (a pattern) and/or `query` (text)")
    query = (a.get("query") or "").lower()
    found = []
    for e in self._children(root, True):
      if e["kind"] != "file":
        continue
      if "name" in a and not fnmatch.fnmatchcase(posixpath.basename(e["id"]).lower(),
                                                 a["name"].lower()):
        continue
      lines = []
      if query:
        lines = [line for line in e["content"].splitlines() if query in line.lower()]
        if not lines:
          continue
      view = self._view(e)
      if lines:
        view["matches"] = lines[:5]
      found.append(view)
    return {"total": len(found), "files": found[:a.get("limit", 20)]}
