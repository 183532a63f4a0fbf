"""Start or join Ray for a shard job, closed to everyone else.

Ray runs whatever code a client sends it, so a cluster that anyone can reach is remote code execution for
anyone who can reach it. The embedded local cluster a job starts by itself is therefore:

- bound to loopback: its GCS, raylet, agents and workers listen on 127.0.0.1 only (Ray's single-machine mode,
  its default on macOS and Windows), checked after start;
- authenticated: Ray's token authentication is on (RAY_AUTH_MODE=token; a RAY_AUTH_MODE=disabled in the
  environment is overridden for it), with a random token made for this process unless RAY_AUTH_TOKEN or
  RAY_AUTH_TOKEN_PATH names one. The token lives in this process's environment, which the Ray processes it
  starts inherit; nothing is written to disk (Ray's own default would write ~/.ray/auth_token).

Joining a cluster (`--ray-address`) uses token authentication whenever RAY_AUTH_MODE=token is set, or, with
RAY_AUTH_MODE unset, whenever a token is at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token); a
cluster that refuses the client ends the job in one line that says what to set (docs/shard.md shows how to
start a cluster with a token). No token is ever put in a message, a log line or a file of ours.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any

from audiopipe.shard.job import JobError

LOOPBACK = ("127.0.0.1", "::1", "localhost")

_started: dict[str, Any] = {}  # what this process's Ray is: {"mode": "local" | "cluster", "address": ...}
_own_token: list[str] = []  # the token made for the local cluster, so that joining a cluster never sends it


def local_cores() -> int:
    """CPUs this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def token_available() -> bool:
    """A Ray token is set up for this user: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return True
    return (Path.home() / ".ray" / "auth_token").is_file()


def _refresh_auth() -> None:
    """Ray reads RAY_AUTH_MODE and the token once per process; when it is imported already, make it read them
    again (what Ray's own `ray.init` does when it turns token mode on)."""
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def start_local(cpus: int, nice: int, runtime_env: dict[str, Any]) -> None:
    """Start the embedded single-machine Ray with `cpus` CPUs, on loopback, with a token (module docstring).
    A Ray this process has already started or joined is reused as it is."""
    import_needed = "ray" not in sys.modules
    if _reuse("local", None):
        return
    if _own_token and os.environ.get("RAY_AUTH_TOKEN") != _own_token[0]:
        _own_token.clear()
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(16)
        _own_token[:] = [os.environ["RAY_AUTH_TOKEN"]]
    os.environ["RAY_AUTH_MODE"] = "token"
    if not import_needed:
        _refresh_auth()
    import ray
    from ray._private import ray_constants

    # Ray's single-machine mode: its node address is 127.0.0.1, and its servers then bind to loopback only.
    # Ray resolves an explicit 127.0.0.1 to the machine's address; this switch is how it picks loopback itself.
    multi_node = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        # Ray starts workers at niceness 15 by default, so any other process on the box (a trainer, another
        # job) starves them; the local raylet starts them at the niceness asked for instead.
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, runtime_env=runtime_env,
                 log_to_driver=False, logging_level="WARNING", configure_logging=True,
                 _system_config={"worker_niceness": nice})
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = multi_node
    host = ray.get_runtime_context().gcs_address.rsplit(":", 1)[0].strip("[]")
    if host not in LOOPBACK:
        ray.shutdown()
        raise JobError(f"the embedded Ray listened on {host}, not on loopback only; refusing to run (this Ray "
                       f"version is not supported for local jobs, use workers=0 or ray_address=)")
    _started.update(mode="local", address=None)


def join_cluster(address: str, runtime_env: dict[str, Any]) -> None:
    """Join the Ray cluster at `address` with token authentication when it is set up (module docstring)."""
    if _reuse("cluster", address):
        return
    if _own_token and os.environ.get("RAY_AUTH_TOKEN") == _own_token[0]:
        os.environ.pop("RAY_AUTH_TOKEN")  # the local cluster's token means nothing to another cluster
        _own_token.clear()
    if os.environ.get("RAY_AUTH_MODE") is None and token_available():
        os.environ["RAY_AUTH_MODE"] = "token"
    _refresh_auth()
    _check_token(address)
    import ray

    ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level="WARNING")
    _started.update(mode="cluster", address=address)


def _reuse(mode: str, address: str | None) -> bool:
    """True when this process's Ray can be used as it is; shuts down one this module started otherwise."""
    if "ray" not in sys.modules:
        return False
    import ray

    if not ray.is_initialized():
        _started.clear()
        return False
    if not _started:  # started by the caller (ray.init in their own program): theirs to choose
        return True
    if _started.get("mode") == mode and _started.get("address") == address:
        return True
    ray.shutdown()
    _started.clear()
    return False


def auth_help(address: str) -> str:
    return (f"the Ray cluster at {address} refused this client: it runs with token authentication. Set "
            f"RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN (or a file named by "
            f"RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token), as on its nodes; see docs/shard.md")


def _check_token(address: str) -> None:
    """For a host:port address, one request to the cluster's GCS first: a refused token is said in one line at
    once (`ray.init` would retry it for a long while). Other errors are left to `ray.init`."""
    if "://" in address or address == "auto" or ":" not in address:
        return
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        with _quiet_stderr():  # Ray's C++ client logs each refusal to fd 2: the one line below says it all
            GcsClient(address=address)
    except AuthenticationError:
        raise JobError(auth_help(address)) from None
    except Exception:
        return


class _quiet_stderr:
    def __enter__(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def __exit__(self, *exc: object) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)


def check_progress_possible(cluster_cpus: float, codec_cpus: float, address: str | None) -> None:
    """Refuse in one line a job whose shard tasks could never start: no CPU left beside the codec stage."""
    left = cluster_cpus - codec_cpus
    if left >= 1:
        return
    where = f"the Ray cluster at {address}" if address else "the embedded Ray"
    need = " beside the codec stage's actors" if codec_cpus else ""
    raise JobError(f"{where} has {cluster_cpus:g} CPU{'s' if cluster_cpus != 1 else ''}, and shard tasks need "
                   f"1{need}: add a node with CPUs (or start its head with more CPUs: `ray start --num-cpus N`)")
