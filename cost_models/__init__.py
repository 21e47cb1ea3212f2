"""Pure cost formulas (FLOPs, memory, communication), the pipeline op lists and the event simulator.

Nothing here reads files or knows about YAML: every function takes plain numbers or arrays in SI
units and cites the formula it implements.
"""
