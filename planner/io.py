"""Files at the edge: one YAML reader and one atomic writer, for every file the planner reads or writes."""

import json
import os
import stat
import tempfile
from pathlib import Path

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from planner.errors import InputError

__all__ = ["read_yaml", "write_document", "MAX_FILE_BYTES", "MAX_DEPTH", "MAX_VALUES"]

MAX_FILE_BYTES = 4 * 2**20  # 16,384 devices listed one per entry take about 1.2 MiB
MAX_DEPTH = 32  # mappings and lists inside each other; a topology needs 5 (network.matrix.latency[i][j])
MAX_VALUES = 500_000  # keys, values and entries, aliases expanded (16,384 listed devices: ~150,000)

try:  # libyaml's parser is iterative: deep nesting reaches the depth check instead of the C stack
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser as _Parser


class _Refused(yaml.MarkedYAMLError):
    """A document the reader refuses (too deep, a key twice, a value its tag cannot read)."""

    def __init__(self, problem: str, mark, field: str | None = None):
        super().__init__(problem=problem, problem_mark=mark)
        self.field = field
        self.node = None  # the node whose value could not be read, to name its field


class _Loader(Composer, _Parser, SafeConstructor, Resolver):
    """The safe loader (plain data only), with nesting depth and value count bounded while composing."""

    def __init__(self, text: str):
        _Parser.__init__(self, text)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nests deeper than {MAX_DEPTH} levels: flatten it", self.peek_event().start_mark)
            if self._nodes > MAX_VALUES:
                raise _Refused(f"holds more than {MAX_VALUES:,} values: describe repeated devices with 'count'",
                               self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError as error:
            if getattr(error, "node", None) is None:  # the innermost node names the field
                error.node = node
            raise
        except (ValueError, TypeError, KeyError, OverflowError, ArithmeticError) as error:
            value = node.value if isinstance(node, yaml.ScalarNode) else node.id
            refused = _Refused(f"cannot read {value!r} as {node.tag.rsplit(':', 1)[-1]} "
                               f"({error.__class__.__name__}): fix the value or drop the tag", node.start_mark)
            refused.node = node
            raise refused from None


def _check_tree(node) -> None:
    """Refuse duplicate keys (naming the field) and alias bombs, without recursion."""
    sizes: dict = {}
    stack = [(node, "", False)]
    while stack:
        current, where, done = stack.pop()
        key = id(current)
        if key in sizes and not done:
            continue
        if isinstance(current, yaml.ScalarNode):
            sizes[key] = 1
            continue
        if isinstance(current, yaml.MappingNode):
            children = [child for pair in current.value for child in pair]
        else:
            children = list(current.value)
        if done:
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[key] > MAX_VALUES:
                raise _Refused(f"expands to more than {MAX_VALUES:,} values (YAML aliases repeat their anchor): "
                               "write the values out", current.start_mark, where or None)
            continue
        sizes[key] = 0  # on the path: an alias back to it would be a cycle, which the composer refuses
        stack.append((current, where, True))
        if isinstance(current, yaml.MappingNode):
            seen = {}
            for k, v in current.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else None
                path = f"{where}.{name}" if where and name is not None else (name if name is not None else where)
                if name is not None:
                    if (k.tag, name) in seen:
                        first = seen[(k.tag, name)]
                        raise _Refused(f"key '{name}' appears twice (lines {first.line + 1} and "
                                       f"{k.start_mark.line + 1}): keep one", k.start_mark, path)
                    seen[(k.tag, name)] = k.start_mark
                stack.append((k, where, False))
                stack.append((v, path, False))
        else:
            for i, child in enumerate(children):
                stack.append((child, f"{where}[{i}]", False))


def _path_to(root, target) -> str | None:
    """The field path of ``target`` inside ``root`` (e.g. ``network.region.bandwidth``), for a message."""
    stack, seen = [(root, "")], set()
    while stack:
        node, where = stack.pop()
        if node is target:
            return where or None
        if id(node) in seen or isinstance(node, yaml.ScalarNode):
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                stack.append((v, f"{where}.{name}" if where else name))
        else:
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(node.value))
    return None


def _parse(text: str):
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(node)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as error:
            if getattr(error, "node", None) is not None:
                error.field = _path_to(node, error.node)
            raise
    finally:
        loader.dispose()


def _read_text(path: Path) -> str:
    """The file's text: only a regular file, only up to ``MAX_FILE_BYTES`` (a FIFO or /dev/zero never blocks)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError("file not found: check the path", source=str(path)) from None
    except (IsADirectoryError, PermissionError, OSError) as error:
        raise InputError(f"cannot read it ({error.__class__.__name__}): pass a readable YAML file",
                         source=str(path)) from None
    try:
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISDIR(mode):
            raise InputError("cannot read it (IsADirectoryError): pass a readable YAML file", source=str(path))
        if not stat.S_ISREG(mode):
            raise InputError("is not a regular file (a device, pipe or socket): pass a YAML file", source=str(path))
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(descriptor, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(descriptor)
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"is larger than the {MAX_FILE_BYTES // 2**20} MiB limit of an input file: "
                         "describe repeated devices with 'count' instead of one entry each", source=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("cannot read it (UnicodeDecodeError): save it as UTF-8 text", source=str(path)) from None


def read_yaml(path) -> object:
    """Read a YAML (or JSON) file with the safe loader; every failure is an ``InputError`` naming the file.

    Refused with one line: anything but a regular file, files over ``MAX_FILE_BYTES``, nesting deeper than
    ``MAX_DEPTH``, a key twice in one mapping, a value its tag cannot read (``!!int abc``), and aliases
    expanding past ``MAX_VALUES``.
    """
    path = Path(path)
    text = _read_text(path)
    try:
        return _parse(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        if "maximum nesting depth" in problem:  # libyaml's own limit (PyYAML >= 6.0.4), met while scanning ahead
            problem = f"nests deeper than {MAX_DEPTH} levels: flatten it"
        raise InputError(f"not valid YAML{where}: {problem}", source=str(path),
                         field=getattr(error, "field", None)) from None
    except RecursionError:  # a guard: the depth check above comes first
        raise InputError(f"not valid YAML: nests deeper than {MAX_DEPTH} levels: flatten it",
                         source=str(path)) from None
    except Exception as error:  # any other failure inside the loader is still a bad file, not a crash
        raise InputError(f"not valid YAML: {error.__class__.__name__}: {error}".replace("\n", " "),
                         source=str(path)) from None


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
        os.fchmod(handle, 0o666 & ~_umask())  # as open() would create it (mkstemp makes it 0600)
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's file-creation mask: from ``/proc/self/status`` where Linux has it (reading it
    there changes nothing another thread could see); elsewhere by setting it, then restoring it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
