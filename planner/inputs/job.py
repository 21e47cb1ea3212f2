"""Load a topology file (plus optional model/training sections or overrides) into its three slices."""

from dataclasses import dataclass, replace
from pathlib import Path

from planner.errors import InputError
from planner.fields import closest
from planner.inputs.calibration import read_calibration
from planner.io import read_yaml
from planner.inputs.model import ModelSpec, TrainingSpec, model_preset, parse_model, parse_training
from planner.inputs.topology import Topology, parse_topology
from planner.plan.precision import check_precision

__all__ = ["Job", "load_job", "load_topology", "topology_from_document"]

_TOP_KEYS = ("name", "description", "devices", "network", "model", "training")


@dataclass(frozen=True, kw_only=True)
class Job:
    topology: Topology
    model: ModelSpec
    training: TrainingSpec


def load_job(path, *, model: str | ModelSpec | None = None, model_file=None, training_overrides: dict | None = None) -> Job:
    """Topology from ``path``; the model from ``model``/``model_file`` or the file's ``model`` section.

    ``training_overrides`` (e.g. ``{"global_batch": 1024}``) replace fields of the file's
    ``training`` section, which may then be absent.
    """
    source = str(path)
    document = read_yaml(path)
    try:
        _check_top(document)
        unknown = [k for k in document if k not in _TOP_KEYS]
        if "format_version" in unknown and "devices" not in document:
            raise InputError("is a plan file, not a topology: run it with 'plan launch FILE', or plan a topology "
                             "file", field="format_version")
        if unknown:
            close = closest(unknown[0], _TOP_KEYS)
            raise InputError(f"unknown top-level key '{unknown[0]}': " + (f"did you mean '{close}'? " if close else "")
                             + f"use only {', '.join(_TOP_KEYS)}", field=str(unknown[0]))
        topology = _topology(document, path)
        spec = _model(document, model, model_file)
        training = _training(document.get("training"), training_overrides or {})
        check_precision(topology, training)
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


def _check_top(document) -> None:
    """A topology file holds a mapping at the top (an empty file reads as None)."""
    if document is None:
        raise InputError("the file is empty: describe its devices and network (topologies/ holds examples)")
    if not isinstance(document, dict):
        raise InputError("expected a mapping with 'devices' and 'network' at the top")


def load_topology(path) -> Topology:
    """The topology of a file (its ``devices`` and ``network``; other sections are not read)."""
    document = read_yaml(path)
    try:
        _check_top(document)
        return _topology(document, path)
    except InputError as error:
        raise error.located(source=str(path)) from None


def topology_from_document(document: dict, path) -> Topology:
    """The topology of ``document``, read as if it were the file ``path`` (errors name that file)."""
    try:
        return _topology(document, path)
    except InputError as error:
        raise error.located(source=str(path)) from None


def _topology(document: dict, path) -> Topology:
    """Parse the topology, with the measured links of the calibration file its network names."""
    calibration = None
    network = document.get("network")
    if isinstance(network, dict) and isinstance(network.get("calibration"), str):
        calibration_path = Path(network["calibration"])
        if not calibration_path.is_absolute():
            calibration_path = Path(path).parent / calibration_path
        try:
            calibration = read_calibration(calibration_path)
        except InputError as error:
            raise InputError(f"{error}", field="network.calibration") from None
    name = document.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise InputError(f"expected a non-empty string, got {name!r}", field="name")
    name = name or Path(path).stem
    return parse_topology(document, name=str(name), source=str(path), calibration=calibration)
