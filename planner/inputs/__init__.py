"""Inputs: units, the device catalog, model and training specs, the topology, calibration files, and
``load_job``, which reads a topology file into its three slices (topology, model, training)."""
