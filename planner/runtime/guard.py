"""Processes that cannot outlive the launcher, whatever kills it (SIGKILL included).

Two mechanisms, both needing nothing from the dying process:

- ``die_with_parent``: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``), which the kernel
  sends when the parent exits; checked once against the expected parent to close the race of a
  parent that died before the call. Used by every locally spawned rank and by the guard below.
- ``python -m planner.runtime.guard [--stdin] -- COMMAND...``: runs COMMAND (a ``torchrun``) as a
  child and stops its whole tree when the guard's parent dies, when the guard gets SIGTERM, SIGHUP
  or SIGINT, or (``--stdin``) when its standard input closes. The launcher holds the write end of that
  pipe; over ``ssh`` the remote guard's stdin closes when the launcher's pipe or the connection does,
  so a remote host stops its ranks too. The guard is a child subreaper: ranks that torchrun starts in
  sessions of their own are re-parented to it if torchrun dies first, and it stops them as well.

This module imports nothing heavy: a spawned rank calls ``die_with_parent`` before torch is loaded.
"""

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

__all__ = ["die_with_parent", "descendants", "stop_tree", "main"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_GRACE_S = 5.0  # after SIGTERM, how long the tree may take before SIGKILL
_POLL_S = 0.5


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits; if the parent is already
    gone (``os.getppid() != parent_pid``), exit now. Elsewhere than Linux a thread polls the parent."""
    expected = parent_pid if parent_pid is not None else os.getppid()
    if not _prctl(_PR_SET_PDEATHSIG, int(sig)):
        threading.Thread(target=_poll_parent, args=(expected, sig), daemon=True, name="parent-watch").start()
    if os.getppid() != expected:
        os.kill(os.getpid(), sig)


def _poll_parent(expected: int, sig: int) -> None:
    while os.getppid() == expected:
        time.sleep(_POLL_S)
    os.kill(os.getpid(), sig)


def descendants(pid: int) -> list:
    """Every process below ``pid`` (children first), from ``/proc``; empty where there is no ``/proc``."""
    children = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        below = [c for p in frontier for c in children.get(p, [])]
        found += below
        frontier = below
    return found


def stop_tree(root: int, *, include_root: bool = True, grace_s: float = _GRACE_S, reap=None) -> None:
    """SIGTERM ``root`` (unless ``include_root`` is false) and every process below it, SIGKILL what is
    left after ``grace_s``. ``reap`` (called while waiting) collects exited children."""
    def members() -> list:
        return ([root] if include_root else []) + descendants(root)

    for sig in (signal.SIGTERM, signal.SIGCONT):  # a stopped process acts on SIGTERM once continued
        for pid in members():
            _send(pid, sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not any(_running(p) for p in members()):
            return
        time.sleep(0.05)
    for pid in members():
        _send(pid, signal.SIGKILL)
    if reap is not None:
        reap()


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _watch_stdin(stop: threading.Event) -> None:
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    stop.set()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.runtime.guard",
                                     description="Run COMMAND; stop its whole tree when this process's parent "
                                                 "dies, on SIGTERM/SIGHUP/SIGINT, or (--stdin) when stdin closes.")
    parser.add_argument("--stdin", action="store_true", help="also stop when standard input reaches its end")
    parser.add_argument("--parent", type=int, help="expected parent process id (default: the current parent)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    die_with_parent(args.parent, signal.SIGTERM)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    if args.stdin:
        threading.Thread(target=_watch_stdin, args=(stop,), daemon=True, name="stdin-watch").start()
    code = None
    while not stop.is_set() and code is None:
        stop.wait(_POLL_S)
        code = child.poll()
    stop_tree(os.getpid(), include_root=False, reap=_reap_all)  # the command, and ranks it left behind
    if code is None:
        return 128 + signal.SIGTERM
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    raise SystemExit(main())
