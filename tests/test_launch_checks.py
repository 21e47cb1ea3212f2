"""What ``plan launch`` checks before anything starts: every field of an edited plan against the rest
of the plan and its topology, the results folder, the devices being here, hostfile addresses, and
``plan calibrate``'s device type and batch. Each mistake is one line naming the file and the field,
exit code 2, and nothing left behind."""

import copy
import errno
import os

import pytest
import yaml

from planner.cli import main
from planner.errors import InputError
from tests.runtime_helpers import run_cli, two_by_two_plan


@pytest.fixture
def plan_file(tmp_path):
    return two_by_two_plan(tmp_path)


def _launch(argv, capsys):
    return run_cli(["launch", *argv], capsys)


def _set(document, path, value):
    *parents, last = path
    for key in parents:
        document = document[key]
    if value is _DELETE:
        del document[last]
    else:
        document[last] = value


_DELETE = object()

# (what the edit does, [(key path, new value)], field the error must name, words it must contain)
EDITS = {
    "hash emptied": ([(("topology", "sha256"), "")], "topology.sha256", "hash"),
    "hash of another topology": ([(("topology", "sha256"), "0" * 64)], "topology.sha256", "another topology"),
    "hidden raised past memory": ([(("model", "hidden"), 16384)], "memory", "GB"),
    "stage devices edited": ([(("stages", 0, "devices"), ["a2", "a1"])], "stages[0].devices", "replicas decide"),
    "pipeline degree edited": ([(("degrees", "pipeline"), 3)], "degrees.pipeline", "has 2"),
    "old-style stages degree edited": ([(("degrees", "pipeline"), _DELETE), (("degrees", "stages"), 1)],
                                       "degrees.stages", "has 2"),
    "data degree edited": ([(("degrees", "data"), 1)], "degrees.data", "has 2"),
    "top-level global batch edited": ([(("global_batch",), 64)], "global_batch", "micro_batches"),
    "training global batch edited": ([(("training", "global_batch"), 64)], "micro_batch_size", "global batch"),
    "training micro-batch size edited": ([(("training", "micro_batch_size"), 4)], "training.micro_batch_size",
                                         "plan's micro_batch_size is 2"),
    "training schedule edited": ([(("training", "schedule"), "gpipe")], "training.schedule", "1f1b"),
    "idle lists a used device": ([(("idle",), ["a0", "a2", "b2"])], "idle", "a0"),
    "idle forgets an unused device": ([(("idle",), ["a2"])], "idle", "b2"),
    "idle count edited": ([(("degrees", "idle_devices"), 0)], "degrees.idle_devices", "leaves 2"),
    "stage index edited": ([(("stages", 1, "index"), 5)], "stages[1].index", "entry 1"),
    "a gap between stages": ([(("stages", 1, "layers"), [3, 4])], "stages[1].layers", "start it at 2"),
}


def test_the_unedited_plan_passes_every_check(plan_file):
    pytest.importorskip("torch")
    from planner.runtime.inputs import load_run_inputs
    from planner.runtime.preflight import check_memory

    check_memory(load_run_inputs(plan_file))


@pytest.mark.parametrize("case", sorted(EDITS))
def test_an_edited_plan_is_refused_naming_the_field(tmp_path, plan_file, capsys, case):
    pytest.importorskip("torch")
    edits, field, words = EDITS[case]
    document = copy.deepcopy(yaml.safe_load(plan_file.read_text()))
    for path, value in edits:
        _set(document, path, value)
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(document, sort_keys=False))
    code, out, err = _launch([edited, "--backend", "gloo", "--out", tmp_path / "run"], capsys)
    assert code == 2, out + err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "edited.yaml" in err and f"field '{field}'" in err and words in err, err
    assert not (tmp_path / "run").exists() and "launching" not in out


def test_out_that_is_an_existing_file_is_refused_before_start(tmp_path, plan_file, capsys):
    pytest.importorskip("torch")
    target = tmp_path / "results.txt"
    target.write_text("keep me\n")
    code, out, err = _launch([plan_file, "--backend", "gloo", "--out", target], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "results.txt" in err and "field '--out'" in err and "existing file" in err
    assert target.read_text() == "keep me\n" and "launching" not in out


def test_out_that_cannot_be_written_is_refused_before_start_and_leaves_nothing(tmp_path, plan_file, capsys,
                                                                               monkeypatch):
    pytest.importorskip("torch")
    import planner.runtime.preflight as preflight

    out = tmp_path / "new" / "run"
    if os.geteuid() != 0:  # a read-only folder stops everyone but root
        (tmp_path / "locked").mkdir(mode=0o500)
        out = tmp_path / "locked" / "run"
    else:
        def read_only(path, size):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        monkeypatch.setattr(preflight, "_reserve", read_only)
    code, printed, err = _launch([plan_file, "--backend", "gloo", "--out", out], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "field '--out'" in err and "cannot" in err and "launching" not in printed
    assert not out.exists() and not (tmp_path / "new").exists()
    assert not list(tmp_path.rglob("*.tmp"))


def test_out_on_a_full_disk_is_refused_before_start(tmp_path, plan_file, capsys, monkeypatch):
    pytest.importorskip("torch")
    import collections

    import planner.runtime.preflight as preflight

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    code, out, err = _launch([plan_file, "--backend", "gloo", "--out", tmp_path / "run"], capsys)
    assert code == 2 and "field '--out'" in err and "MB free" in err and "launching" not in out
    assert not (tmp_path / "run").exists()


def test_results_written_on_a_full_disk_leave_no_temporary_file(tmp_path, monkeypatch):
    from pathlib import Path

    from planner.runtime.results import write_results

    original = Path.write_text

    def full(self, text, *args, **kwargs):
        original(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError):
        write_results(tmp_path, {"format": "x"}, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_gpu_plan_on_a_host_without_cuda_is_refused_unless_the_cpu_is_asked_for(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    document = {"name": "two-4090", "devices": [{"name": "g", "count": 2, "type": "RTX-4090", "host": "h"}],
                "network": {"host": {"latency": "5us", "bandwidth": "50GB/s"}}}
    topology = tmp_path / "gpus.yaml"
    topology.write_text(yaml.safe_dump(document))
    from planner.inputs.model import model_preset, parse_training
    from planner.plan.document import plan_to_document, write_plan
    from planner.plan.plan import Plan
    from planner.inputs.job import load_topology

    topo = load_topology(topology)
    plan = Plan(layer_bounds=(0, 2, 4), assignment=(("g-0", "g-1"),), micro_batches=(2,), micro_batch_size=1,
                schedule="1f1b", topology_name=topo.name, topology_sha256=topo.sha256)
    training = parse_training({"global_batch": 2, "micro_batch_size": 1, "precision": "fp32", "optimizer": "sgd"})
    path = tmp_path / "plan.yaml"
    write_plan(plan_to_document(plan, model=model_preset("tiny"), training=training, topology_source=str(topology)),
               path)
    code, out, err = _launch([path, "--out", tmp_path / "run"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "plan.yaml" in err and "RTX-4090" in err and "no CUDA GPU" in err
    for fix in ("--emulate", "--hostfile", "--backend gloo"):
        assert fix in err
    assert not (tmp_path / "run").exists() and "launching" not in out


@pytest.mark.parametrize("address", ["-oProxyCommand=touch /tmp/pwned", "-p2222", "host;reboot", "a+b@c",
                                     "-u@host", "999.1.1.1", "bad_name"])
def test_hostfile_addresses_that_are_not_hosts_are_refused(tmp_path, plan_file, capsys, address):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"{address} a0 b0 a1 b1\n")
    code, out, err = _launch([plan_file, "--hostfile", hosts, "--dry-run"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "hosts.txt" in err and "line 1" in err and "user@host" in err and "torchrun" not in out


@pytest.mark.parametrize("address, master", [("node-1.example.com", "node-1.example.com"), ("alice@10.0.0.7", "10.0.0.7"),
                                             ("[fe80::1]", "fe80::1"), ("bob@::1", "::1")])
def test_hostfile_accepts_names_addresses_and_users(tmp_path, plan_file, capsys, address, master):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"{address} a0 b0 a1 b1\n")
    code, out, err = _launch([plan_file, "--hostfile", hosts, "--dry-run"], capsys)
    assert code == 0, err
    assert f"--master-addr={master} " in out


def test_remote_hosts_get_ssh_with_the_end_of_options_before_the_host(tmp_path, plan_file, monkeypatch):
    pytest.importorskip("torch")
    import subprocess

    import planner.runtime.launch as launch_module

    started = []

    class Finished:
        def __init__(self, argv, **kwargs):
            started.append(argv)
            self.pid, self.stdin = 0, open(os.devnull, "wb")

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Finished)
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("alice@10.9.9.9 a0 b0 a1 b1\n")
    launch_module.launch(plan_file, launch_module.LaunchOptions(hostfile=str(hosts), out_dir=str(tmp_path / "r")),
                         log=lambda line: None)
    (argv,) = started
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "--", "alice@10.9.9.9"]


def _calibration_topology(tmp_path, kind="CPU-core"):
    document = {"name": "cal", "devices": [{"name": "d", "count": 2, "type": kind, "host": "h"}],
                "network": {"host": {"latency": "5us", "bandwidth": "10GB/s"}},
                "model": "tiny", "training": {"global_batch": 8, "micro_batch_size": 4, "precision": "fp32"}}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_calibrating_a_gpu_type_on_a_host_without_it_is_refused(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    topology = _calibration_topology(tmp_path, kind="RTX-4090")
    out = tmp_path / "calibration.yaml"
    code = main(["calibrate", str(topology), "--device-type", "RTX-4090", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--device-type" in err and "RTX-4090" in err and "no CUDA GPU" in err
    assert not out.exists()


def test_calibration_keeps_the_files_batch_with_another_model(tmp_path):
    pytest.importorskip("torch")
    from planner.runtime.calibrate import CalibrateOptions, _job

    topology = _calibration_topology(tmp_path)
    job, kind = _job(topology, CalibrateOptions(model="tiny"))
    assert kind == "CPU-core" and job.training.micro_batch_size == 4
    job, _ = _job(topology, CalibrateOptions(model="tiny", micro_batch_size=3))
    assert job.training.micro_batch_size == 3
    document = yaml.safe_load(topology.read_text())
    del document["training"]
    topology.write_text(yaml.safe_dump(document))
    job, _ = _job(topology, CalibrateOptions(model="tiny"))
    assert job.training.micro_batch_size == 1


def test_calibrating_the_shipped_home_mini_with_the_tiny_model_reads_its_batch():
    pytest.importorskip("torch")
    from planner.runtime.calibrate import CalibrateOptions, _job
    from tests.conftest import ROOT

    job, kind = _job(ROOT / "topologies" / "emulated" / "home-mini.yaml",
                     CalibrateOptions(model="tiny", device_type="RTX-4090"))
    assert kind == "RTX-4090" and job.model.name == "tiny" and job.training.micro_batch_size == 4



def test_a_plan_that_does_not_fit_is_refused_on_devices_and_only_warned_about_in_emulation(tmp_path, plan_file):
    pytest.importorskip("torch")
    from planner.runtime.inputs import load_run_inputs
    from planner.runtime.preflight import check_memory

    document = yaml.safe_load(plan_file.read_text())
    document["model"]["hidden"] = 16384
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(document, sort_keys=False))
    inputs = load_run_inputs(edited)
    with pytest.raises(InputError, match="memory"):
        check_memory(inputs)
    assert "does not fit in memory" in check_memory(inputs, refuse=False)


def test_a_plan_that_fits_only_with_the_compiled_loss_is_refused_eager_naming_compile(tmp_path, plan_file, capsys,
                                                                                       monkeypatch):
    """The eager loss (``--compile off``) keeps fp32 log-probabilities (``memory.loss_bytes``): a plan
    that fits with the compiled loss but not with the eager one is refused with ``--compile off``,
    in one line that names the way out; launched compiled, the check passes."""
    pytest.importorskip("torch")
    from cost_models import memory
    from planner.runtime.inputs import load_run_inputs
    from planner.runtime.preflight import check_memory

    inputs = load_run_inputs(plan_file)
    check_memory(inputs, compiled=False)  # fits either way as planned
    monkeypatch.setattr(memory, "EAGER_LOSS_BACKWARD_BYTES_PER_LOGIT", 10**7)  # an eager loss far past any device
    check_memory(inputs)
    with pytest.raises(InputError, match="--compile off"):
        check_memory(inputs, compiled=False)
    assert check_memory(inputs, refuse=False, compiled=False).endswith("does not fit in memory with an eager loss")
    # on GPUs (NCCL) the run is refused before anything starts; on the CPU (gloo) the loss's memory is
    # the host's, and the run goes on to the next check (this test's plan lacks nothing else)
    code, out, err = _launch([plan_file, "--backend", "nccl", "--compile", "off", "--out", tmp_path / "run"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--compile auto" in err, out + err
    assert "field '--compile'" in err and not (tmp_path / "run").exists()
    from planner.runtime.launch import LaunchOptions, _compiled_on_devices

    assert _compiled_on_devices(LaunchOptions(backend="gloo", compile="off"))
    assert not _compiled_on_devices(LaunchOptions(backend="nccl", compile="off"))
    assert _compiled_on_devices(LaunchOptions(backend="nccl", compile="auto"))
