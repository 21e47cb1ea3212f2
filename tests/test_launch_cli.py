"""``plan launch`` at its edges: hostfiles, dry runs, torchrun on two 'hosts' of this machine, and
user mistakes (one line, exit code 2, nothing started)."""

import json
import socket

import pytest

from tests.runtime_helpers import run_cli, two_by_two_plan


@pytest.fixture
def two_stage_plan(tmp_path):
    return two_by_two_plan(tmp_path)


_run = run_cli


def test_dry_run_prints_one_torchrun_per_host_with_its_devices(tmp_path, two_stage_plan, capsys):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# the a* devices, then host b\n10.0.0.1 a1 a0\n10.0.0.2 @b\n")
    code, out, err = _run(["launch", str(two_stage_plan), "--hostfile", str(hosts), "--dry-run",
                           "--master-port", "29555"], capsys)
    assert code == 0, err
    commands = [line for line in out.splitlines() if line.startswith("torchrun")]
    assert len(commands) == 2
    assert "--nnodes=2 --node-rank=0 --nproc-per-node=2 --master-addr=10.0.0.1 --master-port=29555" in commands[0]
    assert "--devices a1,a0" in commands[0] and "--devices b0,b1" in commands[1]
    assert "--node-rank=1" in commands[1] and "-m planner.runtime.worker" in commands[1]


@pytest.mark.parametrize("choice, graphs", [("auto", "tensor"), ("graphs", "all"), ("on", None), ("off", None)])
def test_dry_run_tells_each_host_which_stages_replay_as_cuda_graphs(tmp_path, two_stage_plan, capsys, choice, graphs):
    """``auto`` on GPU hosts (NCCL) graphs the tensor-group stages, ``graphs`` every compiled stage;
    the worker reads the flag as written."""
    import shlex

    from planner.runtime.worker import _parse

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("10.0.0.1 a0 a1\n10.0.0.2 @b\n")
    code, out, err = _run(["launch", str(two_stage_plan), "--hostfile", str(hosts), "--dry-run", "--compile", choice],
                          capsys)
    assert code == 0, err
    for line in (line for line in out.splitlines() if line.startswith("torchrun")):
        words = shlex.split(line)
        args = _parse(words[words.index("planner.runtime.worker") + 1:])
        assert args.graphs == (graphs or "none") and args.compile == (choice != "off")


@pytest.mark.parametrize("text, message", [
    ("10.0.0.1 a0 a1 b0\n", "device b1 is on no host"),
    ("10.0.0.1 a0 a1\n10.0.0.2 b0 b1 a0\n", "line 2': device a0 is already on line 1"),
    ("10.0.0.1 a0 a1 b0 b1 zz\n", "device 'zz' is not in the plan"),
    ("10.0.0.1 a0 a1 b0 b1 a2\n", "device a2 is idle in this plan"),
    ("10.0.0.1 @nowhere\n", "has no host 'nowhere'"),
    ("10.0.0.1\n", "names a host but no devices"),
])
def test_hostfile_that_does_not_match_the_plan_is_refused(tmp_path, two_stage_plan, capsys, text, message):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(text)
    code, out, err = _run(["launch", str(two_stage_plan), "--hostfile", str(hosts), "--dry-run"], capsys)
    assert code == 2
    assert message in err and "hosts.txt" in err
    assert len(err.strip().splitlines()) == 1 and "torchrun" not in out


@pytest.mark.parametrize("extra, message", [
    (["--time-scale", "2"], "--time-scale"),
    (["--dry-run"], "--dry-run"),
    (["--iterations", "0"], "--iterations"),
    (["--emulate", "--hostfile", "h.txt"], "--emulate"),
])
def test_option_mistakes_are_one_line(tmp_path, two_stage_plan, capsys, extra, message):
    code, _, err = _run(["launch", str(two_stage_plan), "--out", str(tmp_path / "run")] + extra, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_missing_plan_and_plan_without_model_are_one_line(tmp_path, two_stage_plan, capsys):
    code, _, err = _run(["launch", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "nope.yaml" in err and "not found" in err
    document = json.loads(json.dumps(__import__("yaml").safe_load(two_stage_plan.read_text())))
    del document["model"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(document))
    code, _, err = _run(["launch", str(bare)], capsys)
    assert code == 2 and "bare.json" in err and "'model'" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_hostfile_launch_runs_torchrun_per_host_and_trains_like_a_local_launch(tmp_path, two_stage_plan, capsys):
    pytest.importorskip("torch")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1 a0 b0\nlocalhost a1 b1\n")
    code, out, err = _run(["launch", str(two_stage_plan), "--hostfile", str(hosts), "--backend", "gloo",
                           "--iterations", "2", "--warmup", "0", "--out", str(tmp_path / "hosts-run"),
                           "--master-port", str(_free_port())], capsys)
    assert code == 0, err
    code, out, err = _run(["launch", str(two_stage_plan), "--backend", "gloo", "--iterations", "2", "--warmup", "0",
                           "--out", str(tmp_path / "local-run")], capsys)
    assert code == 0, err
    across_hosts = json.loads((tmp_path / "hosts-run" / "results.json").read_text())["measured"]["loss"]
    local = json.loads((tmp_path / "local-run" / "results.json").read_text())["measured"]["loss"]
    assert across_hosts == pytest.approx(local, rel=1e-6)


@pytest.mark.slow
def test_profile_writes_each_ranks_operator_table_and_the_dry_run_passes_it_on(tmp_path, two_stage_plan, capsys):
    pytest.importorskip("torch")
    out_dir = tmp_path / "profiled"
    code, out, err = _run(["launch", str(two_stage_plan), "--backend", "gloo", "--iterations", "2", "--warmup", "0",
                           "--out", str(out_dir), "--profile"], capsys)
    assert code == 0, err
    tables = sorted(out_dir.glob("profile-rank-*.txt"))
    assert [t.name for t in tables] == [f"profile-rank-{r}.txt" for r in range(4)]
    for table in tables:
        text = table.read_text()
        assert "Self CPU" in text and "aten::mm" in text  # the blocks' matrix products, each rank's own
    assert json.loads((out_dir / "results.json").read_text())["measured"]["loss"]
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("10.0.0.1 a0 a1\n10.0.0.2 b0 b1\n")
    code, out, err = _run(["launch", str(two_stage_plan), "--hostfile", str(hosts), "--dry-run", "--profile"], capsys)
    assert code == 0, err
    assert all(line.endswith("--profile") for line in out.splitlines() if line.startswith("torchrun"))


def test_an_emulation_on_a_busy_host_is_warned_about():
    """Emulated ranks on a host busier than its cores wait for the CPU: the launch says so."""
    from planner.runtime.launch import load_warning

    assert load_warning(1.9, 2) is None and load_warning(2.0, 2) is None
    warning = load_warning(8.3, 2)
    assert warning.startswith("warning:") and "8.3" in warning and "2 core(s)" in warning and "idle host" in warning
