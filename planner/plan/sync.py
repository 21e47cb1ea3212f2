"""The plan's gradient sync (``cost_models.network.Sync``): which algorithms a job may use, and
which plan features each one combines with.

Every algorithm sums whole gradients; ZeRO stage 1 replaces that sum with a reduce-scatter (which
a ring or DTFM's sharded exchange is, in its first half, but a parameter server or a two-level
all-reduce is not), PowerSGD all-reduces its low-rank factors, and local steps all-reduce
parameter deltas: those run as ring all-reduces, so they go with ``ring`` (ZeRO stage 1 also with
``sharded``) only.
"""

from cost_models.network import Sync

__all__ = ["SYNC_CHOICES", "AUTO", "syncs_for", "sync_problem"]

AUTO = "auto"
SYNC_CHOICES = tuple(str(s) for s in Sync) + (AUTO,)
_WHOLE_GRADIENTS = (Sync.RING, Sync.SHARDED)  # the algorithms whose first half is a reduce-scatter


def syncs_for(training, replicas: int) -> tuple:
    """The algorithms a plan of ``replicas`` replicas for ``training`` may use: ``training.sync``,
    or with ``auto`` every one that the job's other features allow."""
    asked = training.sync
    if asked != AUTO:
        return (Sync(asked),)
    return tuple(s for s in Sync if _conflict(s, training, replicas) is None)


def _conflict(sync: Sync, training, replicas: int) -> tuple | None:
    """(field, why) where ``sync`` cannot run with ``training``'s other choices; None if it can."""
    if sync == Sync.RING or replicas <= 1:
        return None
    if training.sync_every > 1:
        return ("sync", f"is {sync}, but sync_every {training.sync_every} averages parameter deltas by a ring "
                        "all-reduce: set sync ring (or auto), or sync_every 1")
    if str(training.compress_gradients) == "powersgd":
        return ("sync", f"is {sync}, but compress_gradients powersgd all-reduces its low-rank factors by ring: set "
                        "sync ring (or auto), or compress_gradients off")
    if sync not in _WHOLE_GRADIENTS and training.shard_optimizer is True:
        return ("sync", f"is {sync}, which sums whole gradients at one device per group, but shard_optimizer is true "
                        "(a reduce-scatter): set sync ring, sharded or auto, or shard_optimizer false")
    return None


def sync_problem(plan, training) -> tuple | None:
    """(plan field, one line) of what is wrong with ``plan``'s sync for ``training``; None if nothing."""
    asked = training.sync
    if asked != AUTO and Sync(asked) != plan.sync:
        return ("sync", f"is {plan.sync} but training.sync is {asked}: make both agree or plan again")
    if plan.sync == Sync.PARAMETER_SERVER:
        if len(plan.sync_servers) != plan.stages or any(not 0 <= r < plan.replicas for r in plan.sync_servers):
            return ("stages.server", "a parameter-server sync needs each stage's server, one of the stage's devices: "
                                     "add server: DEVICE to every stage, or plan again")
    elif plan.sync_servers:
        return ("stages.server", f"names servers, but the sync is {plan.sync}: drop server or set sync "
                                 f"{Sync.PARAMETER_SERVER}")
    conflict = _conflict(plan.sync, training, plan.replicas)
    return conflict
