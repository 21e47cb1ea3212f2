import json

import jsonschema
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    assert np.all(job.topology.bandwidth_bytes_per_s > 0)
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
    (lambda d: d["network"]["region"].update(bandwidth="-1Gbps"), "network.region.bandwidth", "cannot read"),
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


def test_yaml_is_loaded_safely(write_yaml):
    with pytest.raises(InputError):
        load_job(write_yaml("devices: !!python/object/apply:os.system ['echo pwned']\nnetwork: {}\n"))


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                     st.text(max_size=12), st.sampled_from(["80GB", "1Gbps", "5ms", "312TFLOPS", "A100-80GB", "tiny"]))
_documents = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(
        ["devices", "network", "model", "training", "name", "count", "type", "region", "host", "latency",
         "bandwidth", "global", "matrix", "memory", "peak_flops", "global_batch", "layers"]), inner, max_size=5)),
    max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=_documents)
def test_random_documents_load_or_fail_cleanly(write_yaml, document):
    path = write_yaml(yaml.safe_dump(document))
    try:
        load_job(path)
    except InputError as error:
        assert "\n" not in str(error)


_paths = st.lists(st.sampled_from(["devices", 0, 1, "network", "region", "global", "training", "model",
                                   "bandwidth", "latency", "count", "type", "global_batch", "memory"]),
                  min_size=1, max_size=3)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=_paths, value=_scalars)
def test_mutated_valid_document_loads_or_fails_cleanly(write_yaml, path, value):
    doc = small_topology()
    node = doc
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return
    try:
        node[path[-1]] = value
    except (TypeError, IndexError):
        return
    try:
        load_job(write_yaml(doc))
    except InputError as error:
        assert "\n" not in str(error)


def test_a_device_count_beyond_the_limit_is_refused_before_anything_is_allocated(write_yaml):
    from planner.inputs.topology import MAX_DEVICES

    doc = small_topology()
    doc["devices"][1]["count"] = MAX_DEVICES  # with the 2 "fast" devices: two over the limit
    with pytest.raises(InputError, match=rf"devices\[1\]\.count.*{MAX_DEVICES + 2}.*{MAX_DEVICES}"):
        load_job(write_yaml(doc))
    doc["devices"][1]["count"] = 10**12  # refused as fast: the count is checked before devices are made
    with pytest.raises(InputError, match="lower the counts"):
        load_job(write_yaml(doc))
