"""Checkpoints that another plan can resume: state kept by parameter name, not by rank.

Every ``checkpoint_every`` iterations the ranks of replica 0 write their stage's parameters, each
under its global name (``blocks.7.fc1.weight``: block indices are global, see ``gpt``), with its
fp32 weight (the master copy when the weights are 16-bit) and its optimizer state. Optimizer state
sharded over a stage's replicas (ZeRO stage 1, ``sharded``) is gathered first, so each parameter's
state is whole in the file whatever the replica count. The tied embedding's second copy on the last
stage is not written (it equals ``embed.weight``) and is loaded from it. A run under any other
layer split or replica count loads, on each rank, the names its stage holds.

Layout of ``DIR``: one folder per checkpoint, ``iteration-00000012`` (the next iteration to run),
holding ``stage{s}.pt`` for each stage of the plan that wrote it and ``checkpoint.json`` (the
iteration, seed, the executed model's shape, the global batch and optimizer, the fp16 loss scale,
the plan). The folder is written as ``.iteration-00000012.partial`` and renamed once every rank has
written, so a run killed mid-save leaves the previous checkpoint as the latest. The last ``KEEP``
checkpoints are kept.

With PowerSGD gradient sync every rank also writes its compressor state,
``powersgd-replica{r}-stage{s}.pt``: per matrix, under its global name (the module's own: the tied
copy is ``head.weight``), this replica's error memory and the warm-started ``Q`` (the same on every
replica), in two sections, the stage's sync and the tied embedding's. A run of the same replica
count and PowerSGD rank continues it (each replica its own error memory, found by name in any
stage's file of that replica, so another layer split keeps it); otherwise, or where a sync's
matrices are not all found under its section (the embedding's copies move between the sections
when a plan goes from one stage to several), the state restarts (zero error memory, ``Q`` from the
seed), said in one line (``load_powersgd``): the error memory is one replica's share of the sum, so
it has no meaning under other replicas. In a tensor group each member compresses its own shards
(``planner.runtime.powersgd``), so each member writes its own file,
``powersgd-replica{r}-stage{s}-member{k}-of{t}.pt``, its shards' state under the unsplit names (the
lead's also holds the whole parameters' matrices); a run continues it with the same replica count,
rank and degree, member by member, and restarts it under another degree (a shard's ``Q`` and error
memory belong to its cut).
"""

import json
import os
import re
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from planner.errors import InputError
from planner.runtime.precision import MasterWeightOptimizer, PlainOptimizer
from planner.runtime.sharded import ShardedOptimizer

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_FILE", "KEEP", "checkpoint_due", "save_checkpoint", "load_checkpoint",
           "read_checkpoint", "check_resumable", "latest_checkpoint", "checkpoint_meta", "load_powersgd",
           "POWERSGD_SECTIONS"]

CHECKPOINT_FORMAT = "hetplan-checkpoint/1"
CHECKPOINT_FILE = "checkpoint.json"
KEEP = 2  # checkpoints kept in the folder (older ones are removed after a new one is complete)
_PREFIX = "iteration-"
_POWERSGD_FILE = re.compile(r"powersgd-replica(\d+)-stage(\d+)(?:-member(\d+)-of(\d+))?\.pt")
POWERSGD_SECTIONS = ("stage", "embedding")  # the stage's sync, the tied embedding's copies' sync
_EMBEDDING = "embed.weight"
_TIED_COPY = "head.weight"
# Model fields that fix the tensors' shapes and meaning (the name may differ: an emulated run's does).
_SHAPE_FIELDS = ("layers", "hidden", "heads", "sequence", "vocabulary", "ffn_hidden", "gated_mlp",
                 "tied_embeddings", "learned_positions", "biases")


def checkpoint_due(iteration: int, every: int) -> bool:
    """Whether a checkpoint follows iteration ``iteration`` (0-based) when saving every ``every``."""
    return every > 0 and (iteration + 1) % every == 0


def _folder_name(iteration: int) -> str:
    return f"{_PREFIX}{iteration:08d}"


def _names(module) -> dict:
    """id(parameter) -> the name it is saved under (the tied copy is saved as the embedding)."""
    names = {}
    for name, parameter in module.named_parameters():
        names[id(parameter)] = _EMBEDDING if (name == _TIED_COPY and module.tied_copy) else name
    return names


def _cpu_state(state: dict) -> dict:
    return {key: (value.detach().float().cpu().clone() if torch.is_tensor(value) else value)
            for key, value in state.items()}


def _plain_entries(part, names: dict) -> dict:
    return {names[id(p)]: {"weight": p.detach().float().cpu().clone(),
                           "state": _cpu_state(part.optimizer.state.get(p, {}))} for p in part.parameters}


def _master_entries(part: MasterWeightOptimizer, names: dict) -> dict:
    entries = {}
    for chunk, masters, optimizer in zip(part.chunks, part.masters, part.optimizers):
        for p, m in zip(chunk, masters):
            entries[names[id(p)]] = {"weight": m.detach().cpu().clone(),
                                     "state": _cpu_state(optimizer.state.get(m, {}))}
    return entries


def _sharded_entries(part: ShardedOptimizer, names: dict) -> dict:
    """Gather every replica's shard of the fp32 master and of each per-element state over the
    stage's group (a collective: every replica calls it), then cut the flat vectors by parameter."""
    states = [optimizer.state.get(m, {}) for optimizer, m in zip(part.optimizers, part.masters)]
    vectors = sorted(k for k, v in states[0].items() if torch.is_tensor(v) and v.shape == part.masters[0].shape)
    scalars = {k: v for k, v in _cpu_state(states[0]).items() if k not in vectors}

    def gathered(pieces: list) -> torch.Tensor:
        own = torch.cat([piece.detach().float().flatten() for piece in pieces])
        parts = [torch.empty_like(own) for _ in range(part.shards)]
        dist.all_gather(parts, own, group=part.group)
        return torch.cat(parts).cpu()

    weight = gathered(part.masters)
    state = {k: gathered([s[k] for s in states]) for k in vectors}
    entries, offset = {}, 0
    for p in part.parameters:
        n = p.numel()
        cut = slice(offset, offset + n)
        entries[names[id(p)]] = {"weight": weight[cut].view(p.shape).clone(),
                                 "state": {**scalars, **{k: v[cut].view(p.shape).clone() for k, v in state.items()}}}
        offset += n
    return entries


def _entries(module, optimizer) -> dict:
    """name -> {"weight": fp32 tensor, "state": {key: tensor or number}} of this rank's parameters."""
    names = _names(module)
    entries = {}
    for part in optimizer.parts:
        if isinstance(part, ShardedOptimizer):
            entries.update(_sharded_entries(part, names))
        elif isinstance(part, MasterWeightOptimizer):
            entries.update(_master_entries(part, names))
        else:
            assert isinstance(part, PlainOptimizer), type(part)
            entries.update(_plain_entries(part, names))
    return entries


def _powersgd_file(replica: int, stage: int, member: int = 0, degree: int = 1) -> str:
    """The file of one rank's PowerSGD state: its replica and stage, and its member of a tensor group
    of ``degree`` above 1."""
    return f"powersgd-replica{replica}-stage{stage}" + (f"-member{member}-of{degree}" if degree > 1 else "") + ".pt"


def _powersgd_files(folder: Path, replica: int, member: int, degree: int) -> list:
    """The PowerSGD files of ``replica``'s ranks at ``member`` of groups of ``degree`` (every stage's)."""
    wanted = (str(replica), str(member) if degree > 1 else None, str(degree) if degree > 1 else None)
    return sorted(path for path in folder.glob("powersgd-*.pt")
                  if (found := _POWERSGD_FILE.fullmatch(path.name)) and found.group(1, 3, 4) == wanted)


def _powersgd_entries(module, powersgd: dict) -> dict:
    """section -> name -> {"error", "q"} (CPU, fp32) of this rank's PowerSGD states."""
    names = {id(p): name for name, p in module.named_parameters()}
    return {section: {names[id(p)]: {"error": e.detach().float().cpu().clone(), "q": q.detach().float().cpu().clone()}
                      for p, e, q in zip(state.matrices, state.errors, state.qs)}
            for section, state in powersgd.items() if state is not None}


def save_checkpoint(folder, *, iteration: int, module, optimizer, rank: int, replica: int, stage: int,
                    meta: dict, tensor=None, powersgd: dict | None = None) -> Path | None:
    """Write the checkpoint before iteration ``iteration`` (every rank calls this: the sharded state
    is gathered and all ranks wait for the files). Rank 0 returns the folder it completed. With
    ``tensor`` (group, degree, lead rank, member) the group's shares are joined whole on its lead,
    which writes them (``planner.runtime.tensor_parallel.join_entries``). ``powersgd`` (section ->
    ``PowerSGD`` or None, ``POWERSGD_SECTIONS``): this rank's compressor state, written by every replica
    (by every member of a group: its shards')."""
    root = Path(folder)
    partial = root / f".{_folder_name(iteration)}.partial"
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    entries = _entries(module, optimizer)
    if tensor is not None:
        from planner.runtime.tensor_parallel import join_entries

        entries = join_entries(entries, *tensor)
    if replica == 0 and entries is not None:
        if module.tied_copy:
            entries.pop(_EMBEDDING, None)  # stage 0 writes it
        torch.save(entries, partial / f"stage{stage}.pt")
    if powersgd and any(state is not None for state in powersgd.values()):  # ``powersgd``: section -> PowerSGD
        member, degree = (tensor[3], tensor[1]) if tensor is not None else (0, 1)
        torch.save(_powersgd_entries(module, powersgd), partial / _powersgd_file(replica, stage, member, degree))
    dist.barrier()
    if rank != 0:
        return None
    scaler = getattr(optimizer, "scaler", None)
    document = {"format": CHECKPOINT_FORMAT, "iteration": iteration, "written_at_unix_s": time.time(), **meta,
                "loss_scale": ({"scale": scaler.scale, "clean_steps": scaler.clean_steps, "skipped": scaler.skipped}
                               if scaler else None),
                "optimizer_state": "gathered over each stage's replicas, whole per parameter"}
    (partial / CHECKPOINT_FILE).write_text(json.dumps(document, indent=1) + "\n")
    final = root / _folder_name(iteration)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    for old in sorted(p for p in root.glob(f"{_PREFIX}*") if (p / CHECKPOINT_FILE).exists())[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_meta(*, seed: int, model, training, plan) -> dict:
    """What ``checkpoint.json`` records besides the iteration: enough to refuse a wrong resume."""
    powersgd = plan.compression.gradients == "powersgd" and plan.replicas > 1  # as the engine builds it
    return {"seed": seed, "model": asdict(model),
            "training": {"global_batch": training.global_batch, "optimizer": training.optimizer},
            "plan": {"layer_bounds": list(plan.layer_bounds), "assignment": [list(r) for r in plan.assignment]},
            "powersgd": {"replicas": plan.replicas, "rank": plan.compression.rank} if powersgd else None}


def latest_checkpoint(folder) -> Path | None:
    """The newest complete checkpoint in ``folder`` (or ``folder`` itself when it is one), or None."""
    path = Path(folder)
    if (path / CHECKPOINT_FILE).exists():
        return path
    done = sorted(p for p in path.glob(f"{_PREFIX}*") if (p / CHECKPOINT_FILE).exists())
    return done[-1] if done else None


def read_checkpoint(folder) -> tuple:
    """(the checkpoint folder to load, its ``checkpoint.json``) for ``--resume FOLDER``."""
    path = Path(folder)
    if not path.is_dir():
        raise InputError("is not a folder: pass the --checkpoint-dir of an earlier run", source=str(path),
                         field="--resume")
    found = latest_checkpoint(path)
    if found is None:
        raise InputError(f"holds no complete checkpoint ({_PREFIX}*/{CHECKPOINT_FILE}): pass the --checkpoint-dir "
                         "of a run that reached --checkpoint-every iterations", source=str(path), field="--resume")
    source = str(found / CHECKPOINT_FILE)
    try:
        document = json.loads((found / CHECKPOINT_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"not a checkpoint file ({error.__class__.__name__})", source=source) from None
    if not isinstance(document, dict) or document.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"format is not {CHECKPOINT_FORMAT}: resume with the version that wrote it",
                         source=source, field="format")
    meta = document.get("plan", {})
    # one file per stage (an interleaved plan's layer_bounds split the model into more pieces than stages)
    stages = len(meta["assignment"][0]) if meta.get("assignment") else len(meta.get("layer_bounds", [])) - 1
    missing = [s for s in range(max(stages, 0)) if not (found / f"stage{s}.pt").exists()]
    if stages < 1 or missing:
        raise InputError(f"stage{missing[0] if missing else 0}.pt is missing: the checkpoint is incomplete; resume "
                         "from another one", source=source, field="plan.layer_bounds")
    return found, document


def check_resumable(document: dict, source: str, *, model, training, seed: int) -> None:
    """Refuse, naming the field, a checkpoint whose model shape, global batch, optimizer or data seed
    differs from the run resuming it (``model`` is the model the run executes)."""
    saved = document.get("model", {})
    new = asdict(model)
    for name in _SHAPE_FIELDS:
        if saved.get(name) != new[name]:
            raise InputError(f"the checkpoint's model has {name} {saved.get(name)!r} but this run's has {new[name]!r}: "
                             "resume with a plan of the same model (emulated runs resume emulated runs)",
                             source=source, field=f"model.{name}")
    for name in ("global_batch", "optimizer"):
        was, now = document.get("training", {}).get(name), getattr(training, name)
        if was != now:
            raise InputError(f"the checkpoint was trained with {name} {was!r} but this plan has {now!r}: resume "
                             "with a plan of the same training", source=source, field=f"training.{name}")
    if document.get("seed") != seed:
        raise InputError(f"the checkpoint's data and weights came from seed {document.get('seed')}, not {seed}: "
                         f"pass --seed {document.get('seed')}", source=source, field="--seed")


def _load_state(optimizer, key_tensor: torch.Tensor, state: dict) -> None:
    """Put ``state`` (CPU, fp32) into ``optimizer`` for ``key_tensor``, on its device."""
    if not state:
        return
    on_device = bool(optimizer.defaults.get("fused") or optimizer.defaults.get("capturable"))
    loaded = {}
    for key, value in state.items():
        if torch.is_tensor(value) and value.dim() > 0:
            loaded[key] = value.to(device=key_tensor.device, dtype=torch.float32).view_as(key_tensor).clone()
        elif torch.is_tensor(value):
            loaded[key] = value.to(key_tensor.device) if on_device else value.clone()
        else:
            loaded[key] = value
    optimizer.state[key_tensor] = loaded


def _read_entries(folder: Path, wanted: set) -> dict:
    entries = {}
    for path in sorted(folder.glob("stage*.pt")):
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        entries.update({name: saved[name] for name in wanted & set(saved)})
    return entries


@torch.no_grad()
def load_checkpoint(folder, document: dict, *, module, optimizer, tensor=None) -> int:
    """Load this rank's parameters and their optimizer state from checkpoint ``folder`` into
    ``module`` and ``optimizer`` (built for any plan of the same model); returns the iteration to run
    next. With ``tensor`` (member, degree) the split tensors are cut to this member's share."""
    folder = Path(folder)
    names = _names(module)
    entries = _read_entries(folder, set(names.values()))
    if tensor is not None:
        from planner.runtime.tensor_parallel import split_entries

        entries = split_entries(entries, *tensor)
    for name, parameter in module.named_parameters():
        key = names[id(parameter)]
        if key not in entries:
            raise InputError(f"holds no {key}: it was written for another model", source=str(folder),
                             field="model.layers")
        weight = entries[key]["weight"]
        if tuple(weight.shape) != tuple(parameter.shape):
            raise InputError(f"{key} has shape {tuple(weight.shape)}, this run's {tuple(parameter.shape)}: resume "
                             "with the same model", source=str(folder), field="model")
        parameter.copy_(weight.to(parameter.dtype))
    for part in optimizer.parts:
        if isinstance(part, ShardedOptimizer):
            _load_sharded(part, names, entries)
        elif isinstance(part, MasterWeightOptimizer):
            for chunk, masters, opt in zip(part.chunks, part.masters, part.optimizers):
                for p, m in zip(chunk, masters):
                    entry = entries[names[id(p)]]
                    m.copy_(entry["weight"])
                    _load_state(opt, m, entry["state"])
        else:
            for p in part.parameters:
                _load_state(part.optimizer, p, entries[names[id(p)]]["state"])
    scaler = getattr(optimizer, "scaler", None)
    if scaler is not None and document.get("loss_scale"):
        saved = document["loss_scale"]
        scaler.scale, scaler.clean_steps, scaler.skipped = float(saved["scale"]), saved["clean_steps"], saved["skipped"]
    return int(document["iteration"])


def _load_sharded(part: ShardedOptimizer, names: dict, entries: dict) -> None:
    """Lay the per-parameter weights and state out flat as the sharded optimizer does, keep this
    rank's shard, and give each chunk its piece."""
    padded = part.shard_numel * part.shards
    first = entries[names[id(part.parameters[0])]]["state"]
    vectors = [k for k, v in first.items() if torch.is_tensor(v) and v.dim() > 0]
    scalars = {k: v for k, v in first.items() if k not in vectors}
    weight = torch.zeros(padded)
    state = {k: torch.zeros(padded) for k in vectors}
    offset = 0
    for p in part.parameters:
        entry, n = entries[names[id(p)]], p.numel()
        weight[offset:offset + n] = entry["weight"].flatten()
        for k in vectors:
            state[k][offset:offset + n] = entry["state"][k].flatten()
        offset += n
    for chunk, master, optimizer in zip(part.chunks, part.masters, part.optimizers):
        master.copy_(weight[part.own][chunk])
        _load_state(optimizer, master, {**scalars, **{k: v[part.own][chunk] for k, v in state.items()}})


@torch.no_grad()
def load_powersgd(folder, document: dict, *, module, powersgd: dict, replica: int, plan, tensor=None) -> str:
    """Continue this rank's PowerSGD states (section -> ``PowerSGD`` or None) from checkpoint
    ``folder``: its replica's error memory and the ``Q`` of each matrix, found by name (with
    ``tensor``, (member, degree), in that member's files of groups of that degree). Returns ""
    when every state continued, else why the checkpoint's state is not used (the states that could
    not continue are reset). Every rank decides alike from ``document`` and the plans."""
    states = {section: state for section, state in powersgd.items() if state is not None and state.matrices}
    saved = document.get("powersgd")
    replicas = plan.replicas if plan.compression.gradients == "powersgd" else None
    if (replicas or 0) < 2:
        return "" if saved is None else "the checkpoint's PowerSGD state is not used: this plan has no replica sync to compress"
    if saved is None:
        why = "the checkpoint holds no PowerSGD state (written without PowerSGD or by one replica)"
    elif saved["replicas"] != replicas:
        why = (f"the checkpoint's error memory is that of {saved['replicas']} replicas, this plan has {replicas} "
               "(each replica's memory is its share of the sum)")
    elif saved["rank"] != plan.compression.rank:
        why = f"the checkpoint's PowerSGD rank is {saved['rank']}, this plan's {plan.compression.rank}"
    else:
        files = _powersgd_files(Path(folder), replica, *(tensor or (0, 1)))
        found = {section: {} for section in POWERSGD_SECTIONS}
        for path in files:
            for section, entries in torch.load(path, map_location="cpu", weights_only=True).items():
                found[section].update(entries)
        names = {id(p): name for name, p in module.named_parameters()}
        lost = 0
        for section, state in states.items():
            wanted = [names[id(p)] for p in state.matrices]
            entries = found[section]
            if not all(name in entries and entries[name]["q"].shape == q.shape
                       and entries[name]["error"].shape == e.shape for name, e, q in zip(wanted, state.errors, state.qs)):
                state.reset()
                lost += 1
                continue
            for name, e, q in zip(wanted, state.errors, state.qs):
                e.copy_(entries[name]["error"])
                q.copy_(entries[name]["q"])
        return ("" if not lost else "PowerSGD's syncs whose matrices the checkpoint holds under another sync (the "
                "tied embedding's, one stage against several) or another tensor degree start afresh (zero error "
                "memory, Q from the seed)")
    for state in states.values():
        state.reset()
    return f"PowerSGD starts afresh (zero error memory, Q from the seed): {why}"
