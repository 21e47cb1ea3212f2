"""A catalogue of bad inputs: each is refused with one line naming the file and the field, exit code 2.

Every case starts from the small valid topology of ``conftest.small_topology`` (or writes the file's
text directly, for YAML-level mistakes and special files) and states where the message must point:
a field path, or for mistakes below the level of fields (syntax, tags, nesting) the line.
"""

import copy
import os
from dataclasses import dataclass
from typing import Callable

import pytest
import yaml

from planner.cli import main
from planner.errors import InputError
from planner.inputs.job import load_job
from planner.inputs.model import MAX_GLOBAL_BATCH
from planner.inputs.topology import MAX_DEVICES
from planner.io import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES

from conftest import small_topology


@dataclass(frozen=True)
class Case:
    name: str
    write: Callable  # tmp_path -> path of the bad file
    where: str | None  # field path (or "line N") the message must name; None: the file alone locates it
    fragment: str  # what the message must say


def _edit(mutate):
    def write(tmp_path):
        document = copy.deepcopy(small_topology())
        mutate(document)
        path = tmp_path / "topology.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path
    return write


def _text(text, name="topology.yaml"):
    def write(tmp_path):
        path = tmp_path / name
        path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
        return path
    return write


def _valid_text() -> str:
    return yaml.safe_dump(small_topology(), sort_keys=False)


def _with_line(old: str, new: str):
    """The valid file's text with one line replaced (tags and duplicate keys cannot come from a dict)."""
    text = _valid_text()
    assert old in text, old
    return _text(text.replace(old, new, 1))


def _mutation(function):
    """Marks an edit of the valid document (the test writes the edited file)."""
    function.mutation = True
    return function


def _set(*keys, value):
    @_mutation
    def mutate(document):
        node = document
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return mutate


def _drop(*keys):
    @_mutation
    def mutate(document):
        node = document
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
    return mutate


def _rename(*keys):
    """The key at ``keys[:-1]`` renamed to ``keys[-1]`` (a misspelling), its value kept."""
    @_mutation
    def mutate(document):
        node = document
        for key in keys[:-2]:
            node = node[key]
        node[keys[-1]] = node.pop(keys[-2])
    return mutate


def _network(network):
    return _set("network", value=network)


_LEVELS = {"region": {"latency": "1ms", "bandwidth": "10Gbps"}, "global": {"latency": "20ms", "bandwidth": "1Gbps"}}


def _pairs(*entries):
    return _network({**_LEVELS, "region_pairs": list(entries)})


def _matrix(**fields):
    base = {"latency": [[0, 1, 2, 3], [1, 0, 1, 1], [2, 1, 0, 1], [3, 1, 1, 0]],
            "bandwidth": [[0, 8, 8, 8], [8, 0, 8, 8], [8, 8, 0, 8], [8, 8, 8, 0]]}
    return _network({"matrix": {**base, **fields}})


def _cell(key, value):
    @_mutation
    def mutate(document):
        _matrix()(document)
        document["network"]["matrix"][key][0][1] = value
    return mutate


def _nested(depth: int) -> str:
    return "devices: " + "[" * depth + "]" * depth + "\nnetwork: {}\n"


def _fifo(tmp_path):
    path = tmp_path / "topology.fifo"
    os.mkfifo(path)
    return path


def _too_large(tmp_path):
    path = tmp_path / "topology.yaml"
    padding = "# " + "x" * 1000 + "\n"
    path.write_text(_valid_text() + padding * (MAX_FILE_BYTES // len(padding) + 1))
    return path


def _alias_bomb() -> str:
    """Six lines that expand to 1.1 million values; a5 (the first key checked) is the one too big."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for level in range(1, 6):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def _device(**fields):
    return _set("devices", 0, value={"name": "fast", "count": 2, "type": "A100-80GB", "region": "east", **fields})


CASES = [
    # the file itself
    Case("missing file", lambda tmp: tmp / "nope.yaml", None, "file not found"),
    Case("a directory", lambda tmp: tmp, None, "cannot read it"),
    Case("a FIFO", _fifo, None, "not a regular file"),
    Case("/dev/zero", lambda tmp: "/dev/zero", None, "not a regular file"),
    Case("over the size limit", _too_large, None, f"{MAX_FILE_BYTES // 2**20} MiB limit"),
    Case("not UTF-8", _text(b"devices: \xff\xfe\n"), None, "UTF-8"),
    Case("empty file", _text(""), None, "the file is empty"),
    Case("comments only", _text("# a topology, later\n"), None, "the file is empty"),
    Case("a list at the top", _text("- 1\n- 2\n"), None, "expected a mapping"),
    Case("a scalar at the top", _text("hello\n"), None, "expected a mapping"),
    # YAML below the level of fields
    Case("unclosed bracket", _text("devices: [\n  - {name: a\n"), "line 2", "not valid YAML"),
    Case("tab indentation", _text("devices:\n\t- name: a\n"), "line 2", "not valid YAML"),
    Case("!!float abc", _with_line("global_batch: 16", "global_batch: !!float abc"), "training.global_batch",
         "cannot read 'abc' as float"),
    Case("!!int abc", _with_line("global_batch: 16", "global_batch: !!int abc"), "training.global_batch",
         "cannot read 'abc' as int"),
    Case("!!bool maybe", _with_line("schedule: 1f1b", "schedule: !!bool maybe"), "training.schedule",
         "cannot read 'maybe' as bool"),
    Case("!!timestamp 2020-13-45", _with_line("name: small", "name: !!timestamp 2020-13-45"), "name",
         "as timestamp"),
    Case("!!binary not base64", _with_line("name: small", "name: !!binary abc"), "name", "base64"),
    Case("python object tag", _text("devices: !!python/object/apply:os.system ['true']\nnetwork: {}\n"),
         "devices", "could not determine a constructor"),
    Case("nesting 40 deep", _text(_nested(40)), "line 1", f"nests deeper than {MAX_DEPTH} levels"),
    Case("nesting 5,000 deep", _text(_nested(5000)), "line 1", "nests deeper"),
    Case("nesting 100,000 deep unclosed", _text("devices: " + "[" * 100_000), "line 1", "nests deeper"),
    Case("block nesting 200 deep", _text("devices:\n" + "".join(" " * i + "-\n" for i in range(1, 200))),
         "line 33", "nests deeper"),
    Case("alias bomb", _text(_alias_bomb()), "a5", "expands to more than"),
    Case("too many values", _text("devices: [" + "0, " * MAX_VALUES + "]\nnetwork: {}\n"), "line 1",
         f"holds more than {MAX_VALUES:,} values"),
    Case("duplicate top-level key", _text(_valid_text() + "name: other\n"), "name", "appears twice"),
    Case("duplicate key in a device", _with_line("count: 2", "count: 2\n  count: 3"), "devices[0].count",
         "appears twice"),
    Case("duplicate key in a link", _with_line("bandwidth: 10Gbps", "bandwidth: 10Gbps\n    bandwidth: 1Gbps"),
         "network.region.bandwidth", "appears twice"),
    Case("duplicate key in training", _with_line("global_batch: 16", "global_batch: 16\n  global_batch: 32"),
         "training.global_batch", "appears twice"),
    # top level
    Case("unknown top-level key", _set("extra", value=1), "extra", "unknown top-level key"),
    Case("top-level key misspelled", _rename("network", "netwrok"), "netwrok", "did you mean 'network'?"),
    Case("topology name a list", _set("name", value=["a"]), "name", "non-empty string"),
    Case("devices missing", _drop("devices"), "devices", "is missing"),
    Case("network missing", _drop("network"), "network", "is missing"),
    # devices
    Case("devices a number", _set("devices", value=5), "devices", "non-empty list"),
    Case("devices empty", _set("devices", value=[]), "devices", "non-empty list"),
    Case("device a number", _set("devices", 0, value=1), "devices[0]", "expected a mapping"),
    Case("unknown device key", _set("devices", 0, "colour", value="red"), "devices[0]", "unknown key 'colour'"),
    Case("device key misspelled", _device(price_per_hour=1.2), "devices[0]",
         "did you mean 'price_per_hour_usd'?"),  # a key read only where present is known too
    Case("peak_flops misspelled", _set("devices", 0, value={"name": "c", "peak_flop": "80TFLOPS", "memory": "24GB"}),
         "devices[0].peak_flops", "(the file has 'peak_flop': a misspelling of it?)"),
    Case("type misspelled", _set("devices", 0, value={"name": "c", "typ": "A100-80GB"}),
         "devices[0].peak_flops", "(the file has 'typ': a misspelling of it?)"),
    Case("unknown device type", _set("devices", 0, "type", value="A100-90GB"), "devices[0].type",
         "unknown device type 'A100-90GB' (did you mean 'A100-80GB'?)"),
    Case("device type in lower case", _set("devices", 0, "type", value="a40"), "devices[0].type",
         "(did you mean 'A40'? type names are case-sensitive)"),
    Case("device type far from any", _set("devices", 0, "type", value="Quantum-9000"), "devices[0].type",
         "unknown device type 'Quantum-9000': use one of"),
    Case("neither name nor type", _set("devices", 0, value={"count": 1, "region": "east"}), "devices[0]",
         "give a name or a type"),
    Case("count 0", _set("devices", 0, "count", value=0), "devices[0].count", "at least 1"),
    Case("count -1", _set("devices", 0, "count", value=-1), "devices[0].count", "at least 1"),
    Case("count text", _set("devices", 0, "count", value="two"), "devices[0].count", "whole number"),
    Case("count 1.5", _set("devices", 0, "count", value=1.5), "devices[0].count", "whole number"),
    Case("count true", _set("devices", 0, "count", value=True), "devices[0].count", "whole number"),
    Case("count a million", _set("devices", 0, "count", value=10**6), "devices[0].count", f"{MAX_DEVICES}"),
    Case("count 10**12", _set("devices", 0, "count", value=10**12), "devices[0].count", "lower the counts"),
    Case("counts past the limit together", _set("devices", 1, "count", value=MAX_DEVICES - 1), "devices[1].count",
         f"{MAX_DEVICES + 1}"),
    Case("gpus_per_host -1", _set("devices", 0, "gpus_per_host", value=-1), "devices[0].gpus_per_host",
         "at least 0"),
    Case("name a list", _set("devices", 0, "name", value=["fast"]), "devices[0].name", "non-empty string"),
    Case("name empty", _set("devices", 0, "name", value=""), "devices[0].name", "non-empty string"),
    Case("duplicate device names", _set("devices", 1, "name", value="fast"), "devices[1].name", "appears twice"),
    Case("generated name taken", _mutation(lambda d: d["devices"].append(
        {"name": "fast-1", "type": "T4", "region": "west"})), "devices[2].name", "'fast-1' appears twice"),
    Case("two unnamed entries of one type", _set("devices", value=[{"type": "T4", "region": "east"},
                                                                   {"type": "T4", "region": "west"}]),
         "devices[1].type", "'T4' appears twice"),
    Case("memory without unit", _device(memory=80), "devices[0].memory", "has no unit"),
    Case("memory in gb", _device(memory="80gb"), "devices[0].memory", "did you mean 'GB'"),
    Case("memory 1e30GB", _device(memory="1e30GB"), "devices[0].memory", "lies outside 1 B to 1 EB"),
    Case("memory_reserved above memory", _device(memory="1GB", memory_reserved="2GB"), "devices[0].memory_reserved",
         "not below memory"),
    Case("efficiency 0", _device(efficiency=0), "devices[0].efficiency", "must lie in"),
    Case("efficiency 1.5", _device(efficiency=1.5), "devices[0].efficiency", "must lie in"),
    Case("efficiency nan", _device(efficiency=float("nan")), "devices[0].efficiency", "must lie in"),
    Case("efficiency text", _device(efficiency="high"), "devices[0].efficiency", "expected a number"),
    Case("peak_flops empty", _device(peak_flops={}), "devices[0].peak_flops", "at least one of"),
    Case("peak_flops fp64", _device(peak_flops={"fp64": "10TFLOPS"}), "devices[0].peak_flops", "unknown key 'fp64'"),
    Case("peak_flops 1e30TFLOPS", _device(peak_flops="1e30TFLOPS"), "devices[0].peak_flops", "lies outside"),
    Case("peak_flops negative", _device(peak_flops="-5TFLOPS"), "devices[0].peak_flops",
         "is negative: give a value greater than zero"),
    Case("memory negative", _device(memory="-24GB"), "devices[0].memory", "is negative: give a value greater than zero"),
    Case("memory_bandwidth in GB", _device(memory_bandwidth="10GB"), "devices[0].memory_bandwidth",
         "did you mean 'GB/s'"),
    Case("host a list", _device(host=["h"]), "devices[0].host", "non-empty string"),
    Case("region a list", _device(region=["east"]), "devices[0].region", "non-empty string"),
    Case("region a mapping", _device(region={"name": "east"}), "devices[0].region", "non-empty string"),
    # network levels
    Case("network a list", _network([1]), "network", "expected a mapping"),
    Case("unknown network key", _set("network", "mesh", value=1), "network", "unknown key 'mesh'"),
    Case("network key misspelled", _rename("network", "region", "regoin"), "network", "did you mean 'region'?"),
    Case("region level missing", _drop("network", "region"), "network.region", "no link"),
    Case("global level missing", _drop("network", "global"), "network.global", "no link"),
    Case("link a string", _set("network", "region", value="10Gbps"), "network.region", "expected a mapping"),
    Case("link without latency", _drop("network", "region", "latency"), "network.region.latency", "is missing"),
    Case("bandwidth without unit", _set("network", "region", "bandwidth", value=10), "network.region.bandwidth",
         "has no unit"),
    Case("bandwidth 10Gb/s", _set("network", "region", "bandwidth", value="10Gb/s"), "network.region.bandwidth",
         "did you mean 'Gbps'"),
    Case("bandwidth 10Gbit", _set("network", "region", "bandwidth", value="10Gbit"), "network.region.bandwidth",
         "did you mean 'Gbps'"),
    Case("bandwidth 10gbps", _set("network", "region", "bandwidth", value="10gbps"), "network.region.bandwidth",
         "did you mean 'Gbps'"),
    Case("bandwidth 10GBps", _set("network", "region", "bandwidth", value="10GBps"), "network.region.bandwidth",
         "did you mean 'GB/s'"),
    Case("bandwidth 10GBPS", _set("network", "region", "bandwidth", value="10GBPS"), "network.region.bandwidth",
         "bits or bytes"),
    Case("bandwidth 1e-300bps", _set("network", "region", "bandwidth", value="1e-300bps"),
         "network.region.bandwidth", "lies outside 1 kbit/s"),
    Case("bandwidth 1e400Gbps", _set("network", "global", "bandwidth", value="1e400Gbps"),
         "network.global.bandwidth", "not a finite number"),
    Case("bandwidth 1e300Gbps", _set("network", "global", "bandwidth", value="1e300Gbps"),
         "network.global.bandwidth", "lies outside"),
    Case("bandwidth negative", _set("network", "region", "bandwidth", value="-1Gbps"), "network.region.bandwidth",
         "is negative: give a value greater than zero"),
    Case("bandwidth zero", _set("network", "region", "bandwidth", value="0Gbps"), "network.region.bandwidth",
         "greater than zero"),
    Case("bandwidth nan", _set("network", "region", "bandwidth", value=float("nan")), "network.region.bandwidth",
         "has no unit"),
    Case("bandwidth true", _set("network", "region", "bandwidth", value=True), "network.region.bandwidth",
         "expected a bandwidth quantity"),
    Case("bandwidth a list", _set("network", "region", "bandwidth", value=["1Gbps"]), "network.region.bandwidth",
         "expected a bandwidth quantity"),
    Case("latency 2h", _set("network", "global", "latency", value="2h"), "network.global.latency", "unknown unit"),
    Case("latency negative", _set("network", "global", "latency", value="-5ms"), "network.global.latency",
         "is negative: give 0 or more"),
    Case("latency 1e9s", _set("network", "global", "latency", value="1e9s"), "network.global.latency",
         "lies outside"),
    # region pairs
    Case("region_pairs a mapping", _network({**_LEVELS, "region_pairs": {"a": 1}}), "network.region_pairs",
         "expected a list"),
    Case("region_pairs entry a string", _pairs("east-west"), "network.region_pairs[0]", "expected a mapping"),
    Case("region_pairs three regions", _pairs({"regions": ["east", "west", "east"], "latency": "1ms",
                                              "bandwidth": "1Gbps"}), "network.region_pairs[0].regions",
         "exactly two"),
    Case("region_pairs a list as a region", _pairs({"regions": [["east"], "west"], "latency": "1ms",
                                                    "bandwidth": "1Gbps"}), "network.region_pairs[0].regions",
         "expected a region name"),
    Case("region_pairs unknown region", _pairs({"regions": ["east", "mars"], "latency": "1ms",
                                               "bandwidth": "1Gbps"}), "network.region_pairs[0].regions",
         "'mars' has no device"),
    Case("region_pairs from a list", _pairs({"from": ["east"], "to": "west", "latency": "1ms",
                                            "bandwidth": "1Gbps"}), "network.region_pairs[0].from",
         "non-empty string"),
    Case("region_pairs to unknown", _pairs({"from": "east", "to": "mars", "latency": "1ms", "bandwidth": "1Gbps"}),
         "network.region_pairs[0].to", "'mars' has no device"),
    Case("region_pairs symmetric text", _pairs({"from": "east", "to": "west", "symmetric": "yes", "latency": "1ms",
                                                "bandwidth": "1Gbps"}), "network.region_pairs[0].symmetric",
         "true or false"),
    Case("region_pairs regions not symmetric", _pairs({"regions": ["east", "west"], "symmetric": False,
                                                       "latency": "1ms", "bandwidth": "1Gbps"}),
         "network.region_pairs[0].symmetric", "use from/to"),
    Case("region_pairs no bandwidth", _pairs({"from": "east", "to": "west", "latency": "1ms"}),
         "network.region_pairs[0].bandwidth", "is missing"),
    Case("region_pairs unknown key", _pairs({"from": "east", "to": "west", "latency": "1ms", "bandwidth": "1Gbps",
                                            "jitter": "1ms"}), "network.region_pairs[0]", "unknown key 'jitter'"),
    Case("region_pairs bandwidth 10Gb/s", _pairs({"from": "east", "to": "west", "latency": "1ms",
                                                  "bandwidth": "10Gb/s"}), "network.region_pairs[0].bandwidth",
         "did you mean 'Gbps'"),
    # device pairs and NICs
    Case("pairs unknown device", _set("network", "pairs", value=[{"from": "fast-0", "to": "gpu9", "latency": "1ms",
                                                                  "bandwidth": "1Gbps"}]), "network.pairs[0]",
         "unknown device 'gpu9': use one of fast-0, fast-1, slow-0"),
    Case("pairs misspelled device", _set("network", "pairs", value=[{"from": "fast-0", "to": "slow_0",
                                                                     "latency": "1ms", "bandwidth": "1Gbps"}]),
         "network.pairs[0]", "unknown device 'slow_0' (did you mean 'slow-0'?)"),
    Case("pairs symmetric maybe", _set("network", "pairs", value=[{"from": "fast-0", "to": "slow-0",
                                                                   "symmetric": "maybe", "latency": "1ms",
                                                                   "bandwidth": "1Gbps"}]),
         "network.pairs[0].symmetric", "true or false"),
    Case("pairs without from", _set("network", "pairs", value=[{"to": "slow-0", "latency": "1ms",
                                                                "bandwidth": "1Gbps"}]), "network.pairs[0].from",
         "is missing"),
    Case("nic in GB", _set("network", "nic", value="1GB"), "network.nic", "did you mean 'GB/s'"),
    Case("nics unknown host", _set("network", "nics", value=[{"host": "mars", "bandwidth": "1Gbps"}]),
         "network.nics[0]", "host 'mars' has no device"),
    Case("nics without bandwidth", _set("network", "nics", value=[{"host": "fast-0"}]), "network.nics[0]",
         "give bandwidth"),
    # matrix networks
    Case("matrix of the wrong shape", _matrix(latency=[[0]]), "network.matrix.latency", "must be 4 x 4"),
    Case("matrix row a number", _matrix(latency=[0, 1, 2, 3]), "network.matrix.latency", "must be 4 x 4"),
    Case("matrix boolean cell", _cell("bandwidth", True), "network.matrix.bandwidth[0][1]", "not a number"),
    Case("matrix boolean latency", _cell("latency", False), "network.matrix.latency[0][1]", "not a number"),
    Case("matrix text cell", _cell("latency", "5ms"), "network.matrix.latency[0][1]", "not a number"),
    Case("matrix null cell", _cell("latency", None), "network.matrix.latency[0][1]", "not a number"),
    Case("matrix negative latency", _cell("latency", -1), "network.matrix.latency", "negative value"),
    Case("matrix zero bandwidth", _cell("bandwidth", 0), "network.matrix.bandwidth", "non-positive value"),
    Case("matrix nan cell", _cell("bandwidth", float("nan")), "network.matrix.bandwidth", "not a finite number"),
    Case("matrix 1e-300 bandwidth", _cell("bandwidth", 1e-300), "network.matrix.bandwidth", "lies outside"),
    Case("matrix unit GB", _matrix(bandwidth_unit="GB"), "network.matrix.bandwidth_unit", "did you mean 'GB/s'"),
    Case("matrix unit Gb/s", _matrix(bandwidth_unit="Gb/s"), "network.matrix.bandwidth_unit", "did you mean 'Gbps'"),
    Case("calibration file missing", _set("network", "calibration", value="nowhere.yaml"), "network.calibration",
         "file not found"),
    # model
    Case("unknown model preset", _set("model", value="gpt5"), "model", "unknown model preset"),
    Case("model section missing", _drop("model"), "model", "is missing"),
    Case("model a list", _set("model", value=[1]), "model", "expected a mapping"),
    Case("model layers 0", _set("model", value={"preset": "tiny", "layers": 0}), "model.layers", "at least 1"),
    Case("model layers a million", _set("model", value={"preset": "tiny", "layers": 10**6}), "model.layers",
         "above the 4,096"),
    Case("model hidden 2**30", _set("model", value={"preset": "tiny", "hidden": 2**30}), "model.hidden",
         "this planner handles"),
    Case("model hidden not divisible", _set("model", value={"preset": "tiny", "hidden": 100, "heads": 3}),
         "model.heads", "not divisible"),
    Case("model vocabulary missing", _set("model", value={"layers": 2, "hidden": 64, "heads": 2, "sequence": 16}),
         "model.vocabulary", "is missing"),
    Case("model sequence text", _set("model", value={"preset": "tiny", "sequence": "long"}), "model.sequence",
         "whole number"),
    Case("model unknown key", _set("model", value={"preset": "tiny", "depth": 3}), "model", "unknown key 'depth'"),
    Case("model gated_mlp text", _set("model", value={"preset": "tiny", "gated_mlp": "yes"}), "model.gated_mlp",
         "true or false"),
    # training
    Case("training missing", _drop("training"), "training", "is missing"),
    Case("global_batch missing", _drop("training", "global_batch"), "training.global_batch", "is missing"),
    Case("global_batch 0", _set("training", "global_batch", value=0), "training.global_batch", "at least 1"),
    Case("global_batch 67108864", _set("training", "global_batch", value=67_108_864), "training.global_batch",
         f"{MAX_GLOBAL_BATCH:,}"),
    Case("global_batch 1e18", _set("training", "global_batch", value=10**18), "training.global_batch",
         "this planner handles"),
    Case("global_batch 1.5", _set("training", "global_batch", value=1.5), "training.global_batch", "whole number"),
    Case("global_batch text", _set("training", "global_batch", value="64"), "training.global_batch",
         "whole number"),
    Case("micro_batch_size not a divisor", _set("training", "micro_batch_size", value=3),
         "training.micro_batch_size", "not a multiple"),
    Case("micro_batch_size -1", _set("training", "micro_batch_size", value=-1), "training.micro_batch_size",
         "whole number or 'auto'"),
    Case("old micro_batch key", _set("training", "micro_batch", value=2), "training.micro_batch",
         "now called 'micro_batch_size'"),
    Case("schedule zigzag", _set("training", "schedule", value="zigzag"), "training.schedule", "not one of"),
    Case("precision fp8", _set("training", "precision", value="fp8"), "training.precision", "not one of"),
    Case("optimizer lamb", _set("training", "optimizer", value="lamb"), "training.optimizer", "not one of"),
    Case("recompute text", _set("training", "recompute", value="yes"), "training.recompute", "not one of true, false"),
    Case("training a list", _set("training", value=[16]), "training", "expected a mapping"),
]


def _file(case: Case, tmp_path):
    return _edit(case.write)(tmp_path) if getattr(case.write, "mutation", False) else case.write(tmp_path)


def test_the_catalogue_is_large_and_named_uniquely():
    names = [case.name for case in CASES]
    assert len(names) >= 100 and len(set(names)) == len(names)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_is_refused_in_one_line_naming_file_and_field(tmp_path, case):
    path = _file(case, tmp_path)
    with pytest.raises(InputError) as info:
        load_job(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and case.fragment in message, message
    if case.where is not None:
        assert (f"field '{case.where}'" in message if not case.where.startswith("line ")
                else f"at {case.where}," in message), message


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_command_line_exits_2_with_the_same_line(tmp_path, case, capsys):
    path = _file(case, tmp_path)
    assert main([str(path), "--time-limit", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("plan: error: ") and case.fragment in err, err


class _Alarm:
    """Fails the test (instead of hanging it) when the block runs past ``seconds``."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        import signal

        def expire(signum, frame):
            raise TimeoutError(f"still running after {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def test_split_batch_takes_bounded_work_whatever_the_total():
    """``global_batch: 1e18`` looped forever here; now any total is a bounded bisection plus O(R log R)."""
    import numpy as np

    from planner.search.balance import split_batch

    fill = np.array([1.0, 2.0, 0.5])
    with _Alarm(10):
        for total in (10**18, 2**24, MAX_GLOBAL_BATCH):
            for bottleneck in ([1e-3, 0.0, 2.0], [1e-3, 1e-2, 2.0], [1e-20, 1.0, 1.0]):
                counts = split_batch(total, fill, np.array(bottleneck))
                assert counts.sum() == total and counts.min() >= 1
    # a zero bottleneck takes the rest at its fill time: 7 on the first replica, finishing at 3 s
    counts = split_batch(8, np.array([3.0, 1.0]), np.array([0.0, 1.0]))
    assert max(np.array([3.0, 1.0]) + (counts - 1) * np.array([0.0, 1.0])) == 3.0


def test_global_batch_limit_is_exact(tmp_path):
    document = small_topology()
    document["training"] = {"global_batch": MAX_GLOBAL_BATCH}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(document))
    assert load_job(path).training.global_batch == MAX_GLOBAL_BATCH
    document["training"]["global_batch"] = MAX_GLOBAL_BATCH + 1
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(InputError, match=f"above the {MAX_GLOBAL_BATCH:,} this planner handles"):
        load_job(path)


def test_a_plan_at_the_global_batch_limit_stays_quick_and_small(tmp_path, capsys):
    """Below the limit everything is bounded: 65,536 sequences in micro-batches of one plan in seconds."""
    import resource
    import time

    document = small_topology()
    document["training"] = {"global_batch": MAX_GLOBAL_BATCH, "micro_batch_size": 1}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(document))
    started = time.perf_counter()
    with _Alarm(120):
        assert main([str(path), "--time-limit", "2", "--format", "json"]) == 0
    assert time.perf_counter() - started < 60
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 2**20  # KiB: under 4 GiB
    assert f'"global_batch": {MAX_GLOBAL_BATCH}' in capsys.readouterr().out


def test_a_misspelled_required_key_is_named_where_the_key_is_missing(write_yaml, capsys):
    """``global_bach`` for ``global_batch``: the line names the field that is missing and the key the
    file has instead (the unknown-key check comes after it)."""
    doc = small_topology()
    doc["training"]["global_bach"] = doc["training"].pop("global_batch")
    assert main([str(write_yaml(doc))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'training.global_batch': is missing: add it" in err
    assert "'global_bach': a misspelling of it?" in err


def test_a_plan_file_given_as_a_topology_says_which_file_it_is(capsys):
    """The mirror of ``plan launch TOPOLOGY``: ``plan PLAN`` names the command that runs it."""
    from conftest import ROOT

    path = ROOT / "benchmarks" / "plans" / "h100x2-pipeline.yaml"
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a plan file, not a topology: run it with 'plan launch FILE'" in err


def test_libyamls_own_nesting_limit_reads_as_the_depth_check(tmp_path, monkeypatch):
    """PyYAML 6.0.4's libyaml stops deep nesting while scanning ahead of the reader's depth check
    ("exceeded maximum nesting depth"): the line is the depth check's, whatever PyYAML is installed."""
    import planner.io

    def scanner_stops(text):
        raise yaml.scanner.ScannerError("while increasing flow level", None, "exceeded maximum nesting depth", None)

    monkeypatch.setattr(planner.io, "_parse", scanner_stops)
    path = tmp_path / "deep.yaml"
    path.write_text("[[[]]]\n")
    with pytest.raises(InputError) as error:
        planner.io.read_yaml(path)
    assert f"nests deeper than {planner.io.MAX_DEPTH} levels: flatten it" in str(error.value)
