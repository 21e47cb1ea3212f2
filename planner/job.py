"""Load a topology file (plus optional model/training sections or overrides) into its three slices."""

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from planner.errors import InputError
from planner.model import ModelSpec, TrainingSpec, model_preset, parse_model, parse_training
from planner.topology import Topology, parse_topology

__all__ = ["Job", "load_job", "read_yaml"]

_TOP_KEYS = ("name", "description", "devices", "network", "model", "training")


@dataclass(frozen=True, kw_only=True)
class Job:
    topology: Topology
    model: ModelSpec
    training: TrainingSpec


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


def load_job(path, *, model: str | ModelSpec | None = None, model_file=None, training_overrides: dict | None = None) -> Job:
    """Topology from ``path``; the model from ``model``/``model_file`` or the file's ``model`` section.

    ``training_overrides`` (e.g. ``{"global_batch": 1024}``) replace fields of the file's
    ``training`` section, which may then be absent.
    """
    source = str(path)
    document = read_yaml(path)
    try:
        if not isinstance(document, dict):
            raise InputError("expected a mapping with 'devices' and 'network' at the top")
        unknown = [k for k in document if k not in _TOP_KEYS]
        if unknown:
            raise InputError(f"unknown top-level key '{unknown[0]}': use only {', '.join(_TOP_KEYS)}")
        name = document.get("name") or Path(path).stem
        topology = parse_topology(document, name=str(name), source=source)
        spec = _model(document, model, model_file)
        training = _training(document.get("training"), training_overrides or {})
    except InputError as error:
        raise error.located(source=source) from None
    return Job(topology=topology, model=spec, training=training)


def _model(document: dict, model, model_file) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if model is not None:
        return model_preset(model)
    if model_file is not None:
        try:
            return parse_model(read_yaml(model_file), where="")
        except InputError as error:
            raise error.located(source=str(model_file)) from None
    if "model" not in document:
        raise InputError("is missing: add a model section or pass --model PRESET", field="model")
    return parse_model(document["model"])


def _training(section, overrides: dict) -> TrainingSpec:
    if section is None and "global_batch" not in overrides:
        raise InputError("is missing: add a training section with global_batch or pass --global-batch",
                         field="training")
    training = parse_training(section if section is not None else {"global_batch": overrides["global_batch"]})
    clean = {k: v for k, v in overrides.items() if v is not None}
    return replace(training, **clean) if clean else training
