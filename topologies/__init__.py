"""Data only: device catalog, model presets and shipped topologies (no code lives here)."""
