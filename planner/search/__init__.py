"""Search for the fastest plan: constructive heuristics, exact layer/batch balancing, local search,
CP-SAT models and bounds, behind one front door (``planner.search.front.search``)."""
