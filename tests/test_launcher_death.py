"""When ``plan launch`` dies, nothing it started lives on: in every launch mode (local, emulated,
hostfile on this host, hostfile over ssh), SIGKILL or SIGTERM to the launcher while ranks train
leaves no process behind, read from /proc. Also: a SIGSTOPped rank is the one named."""

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.runtime_helpers import cpu_topology, write_test_plan  # noqa: E402

pytestmark = [pytest.mark.runtime,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

_FAKE_SSH = """#!/bin/sh
# ssh for tests: options ('-o VALUE', '-x', up to '--'), then the host, then the command, run here.
while true; do
  case "$1" in
    --) shift; break ;;
    -o) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift
exec sh -c "$1"
"""


def _tree(pid: int) -> set:
    """Every process below ``pid``."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def plan(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    return write_test_plan(tmp_path, topology, assignment=[["a0", "b0"]], layer_bounds=[0, 2, 4],
                           micro_batches=[2], micro_batch_size=1, schedule="1f1b")


def _start(tmp_path, argv: list, env=None):
    return subprocess.Popen([sys.executable, "-m", "planner.cli", "launch"] + [str(a) for a in argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)


def _wait_for_training(launcher, ranks: int) -> set:
    """Read the launcher's output until the second iteration; returns every process below it."""
    line = ""
    while "iteration 2/" not in line:
        line = launcher.stdout.readline()
        assert line or launcher.poll() is None, launcher.stderr.read()
    everything = _tree(launcher.pid)
    workers = [p for p in everything if "spawn_main" in _cmdline(p) or "planner.runtime.worker" in _cmdline(p)]
    assert len(workers) >= ranks, {p: _cmdline(p) for p in everything}
    return everything


def _assert_nothing_left(everything: set, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(_alive(p) for p in everything):
        time.sleep(0.2)
    left = {p: _cmdline(p) for p in everything if _alive(p)}
    for pid in left:  # do not leave them to the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left


def _kill_and_check(launcher, everything: set, sig) -> str:
    try:
        os.kill(launcher.pid, sig)
        launcher.wait(timeout=30)
        _assert_nothing_left(everything)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return launcher.stderr.read()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.slow
def test_emulated_launch_leaves_nothing_when_the_launcher_dies(tmp_path, plan, sig):
    launcher = _start(tmp_path, [plan, "--emulate", "--time-scale", "5", "--iterations", "10000", "--out",
                                 tmp_path / "run"])
    everything = _wait_for_training(launcher, 2)
    error = _kill_and_check(launcher, everything, sig)
    if sig == signal.SIGTERM:
        assert launcher.returncode == 1 and "the launcher got SIGTERM; every rank was stopped" in error
        assert "Traceback" not in error


@pytest.mark.slow
def test_local_launch_leaves_nothing_when_the_launcher_is_killed(tmp_path, plan):
    launcher = _start(tmp_path, [plan, "--backend", "gloo", "--iterations", "100000", "--out", tmp_path / "run"])
    everything = _wait_for_training(launcher, 2)
    _kill_and_check(launcher, everything, signal.SIGKILL)


def _hostfile_launch(tmp_path, plan, hosts: str, env=None):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(hosts)
    return _start(tmp_path, [plan, "--hostfile", hostfile, "--backend", "gloo", "--iterations", "100000",
                             "--master-port", _free_port(), "--out", tmp_path / "run"], env=env)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_hostfile_launch_on_this_host_leaves_nothing_when_the_launcher_dies(tmp_path, plan, sig):
    launcher = _hostfile_launch(tmp_path, plan, "127.0.0.1 a0\nlocalhost b0\n")
    everything = _wait_for_training(launcher, 2)
    agents = [p for p in everything if "-m torch.distributed.run" in _cmdline(p) and "guard" not in _cmdline(p)]
    assert len(agents) == 2
    error = _kill_and_check(launcher, everything, sig)
    if sig == signal.SIGTERM:
        assert launcher.returncode == 1 and "the launcher got SIGTERM; every rank was stopped" in error


@pytest.mark.slow
def test_hostfile_launch_over_ssh_leaves_nothing_when_the_launcher_is_killed(tmp_path, plan):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(_FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # 127.0.0.2 is this machine but not one of the launcher's local names: it goes through 'ssh'.
    launcher = _hostfile_launch(tmp_path, plan, "127.0.0.1 a0\n127.0.0.2 b0\n", env=env)
    everything = _wait_for_training(launcher, 2)
    commands = [_cmdline(p) for p in everything]
    _kill_and_check(launcher, everything, signal.SIGKILL)
    assert any("planner.runtime.guard --stdin -- torchrun" in c for c in commands)  # the 'remote' side


@pytest.mark.slow
def test_a_stopped_rank_is_named_not_the_rank_waiting_on_it(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "a1", "b0"]], layer_bounds=[0, 1, 2, 4],
                           micro_batches=[2], micro_batch_size=1, schedule="1f1b")
    launcher = _start(tmp_path, [plan, "--emulate", "--time-scale", "5", "--iterations", "10000", "--timeout", "8",
                                 "--out", tmp_path / "run"])
    try:
        everything = _wait_for_training(launcher, 3)
        workers = sorted(p for p in _tree(launcher.pid) if "spawn_main" in _cmdline(p)
                         and "resource_tracker" not in _cmdline(p))
        assert len(workers) == 3
        os.kill(workers[2], signal.SIGSTOP)  # rank 2: started last
        code = launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    error = launcher.stderr.read()
    assert code == 1, error
    assert "rank 2 (device b0, replica 0, stage 2) stopped answering" in error and "stopped (SIGSTOP" in error
    assert "Traceback" not in error
    _assert_nothing_left(everything)
