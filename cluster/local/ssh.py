"""ssh between the launcher and the local worker hosts, the way the MPIJob launcher reaches its workers.

Each worker host runs its own `sshd` on its own address with a host key generated for this cluster;
the launcher logs in with a client key generated for this cluster. Nothing is read from or written
to the user's ~/.ssh: the client runs with `-F <cluster config>` (through a wrapper named `ssh` put
first on horovodrun's PATH, because horovodrun calls plain `ssh`) and keeps no known_hosts.
"""

from __future__ import annotations

import getpass
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself and insists on an absolute path


class SshSetupError(RuntimeError):
    """ssh tooling is missing or could not be set up."""


def sshd_config(*, address: str, port: int, host_key: Path, authorized_keys: Path) -> str:
    """An sshd configuration that accepts exactly the cluster's client key on one address.

    UsePAM/StrictModes are off so the same config also works for an unprivileged sshd (the
    fallback without root), which can only log in its own user and has no PAM stack to talk to.
    """
    return "\n".join([
        f"ListenAddress {address}",
        f"Port {port}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PidFile none",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "LogLevel ERROR",
        # Horovod opens one session per worker slot plus its checks; allow plenty at once.
        "MaxStartups 100",
        "MaxSessions 100",
        "",
    ])


def ssh_client_config(*, port: int, identity_file: Path, user: str,
                      names: dict[str, str] | None = None) -> str:
    """Client options for every worker host: this cluster's key, no known_hosts, fail fast.

    Keep-alives make a session to a host that vanished (a reclaimed node) end within ~15 s
    instead of hanging, so horovodrun notices the loss. `names` (pod name -> address) lets the client
    reach pods by name where hosts have no /etc/hosts of their own (the loopback fallback).
    """
    aliases = [f"Host {name}\n  HostName {address}" for name, address in sorted((names or {}).items())]
    return "\n".join([
        *aliases,
        "Host *",
        f"  User {user}",
        f"  Port {port}",
        f"  IdentityFile {identity_file}",
        "  IdentitiesOnly yes",
        "  BatchMode yes",
        "  StrictHostKeyChecking no",
        "  UserKnownHostsFile /dev/null",
        "  GlobalKnownHostsFile /dev/null",
        "  LogLevel ERROR",
        "  ConnectTimeout 10",
        "  ServerAliveInterval 5",
        "  ServerAliveCountMax 3",
        "",
    ])


def ssh_wrapper_script(ssh_binary: str, config: Path) -> str:
    return f'#!/bin/sh\nexec {ssh_binary} -F {config} "$@"\n'


@dataclass(frozen=True)
class SshKeys:
    """The cluster's ssh material, all inside one private directory."""

    directory: Path
    port: int

    @property
    def host_key(self) -> Path:
        return self.directory / "ssh_host_ed25519_key"

    @property
    def client_key(self) -> Path:
        return self.directory / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.directory / "authorized_keys"

    @property
    def client_config(self) -> Path:
        return self.directory / "ssh_config"

    @property
    def bin_dir(self) -> Path:
        """Directory holding the `ssh` wrapper; put it first on horovodrun's PATH."""
        return self.directory / "bin"

    def sshd_config_path(self, host_name: str) -> Path:
        return self.directory / f"sshd_config.{host_name}"


def check_ssh_tools() -> None:
    missing = [p for p in (SSHD,) if not os.access(p, os.X_OK)]
    missing += [t for t in ("ssh", "ssh-keygen") if shutil.which(t) is None]
    if missing:
        raise SshSetupError(
            f"missing {', '.join(missing)}: the local backend reaches its worker hosts over ssh. "
            "Install OpenSSH (Debian/Ubuntu: apt-get install openssh-server openssh-client)."
        )


def create_keys(directory: Path, port: int) -> SshKeys:
    """Generate the host key, the client key, authorized_keys, client config and ssh wrapper."""
    check_ssh_tools()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = SshKeys(directory=directory, port=port)
    for path, comment in ((keys.host_key, "ringtrain-local-host"),
                          (keys.client_key, "ringtrain-local-client")):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30,
        )
    keys.authorized_keys.write_text(Path(f"{keys.client_key}.pub").read_text())
    write_client_config(keys)
    keys.bin_dir.mkdir(exist_ok=True)
    wrapper = keys.bin_dir / "ssh"
    wrapper.write_text(ssh_wrapper_script(shutil.which("ssh") or "ssh", keys.client_config))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    if os.geteuid() == 0:
        # sshd running as root wants its privilege-separation directory (Debian creates it at boot
        # through systemd, which a container may not run).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    return keys


def write_client_config(keys: SshKeys, names: dict[str, str] | None = None) -> None:
    keys.client_config.write_text(
        ssh_client_config(port=keys.port, identity_file=keys.client_key, user=getpass.getuser(), names=names)
    )


def write_sshd_config(keys: SshKeys, host_name: str, address: str) -> Path:
    path = keys.sshd_config_path(host_name)
    path.write_text(sshd_config(address=address, port=keys.port, host_key=keys.host_key,
                                authorized_keys=keys.authorized_keys))
    return path


def sshd_command(config: Path) -> list[str]:
    # -D: stay in the foreground so the process we started is the daemon we stop; -e: log to stderr.
    return [SSHD, "-D", "-e", "-f", str(config)]
