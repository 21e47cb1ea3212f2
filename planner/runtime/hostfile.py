"""Hostfiles: which host runs which of the plan's devices, and the torchrun command of each host.

Format, one host per line, ``#`` starts a comment::

    10.0.0.1  a100-0 a100-1      # plan device names, in local-rank order
    10.0.0.2  @dc2-node0         # or @HOST: every plan device on that topology host

The first line's host is the rendezvous master. An address is a host name, an IPv4 or IPv6 address
(``[fe80::1]`` or ``fe80::1``) or ``user@`` one of those; anything else (``-oProxyCommand=...``, spaces,
shell characters) is refused, and ssh gets ``--`` before the host.
"""

import ipaddress
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from planner.errors import InputError

__all__ = ["HostEntry", "parse_hostfile", "check_address", "torchrun_arguments", "shell_line"]

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens, 253 characters at most.
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# A login name before '@' (POSIX portable user names; no leading hyphen).
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")


@dataclass(frozen=True)
class HostEntry:
    address: str  # as written: host name, IP address (IPv6 may be in brackets) or user@ one of those
    devices: tuple

    @property
    def host(self) -> str:
        """The address without user and brackets: what torchrun's rendezvous connects to."""
        host = self.address.rpartition("@")[2]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host

    @property
    def ssh_target(self) -> str:
        """``[user@]host`` for ssh (which takes IPv6 addresses without brackets)."""
        user, at, _ = self.address.rpartition("@")
        return f"{user}{at}{self.host}"


def check_address(address: str) -> str:
    """``address`` if it is a host name, an IPv4 or IPv6 address (``[...]`` allowed), or ``user@`` one of
    those; else ``ValueError`` saying why. Nothing else reaches ``ssh`` (a leading ``-`` is an option there)."""
    user, at, host = address.rpartition("@")
    if at and not _USER.match(user):
        raise ValueError(f"user {user!r} is not a login name (letters, digits, '_', '.', '-'; no leading '-')")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
        return address
    except ValueError:
        pass
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.match(label) for label in labels) or host.replace(".", "").isdigit():
        raise ValueError(f"{host!r} is not a host name, IPv4 or IPv6 address")
    return address


def parse_hostfile(path, plan, topology) -> list:
    """Entries of ``path``, checked against the plan: every plan device on exactly one host, nothing else."""
    source = str(path)
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise InputError("file not found: check the path", source=source) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read it ({error.__class__.__name__})", source=source) from None
    used = set(plan.used_devices)  # tensor groups' members included
    seen, entries = {}, []
    for number, raw in enumerate(lines, start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"line {number}"
        if len(words) < 2:
            raise InputError("names a host but no devices: write 'ADDRESS DEVICE [DEVICE...]' or 'ADDRESS @HOST'",
                             source=source, field=where)
        try:
            check_address(words[0])
        except ValueError as error:
            raise InputError(f"address {words[0]!r}: {error}: write a host name, an IP address or user@host",
                             source=source, field=where) from None
        devices = []
        for word in words[1:]:
            if word.startswith("@"):
                host = word[1:]
                if host not in topology.hosts:
                    raise InputError(f"topology {topology.name} has no host {host!r}: use one of "
                                     f"{', '.join(topology.hosts)}", source=source, field=where)
                devices += [d.name for d in topology.devices if d.host == host and d.name in used]
            elif word in used:
                devices.append(word)
            elif topology.has_device(word):
                raise InputError(f"device {word} is idle in this plan: remove it from the hostfile",
                                 source=source, field=where)
            else:
                raise InputError(f"device {word!r} is not in the plan: check the spelling", source=source, field=where)
        for name in devices:
            if name in seen:
                raise InputError(f"device {name} is already on line {seen[name]}: list each device once",
                                 source=source, field=where)
            seen[name] = number
        entries.append(HostEntry(address=words[0], devices=tuple(devices)))
    missing = sorted(used - set(seen))
    if missing:
        raise InputError(f"the plan's device {missing[0]} is on no host ({len(missing)} missing): add it",
                         source=source)
    return entries


def torchrun_arguments(entries: list, node: int, *, plan_path: str, topology_path: str, out_dir: str,
                       iterations: int, warmup: int, seed: int, learning_rate: float, timeout_s: float,
                       backend: str, master_port: int, compile: bool = False, graphs: str = "none",
                       profile: bool = False) -> list:
    """Arguments after ``torchrun`` for host ``node`` of ``entries``."""
    entry = entries[node]
    return [f"--nnodes={len(entries)}", f"--node-rank={node}", f"--nproc-per-node={len(entry.devices)}",
            f"--master-addr={entries[0].host}", f"--master-port={master_port}",
            "-m", "planner.runtime.worker", "--plan", plan_path, "--topology", topology_path,
            "--devices", ",".join(entry.devices), "--out", out_dir, "--iterations", str(iterations),
            "--warmup", str(warmup), "--seed", str(seed), "--lr", repr(learning_rate),
            "--timeout", repr(timeout_s), "--backend", backend] + (["--compile"] if compile else []) + (
            ["--graphs", graphs] if graphs != "none" else []) + (["--profile"] if profile else [])


def shell_line(arguments: list) -> str:
    return shlex.join(arguments)
