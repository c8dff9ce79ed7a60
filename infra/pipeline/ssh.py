"""SshTransport: the Transport protocol over SSH (paramiko), for the Slurm login node of a cloud stack.

Security rules:
- the private key arrives as text (a Pulumi secret upstream) and is kept only as a parsed key object;
  it is never logged, never in repr, and the transport refuses to be pickled;
- the server's host key is checked before authenticating: against a pinned key when one is given,
  otherwise against a known_hosts file, where an unknown host is recorded on first use (trust on
  first use) and enforced from then on; a different key is refused. A stack may require the pin
  (no trust on first use). The server is asked for the key type that is pinned or recorded, so a
  server with several host keys is checked against the right one;
- known_hosts belongs to the user: it is only ever appended to (mode kept; a new file is 0600), and
  lines this transport does not use (comments, @cert-authority, unparseable lines) are left alone;
  a key listed under @revoked is refused.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import select
import shlex
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import paramiko

from infra.pipeline.transport import (
    CommandResult,
    CommandTimeout,
    TransportError,
    check_env,
    shell_command,
)

log = logging.getLogger(__name__)

_KEY_CLASSES: tuple[type[paramiko.PKey], ...] = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)
_TIMEOUT_EXIT = 124


class SshConnectError(TransportError):
    """The SSH server could not be reached (after the retries)."""


class SshAuthError(TransportError):
    """The SSH server refused the key."""


class HostKeyMismatch(TransportError):
    """The server's host key differs from the pinned or recorded one."""


class UnknownHostKey(TransportError):
    """The host is not known and trust on first use is off."""


def load_private_key(text: str, passphrase: str | None = None) -> paramiko.PKey:
    """Parse an OpenSSH or PEM private key given as text (Ed25519, ECDSA or RSA)."""
    errors = []
    for cls in _KEY_CLASSES:
        try:
            return cls.from_private_key(io.StringIO(text), password=passphrase)
        except paramiko.PasswordRequiredException:
            raise TransportError("the SSH private key is encrypted and no passphrase was given") from None
        except (paramiko.SSHException, ValueError) as e:
            errors.append(f"{cls.__name__}: {type(e).__name__}")
    if passphrase:
        raise TransportError(f"the SSH private key could not be decrypted with the given passphrase (wrong "
                             f"passphrase?) or parsed ({'; '.join(errors)})")
    raise TransportError(f"the SSH private key could not be parsed ({'; '.join(errors)})")


def parse_public_key(line: str) -> paramiko.PKey:
    """A public key from 'TYPE BASE64 [comment]' or a known_hosts line 'HOST TYPE BASE64'."""
    parts = line.split()
    if parts and not _looks_like_key_type(parts[0]):
        parts = parts[1:]
    if len(parts) < 2:
        raise ValueError(f"not an SSH public key: {line[:40]!r}")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except Exception as e:
        raise ValueError(f"not an SSH public key ({parts[0]}): {e}") from None


def _looks_like_key_type(token: str) -> bool:
    return token.startswith(("ssh-", "ecdsa-", "sk-"))


def key_types(key: paramiko.PKey) -> list[str]:
    """The host key algorithms that produce `key` (an RSA key signs with SHA-2 or SHA-1)."""
    name = key.get_name()
    return ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if name == "ssh-rsa" else [name]


class KnownHosts:
    """The entries of a known_hosts file this transport uses: plain host keys and @revoked keys.
    Comments, @cert-authority lines (host certificates are not used here) and lines that do not parse
    are skipped, never rewritten."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys = paramiko.HostKeys()
        self.revoked = paramiko.HostKeys()
        if not path.exists():
            return
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            marker = None
            if text.startswith("@"):
                marker, _, text = text.partition(" ")
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(text.strip(), lineno=number)
            except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError):
                entry = None
            if entry is None or entry.key is None:
                log.debug("%s:%d: not a host key line this transport uses; left as it is", path, number)
                continue
            if marker in (None, "@revoked"):
                for name in entry.hostnames:
                    (self.keys if marker is None else self.revoked).add(name, entry.key.get_name(), entry.key)

    def recorded(self, entry: str) -> list[paramiko.PKey]:
        return list((self.keys.lookup(entry) or {}).values())

    def is_revoked(self, entry: str, key: paramiko.PKey) -> bool:
        return any(k == key for k in (self.revoked.lookup(entry) or {}).values())

    def append(self, entry: str, key: paramiko.PKey) -> None:
        """Add one line at the end; the file keeps its other lines and its mode (0600 when new)."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "rb+") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size:
                handle.seek(size - 1)
                lead = b"" if handle.read(1) == b"\n" else b"\n"
            else:
                lead = b""
            handle.write(lead + f"{entry} {key.get_name()} {key.get_base64()}\n".encode())


def fingerprint(key: paramiko.PKey) -> str:
    """The OpenSSH-style fingerprint 'SHA256:...' of a public key."""
    return key.fingerprint


def host_entry(host: str, port: int) -> str:
    """The known_hosts name of a host: 'host' on port 22, '[host]:port' otherwise."""
    return host if port == 22 else f"[{host}]:{port}"


class SshTransport:
    """Transport over one SSH connection, opened on first use and reused; close() or use `with`."""

    def __init__(
        self,
        host: str,
        *,
        private_key: str,
        user: str = "root",
        port: int = 22,
        passphrase: str | None = None,
        host_key: str | None = None,
        known_hosts: str | Path | None = None,
        trust_on_first_use: bool = True,
        require_pinned: bool = False,
        connect_timeout: float = 10.0,
        attempts: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.host = host
        self.port = port
        self.user = user
        self._pkey = load_private_key(private_key, passphrase)
        self._pinned = parse_public_key(host_key) if host_key else None
        if require_pinned and self._pinned is None:
            raise UnknownHostKey(f"{user}@{host_entry(host, port)}: this stack requires a pinned login host key "
                                 "(pipeline.loginHostKey) and none is set; trust on first use is off")
        self.known_hosts = Path(known_hosts).expanduser() if known_hosts else Path.home() / ".ssh" / "known_hosts"
        self.trust_on_first_use = trust_on_first_use
        self.connect_timeout = connect_timeout
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._conn: paramiko.Transport | None = None

    def __repr__(self) -> str:
        return f"SshTransport({self.user}@{host_entry(self.host, self.port)})"

    def __getstate__(self) -> dict:
        raise TypeError("SshTransport holds a private key and a live connection and is not picklable; build it where it is used")

    def __enter__(self) -> SshTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def target(self) -> str:
        return f"{self.user}@{host_entry(self.host, self.port)}"

    def _connection(self) -> paramiko.Transport:
        if self._conn is None or not self._conn.is_active():
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> paramiko.Transport:
        last: Exception | None = None
        start = time.monotonic()
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                delay = min(self.backoff_s * 2 ** (attempt - 2), self.max_backoff_s)
                log.warning("SSH to %s failed (%s); retry %d/%d in %.1fs", self.target, last, attempt, self.attempts, delay)
                time.sleep(delay)
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
            except socket.gaierror as e:
                raise SshConnectError(f"cannot resolve SSH host {self.host!r}: {e.strerror or e}") from None
            except OSError as e:
                last = e
                continue
            conn = paramiko.Transport(sock)
            self._ask_for_expected_key_type(conn)
            try:
                conn.start_client(timeout=self.connect_timeout)
            except (paramiko.SSHException, EOFError, OSError) as e:
                conn.close()
                last = e
                continue
            try:
                self._verify_host_key(conn.get_remote_server_key())
                self._authenticate(conn)
            except BaseException:
                conn.close()
                raise
            conn.set_keepalive(30)
            return conn
        raise SshConnectError(
            f"could not connect to {self.target} after {self.attempts} attempts in {time.monotonic() - start:.1f}s: {last}"
        )

    def _authenticate(self, conn: paramiko.Transport) -> None:
        try:
            conn.auth_publickey(self.user, self._pkey)
        except paramiko.AuthenticationException:
            raise SshAuthError(
                f"SSH authentication as {self.target} failed: the server refused the key {fingerprint(self._pkey)}"
                " (is its public key in the login node's authorized_keys / the stack's sshPublicKeys?)"
            ) from None
        if not conn.is_authenticated():
            raise SshAuthError(f"SSH authentication as {self.target} did not complete")

    def _expected_keys(self) -> list[paramiko.PKey]:
        if self._pinned is not None:
            return [self._pinned]
        return KnownHosts(self.known_hosts).recorded(host_entry(self.host, self.port))

    def _ask_for_expected_key_type(self, conn: paramiko.Transport) -> None:
        """Offer only the pinned (or recorded) key's algorithms, so that a server with an ed25519 and an
        ECDSA key shows the one we can check."""
        options = conn.get_security_options()
        wanted = [t for key in self._expected_keys() for t in key_types(key) if t in options.key_types]
        if wanted:
            options.key_types = list(dict.fromkeys(wanted))

    def _verify_host_key(self, key: paramiko.PKey) -> None:
        entry = host_entry(self.host, self.port)
        known = KnownHosts(self.known_hosts)
        if known.is_revoked(entry, key):
            raise HostKeyMismatch(f"host key of {entry} ({key.get_name()} {fingerprint(key)}) is marked @revoked in "
                                  f"{self.known_hosts}; refusing to connect")
        if self._pinned is not None:
            if key != self._pinned:
                raise HostKeyMismatch(
                    f"host key of {entry} is {key.get_name()} {fingerprint(key)}, but the pinned key is "
                    f"{self._pinned.get_name()} {fingerprint(self._pinned)}; refusing to connect"
                )
            return
        recorded = known.recorded(entry)
        if recorded:
            if key in recorded:
                return
            have = ", ".join(f"{k.get_name()} {fingerprint(k)}" for k in recorded)
            raise HostKeyMismatch(
                f"host key of {entry} is {key.get_name()} {fingerprint(key)}, but {self.known_hosts} records {have}; "
                "refusing to connect (if the host was rebuilt, remove its line from that file)"
            )
        if not self.trust_on_first_use:
            raise UnknownHostKey(
                f"host {entry} is not in {self.known_hosts} and no host key is pinned; "
                f"its key is {key.get_name()} {fingerprint(key)}"
            )
        known.append(entry, key)
        log.info("recorded host key of %s (%s) in %s", entry, fingerprint(key), self.known_hosts)

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        line = shell_command(command)
        prefix = "".join(f"export {k}={shlex.quote(v)}; " for k, v in check_env(env).items())
        if cwd:
            prefix += f"cd {shlex.quote(cwd)} && "
        remote = prefix + line
        if timeout is not None:
            remote = f"timeout --kill-after=5 {timeout:g} sh -c {shlex.quote(remote)}"
        chan = self._connection().open_session(timeout=self.connect_timeout)
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout + 15
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(remote)
            chan.shutdown_write()
            while True:
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                # sshd may send the exit status before the last output: done only at the channel's EOF
                if (chan.exit_status_ready() and (chan.eof_received or chan.closed)
                        and not chan.recv_ready() and not chan.recv_stderr_ready()):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise CommandTimeout(f"command {line!r} on {self.target} did not finish within {timeout:g}s")
                select.select([chan], [], [], 0.2)
            code = chan.recv_exit_status()
        finally:
            chan.close()
        if code == -1:
            raise SshConnectError(f"the connection to {self.target} was lost while running {line!r} (no exit status)")
        if timeout is not None and code in (_TIMEOUT_EXIT, 128 + 9) and time.monotonic() - started >= timeout * 0.99:
            raise CommandTimeout(f"command {line!r} on {self.target} did not finish within {timeout:g}s and was killed")
        return CommandResult(line, code, out.decode(errors="replace"), err.decode(errors="replace"))

    def read_file(self, path: str) -> str:
        with paramiko.SFTPClient.from_transport(self._connection()) as sftp:
            try:
                with sftp.open(path, "rb") as fh:
                    return fh.read().decode(errors="replace")
            except FileNotFoundError:
                raise FileNotFoundError(f"{path} does not exist on {self.target}") from None

    def put_directory(self, local_dir: str | Path, remote_dir: str, *, replace: bool = False) -> None:
        source = Path(local_dir)
        if not source.is_dir():
            raise TransportError(f"local directory {source} does not exist")
        remote_dir = remote_dir.rstrip("/")
        parent, name = os.path.split(remote_dir)
        parent = parent or "."
        staging = f"{parent}/.{name}.tmp-{uuid.uuid4().hex[:12]}"
        self.run(["mkdir", "-p", parent], timeout=60).check()
        with paramiko.SFTPClient.from_transport(self._connection()) as sftp:
            try:
                if _exists(sftp, remote_dir) and not replace:
                    raise TransportError(f"{self.target}:{remote_dir} already exists (pass replace=True to swap it)")
                _upload_tree(sftp, source, staging)
                if _exists(sftp, remote_dir):
                    old = f"{parent}/.{name}.old-{uuid.uuid4().hex[:12]}"
                    sftp.posix_rename(remote_dir, old)
                    sftp.posix_rename(staging, remote_dir)
                    self.run(["rm", "-rf", old], timeout=600)
                else:
                    sftp.posix_rename(staging, remote_dir)
            except BaseException:
                self.run(["rm", "-rf", staging], timeout=600)
                raise


def _exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _upload_tree(sftp: paramiko.SFTPClient, source: Path, dest: str) -> None:
    sftp.mkdir(dest, mode=0o755)
    for root, dirs, files in os.walk(source):
        rel = Path(root).relative_to(source)
        base = dest if rel == Path(".") else f"{dest}/{rel.as_posix()}"
        for d in list(dirs):
            local = Path(root) / d
            if local.is_symlink():
                sftp.symlink(os.readlink(local), f"{base}/{d}")
                dirs.remove(d)
            else:
                sftp.mkdir(f"{base}/{d}", mode=local.stat().st_mode & 0o7777)
        for f in files:
            local = Path(root) / f
            if local.is_symlink():
                sftp.symlink(os.readlink(local), f"{base}/{f}")
                continue
            if not local.is_file():
                raise TransportError(f"{local} is not a regular file; only files, folders and links are uploaded")
            sftp.put(str(local), f"{base}/{f}", confirm=True)
            sftp.chmod(f"{base}/{f}", local.stat().st_mode & 0o7777)
