"""Planner for training large models on heterogeneous devices and networks.

Inputs (topology, model, training), the plan file, the search and the ``plan`` command live here;
the formulas and the simulator live in ``cost_models``; the torch runtime in ``planner.runtime``.
"""
