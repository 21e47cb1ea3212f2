"""The plan: its types (degrees, schedule, sync, ``Plan``, ``Prediction``), ``validate_plan`` and the
plan file (``document``)."""
