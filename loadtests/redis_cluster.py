"""A real local Redis Cluster (primaries with one replica each) and a Sentinel setup,
for tests and benchmarks.

Every server is a :class:`loadtests.redis_server.RedisServer` on a free loopback
port, with no persistence, so every start is empty. The cluster is made by
``redis-cli --cluster create ... --cluster-replicas 1``; a short
``cluster-node-timeout`` makes a killed primary's replica take over within
about two seconds.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time

from redis import Redis
from redis.crc import key_slot

from loadtests.redis_server import RedisServer

NODE_TIMEOUT_MS = 1000


def cluster_port() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too."""
    while True:
        port = random.randint(20000, 50000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port


def redis_cli_binary() -> str | None:
    return shutil.which("redis-cli")


class RedisClusterServers:
    """``primaries`` primaries, each with one replica, on loopback.

    Args:
        primaries: number of shards: 1 (no replica: slots assigned by hand), or 3 and more.
        replicas: replicas per primary (0 or 1).
    """

    def __init__(self, primaries: int = 3, replicas: int = 1) -> None:
        self.servers = [
            RedisServer(
                port=cluster_port(),
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    "--cluster-replica-validity-factor",
                    "0",  # a replica always may take over (the test kills primaries)
                    "--cluster-config-file",
                    f"nodes-{i}.conf",
                ),
            )
            for i in range((1 + replicas) * primaries)
        ]
        self._replicas = replicas

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every server as a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def start(self) -> None:
        for server in self.servers:
            server.start()
        if len(self.servers) == 1:  # one shard: redis-cli --cluster create wants three
            with Redis(port=self.servers[0].port) as r:
                r.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            self.wait_healthy()
            return
        cli = redis_cli_binary()
        assert cli is not None, "redis-cli is not installed"
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{s.port}" for s in self.servers),
                "--cluster-replicas",
                str(self._replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_healthy()

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every live server says ``cluster_state:ok``, all slots are served and
        every replica's first sync is done (until then a failover loses everything)."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = [s for s in self.servers if s.ping()]
            states = [self._info(s) for s in live]
            healthy = states and all(
                i.get("cluster_state") == "ok" and i.get("cluster_slots_ok") == "16384" for i in states
            )
            if healthy and all(self._replicating(s) for s in live):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis cluster not healthy: {states}")
            time.sleep(0.1)

    @staticmethod
    def _replicating(server: RedisServer) -> bool:
        """A primary, or a replica whose link to its primary is up (its first sync done)."""
        with Redis(port=server.port) as r:
            info = r.info("replication")
        return info["role"] == "master" or info.get("master_link_status") == "up"

    @staticmethod
    def _info(server: RedisServer) -> dict[str, str]:
        with Redis(port=server.port) as r:
            text = r.execute_command("CLUSTER", "INFO").decode()
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def primary_of(self, key: str) -> RedisServer:
        """The server that serves ``key``'s slot now."""
        slot = key_slot(key.encode())
        for server in self.servers:
            if not server.ping():
                continue
            with Redis(port=server.port) as r:
                for start, end, primary, *_ in r.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(primary[1])
                        return next(s for s in self.servers if s.port == port)
        raise RuntimeError(f"no server serves slot {slot}")

    def primaries(self) -> list[RedisServer]:
        """The servers that are primaries now."""
        out = []
        for server in self.servers:
            if server.ping():
                with Redis(port=server.port) as r:
                    if r.info("replication")["role"] == "master":
                        out.append(server)
        return out

    def close(self) -> None:
        for server in self.servers:
            server.close()


class SentinelServers:
    """One primary, one replica and ``sentinels`` Sentinels watching master ``name``."""

    def __init__(self, sentinels: int = 1, name: str = "bargein") -> None:
        self.name = name
        self.primary = RedisServer()
        self.replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(self.primary.port)))
        self.sentinels = [RedisServer() for _ in range(sentinels)]
        self._quorum = sentinels // 2 + 1

    @property
    def url(self) -> str:
        addrs = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{addrs}/{self.name}"

    def start(self) -> None:
        self.primary.start()
        self.replica.start()
        for sentinel in self.sentinels:
            conf = f"{sentinel.folder}/sentinel.conf"
            with open(conf, "w") as out:
                out.write(
                    f"port {sentinel.port}\nbind 127.0.0.1\ndir {sentinel.folder}\n"
                    f"sentinel monitor {self.name} 127.0.0.1 {self.primary.port} {self._quorum}\n"
                    f"sentinel down-after-milliseconds {self.name} 1000\n"
                    f"sentinel failover-timeout {self.name} 5000\n"
                )
            sentinel.start_sentinel(conf)
        deadline = time.monotonic() + 20
        while True:  # until the replica is in sync and the sentinels know it
            with Redis(port=self.sentinels[0].port) as s:
                replicas = s.execute_command("SENTINEL", "REPLICAS", self.name)
            if replicas and b"s_down" not in b"".join(v for v in replicas[0] if isinstance(v, bytes)):
                with Redis(port=self.replica.port) as r:
                    if r.info("replication").get("master_link_status") == "up":
                        return
            if time.monotonic() > deadline:
                raise RuntimeError("sentinel setup did not settle")
            time.sleep(0.2)

    def failover(self) -> None:
        """``SENTINEL FAILOVER``: the replica is promoted (returns when it is primary)."""
        with Redis(port=self.sentinels[0].port) as s:
            s.execute_command("SENTINEL", "FAILOVER", self.name)
        deadline = time.monotonic() + 20
        while True:  # until the replica is primary and the old primary replicates from it
            with Redis(port=self.replica.port) as r, Redis(port=self.primary.port) as old:
                demoted = old.info("replication")
                if r.info("replication")["role"] == "master" and demoted.get("master_link_status") == "up":
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("sentinel failover did not happen")
            time.sleep(0.1)

    def close(self) -> None:
        for server in (*self.sentinels, self.replica, self.primary):
            server.close()
