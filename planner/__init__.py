"""Planner for training large models on heterogeneous devices and networks.

Inputs (topology, model, training), the plan file, the search and the ``plan`` command live here;
the formulas and the simulator live in ``cost_models``; the torch runtime in ``planner.runtime``.
"""

__all__ = ["__version__"]

DISTRIBUTION = "hetplan"  # the package name pip knows this project by (pyproject.toml)
UNKNOWN_VERSION = "0+unknown"  # a source tree that was never installed


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN_VERSION


def __getattr__(name: str):
    # Looked up on first use, so importing the package does no work.
    if name == "__version__":
        return _installed_version()
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
