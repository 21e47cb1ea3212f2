"""The lower bound's term for stages that each compute, then synchronise (``planner.search.bounds``).

Every stage's gradient sync starts after every replica's last backward on it (``cost_models.simulator``:
the sync of stage ``s`` waits for all ``D`` replicas' ``sync`` ops, each after the replica's last
compute op on the stage), so a stage of ``l`` blocks takes at least ``l (max_r b_r w / v_r + y)``:
replica ``r`` runs its ``b_r`` sequences' forward and backward of the ``l`` blocks (``w`` FLOPs a
block and sequence) on its cell of speed ``v_r``, then the stage's sync sends at least ``y`` seconds
of each block's gradients (the block's least sync bytes over the fastest ring: the bound's sync
term per block). With ``max_r b_r / v_r >= B / V_s`` (``B = sum_r b_r``, ``V_s = sum_r v_r``, the
stage's cells' speed), ``l_s <= T g(V_s)`` with ``g(V) = V / (B w + y V)``, concave, so the ``L``
blocks over ``S`` stages of cells of total speed ``V`` (``sum_s V_s``) need
``L <= T S g(V / S)``:

    T >= L B w / V + L y / S

the blocks' work over the cells' speed plus an average stage's sync, one after the other.
"""

__all__ = ["stage_split_s"]


def stage_split_s(block_flops, cells_flops, every_block_sync_s, stages: int):
    """Seconds at least of any plan of ``stages`` stages (module description): ``block_flops`` (the
    blocks' FLOPs, every sequence: ``L B w``) over ``cells_flops`` (the most FLOP/s the plan's cells
    reach together, ``V``) plus ``every_block_sync_s`` (``L y``: every block's least sync) over the
    stages; numbers or arrays that broadcast."""
    return block_flops / cells_flops + every_block_sync_s / stages
