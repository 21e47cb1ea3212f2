"""Helpers on per-stage op lists (``cost_models.schedule.stage_ops``) for the schedule tests."""


def held_peak(ops, released=("bwd",)) -> int:
    """Most (micro-batch, chunk) forwards not yet released at once (by an op of a kind in
    ``released``: the backward, or under a split backward its weight gradients)."""
    live, peak = set(), 0
    for kind, mb, chunk in ops:
        if kind == "fwd":
            live.add((mb, chunk))
            peak = max(peak, len(live))
        elif kind in released:
            live.discard((mb, chunk))
    return peak
