"""Prediction: the stage model (per-layer work, memory and messages) and ``predict``, which turns a
plan into the simulator's input and the simulation into a ``Prediction``."""
