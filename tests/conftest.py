from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for p in (ROOT / "topologies").glob("*/*.yaml") if p.parent.name in ("dtfm", "hetero"))


def small_topology(**overrides) -> dict:
    """A 4-device, 2-region topology document with a tiny model (plans in milliseconds)."""
    doc = {
        "name": "small",
        "devices": [{"name": "fast", "count": 2, "type": "A100-80GB", "region": "east"},
                    {"name": "slow", "count": 2, "type": "T4", "region": "west"}],
        "network": {"region": {"latency": "1ms", "bandwidth": "10Gbps"},
                    "global": {"latency": "20ms", "bandwidth": "1Gbps"}},
        "model": "tiny",
        "training": {"global_batch": 16, "micro_batch_size": 1, "schedule": "1f1b", "precision": "auto"},
    }
    doc.update(overrides)
    return doc


@pytest.fixture
def write_yaml(tmp_path):
    def write(document, name="topology.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(document, sort_keys=False) if not isinstance(document, str) else document)
        return path
    return write


@pytest.fixture
def group_of_one():
    """torch.distributed over gloo with this process alone (its collectives are the identity)."""
    pytest.importorskip("torch")
    import socket

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    yield dist.group.WORLD
    dist.destroy_process_group()
