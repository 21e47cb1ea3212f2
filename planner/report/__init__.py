"""Report: the plan as text, accuracy tables (predicted against measured) and figures."""
