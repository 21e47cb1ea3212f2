import json

import jsonschema
import numpy as np
import pytest
import yaml

from planner.inputs.catalog import load_catalog
from planner.errors import InputError
from planner.inputs.job import load_job

from conftest import ROOT, SHIPPED, small_topology

SCHEMA = json.loads((ROOT / "planner" / "schema" / "topology.schema.json").read_text())


def test_catalog_has_the_required_types_with_sources():
    catalog = load_catalog()
    for name in ("V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-SXM", "A40", "L4", "T4", "RTX-3090",
                 "RTX-4090"):
        assert name in catalog and catalog[name].source and catalog[name].efficiency_origin
    assert catalog["A100-80GB"].peak_flops["bf16"] == 312e12


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_topology_loads_and_matches_the_schema(path):
    job = load_job(path)
    assert job.topology.size >= 2
    assert np.all(np.asarray(job.topology.bandwidth_bytes_per_s) > 0)
    jsonschema.validate(yaml.safe_load(path.read_text()), SCHEMA)


def test_shipped_set_has_dtfm_cases_and_heterogeneous_ones():
    names = {p.parent.name for p in SHIPPED}
    assert sum(p.parent.name == "dtfm" for p in SHIPPED) == 5
    assert sum(p.parent.name == "hetero" for p in SHIPPED) >= 3 and names == {"dtfm", "hetero"}


def test_dtfm_case5_numbers():
    t = load_job(next(p for p in SHIPPED if "case5" in p.name)).topology
    assert t.size == 64
    seoul, london = t.index("seoul-0"), t.index("london-0")
    assert t.latency_s[seoul, london] == pytest.approx(0.238)
    assert t.bandwidth_bytes_per_s[seoul, london] == pytest.approx(0.342e9 / 8)
    assert t.latency_s[seoul, t.index("seoul-5")] == pytest.approx(0.005)


def test_asymmetric_links_and_nics(write_yaml):
    doc = small_topology(network={
        "region": {"latency": "1ms", "bandwidth": "10Gbps"},
        "region_pairs": [{"from": "east", "to": "west", "latency": "60ms", "bandwidth": "0.15Gbps"},
                         {"from": "west", "to": "east", "latency": "60ms", "bandwidth": "1.17Gbps"}],
        "nics": [{"host": "fast-0", "egress": "1Gbps", "ingress": "10Gbps"}]})
    t = load_job(write_yaml(doc)).topology
    east, west = t.index("fast-0"), t.index("slow-0")
    assert t.bandwidth_bytes_per_s[east, west] == pytest.approx(0.15e9 / 8)
    assert t.bandwidth_bytes_per_s[west, east] == pytest.approx(1.17e9 / 8)
    assert t.nic_of("fast-0") == (1e9 / 8, 10e9 / 8)


def test_matrix_network(write_yaml):
    doc = small_topology(network={"matrix": {
        "latency_unit": "ms", "bandwidth_unit": "Gbps",
        "latency": [[0, 1, 2, 3], [1, 0, 1, 1], [2, 1, 0, 1], [3, 1, 1, 0]],
        "bandwidth": [[0, 8, 8, 8], [16, 0, 8, 8], [8, 8, 0, 8], [8, 8, 8, 0]]}})
    t = load_job(write_yaml(doc)).topology
    assert t.bandwidth_bytes_per_s[1, 0] == 2e9 and t.bandwidth_bytes_per_s[0, 1] == 1e9
    assert t.latency_s[0, 3] == pytest.approx(0.003)


BAD = [
    (lambda d: d.pop("devices"), "devices", "is missing"),
    (lambda d: d["devices"][0].update(type="A100-90GB"), "devices[0].type", "unknown device type"),
    (lambda d: d["devices"][0].update(colour="red"), "devices[0]", "unknown key 'colour'"),
    (lambda d: d["network"]["region"].update(bandwidth="10gbps"), "network.region.bandwidth", "did you mean"),
    (lambda d: d["network"]["region"].update(bandwidth="-1Gbps"), "network.region.bandwidth", "is negative"),
    (lambda d: d["network"]["region"].update(bandwidth="0Gbps"), "network.region.bandwidth", "greater than zero"),
    (lambda d: d["network"].pop("global"), "network.global", "no link"),
    (lambda d: d["network"].update(matrix={"latency": [[0]], "bandwidth": [[0]]}), "network.matrix.latency",
     "must be 4 x 4"),
    (lambda d: d.update(model="gpt5"), "model", "unknown model preset"),
    (lambda d: d["training"].pop("global_batch"), "training.global_batch", "is missing"),
    (lambda d: d["training"].update(global_batch=10, micro_batch_size=4), "training.micro_batch_size", "not a multiple"),
    (lambda d: d["training"].update(schedule="zigzag"), "training.schedule", "not one of"),
    (lambda d: d["training"].update(micro_batch=2), "training.micro_batch", "now called 'micro_batch_size'"),
    (lambda d: d.update(extra=1), None, "unknown top-level key"),
    (lambda d: d["devices"][1].update(name="fast"), "devices", "appears twice"),
    (lambda d: d["devices"][0].update(memory="1GB", memory_reserved="2GB"), "devices[0]", "memory_reserved"),
]


@pytest.mark.parametrize("mutate, field, fragment", BAD, ids=[b[2] for b in BAD])
def test_bad_input_is_one_clear_error(write_yaml, mutate, field, fragment):
    doc = small_topology()
    mutate(doc)
    path = write_yaml(doc)
    with pytest.raises(InputError) as info:
        load_job(path)
    message = str(info.value)
    assert str(path) in message and fragment in message and "\n" not in message
    if field:
        assert field in message


def test_unreadable_files(write_yaml, tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_job(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="not valid YAML at line"):
        load_job(write_yaml("devices: [\n  - {name: a\n"))
    with pytest.raises(InputError, match="expected a mapping"):
        load_job(write_yaml("- 1\n- 2\n"))
    with pytest.raises(InputError, match="cannot read"):
        load_job(tmp_path)


def test_yaml_is_loaded_safely(write_yaml, tmp_path):
    """A python tag is refused, not run: with an unsafe loader the file would create ``marker``."""
    marker = tmp_path / "created-by-the-file"
    path = write_yaml(f"devices: !!python/object/apply:builtins.open [{str(marker)!r}, w]\nnetwork: {{}}\n")
    with pytest.raises(InputError, match=r"field 'devices': not valid YAML at line 1, .*could not determine"):
        load_job(path)
    assert not marker.exists()


def test_region_pairs_take_symmetric_like_pairs(write_yaml):
    doc = small_topology()
    doc["network"]["region_pairs"] = [{"from": "east", "to": "west", "symmetric": True, "latency": "60ms",
                                       "bandwidth": "0.15Gbps"}]
    t = load_job(write_yaml(doc)).topology
    east, west = t.index("fast-0"), t.index("slow-0")
    assert t.bandwidth_bytes_per_s[east, west] == t.bandwidth_bytes_per_s[west, east] == pytest.approx(0.15e9 / 8)
    doc["network"]["region_pairs"][0]["symmetric"] = False
    t = load_job(write_yaml(doc)).topology
    assert t.bandwidth_bytes_per_s[west, east] == pytest.approx(1e9 / 8)  # the global level


def test_levels_and_region_pairs_give_each_device_pair_its_link(write_yaml):
    """Links come from a region table; each device pair gets the level its hosts and regions say."""
    doc = small_topology()
    doc["devices"] = [{"name": "a", "count": 4, "type": "T4", "gpus_per_host": 2, "region": "r0"},
                      {"name": "b", "count": 3, "type": "T4", "region": "r1"},
                      {"name": "c", "count": 2, "type": "T4", "host": "shared", "region": "r2"}]
    doc["network"] = {"host": {"latency": "0.01ms", "bandwidth": "100Gbps"},
                      "region": {"latency": "1ms", "bandwidth": "10Gbps"},
                      "global": {"latency": "50ms", "bandwidth": "1Gbps"},
                      "region_pairs": [{"regions": ["r0", "r1"], "latency": "5ms", "bandwidth": "5Gbps"},
                                       {"from": "r2", "to": "r0", "latency": "7ms", "bandwidth": "7Gbps"},
                                       {"from": "r1", "to": "r1", "latency": "2ms", "bandwidth": "2Gbps"}]}
    t = load_job(write_yaml(doc)).topology
    pairs = {("r0", "r1"): 5, ("r1", "r0"): 5, ("r2", "r0"): 7, ("r1", "r1"): 2}
    for i, a in enumerate(t.devices):
        for j, b in enumerate(t.devices):
            if i == j:
                continue
            if a.host == b.host:
                expected = 100
            elif (a.region, b.region) in pairs:
                expected = pairs[a.region, b.region]
            else:
                expected = 10 if a.region == b.region else 1
            assert t.bandwidth_bytes_per_s[i, j] == pytest.approx(expected * 1e9 / 8), (a.name, b.name)


def test_region_pairs_cost_no_work_per_device_pair():
    """1,504 devices and 1,000 region pairs: each entry is O(1), not a pass over the N x N matrices
    (the per-pair mask loop took ~10 s here; the whole parse now takes well under a second)."""
    import time

    from planner.inputs.topology import parse_topology

    regions = 60
    devices = [{"name": f"h{h}", "count": 8, "type": "T4", "host": f"host{h}", "region": f"r{h % regions}"}
               for h in range(188)]
    pairs = [{"regions": [f"r{a}", f"r{b}"], "latency": "50ms", "bandwidth": "2Gbps"}
             for a in range(regions) for b in range(a + 1, regions)][:1000]
    network = {"host": {"latency": "0.01ms", "bandwidth": "100Gbps"}, "region": {"latency": "1ms", "bandwidth": "10Gbps"},
               "global": {"latency": "100ms", "bandwidth": "1Gbps"}}
    started = time.perf_counter()
    parse_topology({"devices": devices, "network": network})
    without = time.perf_counter() - started
    started = time.perf_counter()
    parse_topology({"devices": devices, "network": {**network, "region_pairs": pairs}})
    assert time.perf_counter() - started < without + 1.5


def test_a_device_count_beyond_the_limit_is_refused_before_anything_is_allocated(write_yaml):
    from planner.inputs.topology import MAX_DEVICES

    doc = small_topology()
    doc["devices"][1]["count"] = MAX_DEVICES  # with the 2 "fast" devices: two over the limit
    with pytest.raises(InputError, match=rf"devices\[1\]\.count.*{MAX_DEVICES + 2}.*{MAX_DEVICES}"):
        load_job(write_yaml(doc))
    doc["devices"][1]["count"] = 10**12  # refused as fast: the count is checked before devices are made
    with pytest.raises(InputError, match="lower the counts"):
        load_job(write_yaml(doc))
