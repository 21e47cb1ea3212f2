"""Files at the edge: one YAML reader and one atomic writer, for every file the planner reads or writes."""

import json
import os
import tempfile
from pathlib import Path

import yaml

from planner.errors import InputError

__all__ = ["read_yaml", "write_document"]

def read_yaml(path) -> object:
    """Read a YAML (or JSON) file with the safe loader; every failure is an ``InputError`` naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("file not found: check the path", source=str(path)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read it ({error.__class__.__name__}): pass a readable YAML file",
                         source=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise InputError(f"not valid YAML{where}: {problem}", source=str(path)) from None


def write_document(document: dict, path) -> None:
    """Write ``document`` atomically (temp file in the same folder, fsync, rename): never half a file.

    ``.json`` gives JSON; ``.yaml``/``.yml`` YAML; anything else is refused.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        text = json.dumps(document, indent=2) + "\n"
    elif suffix in (".yaml", ".yml"):
        text = yaml.safe_dump(document, sort_keys=False, width=120)
    else:
        raise InputError(f"unknown extension {suffix or '(none)'}: name the file .yaml or .json", source=str(path))
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError("its folder does not exist: create it first", source=str(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
