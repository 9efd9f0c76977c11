"""A network of many nodes in simulation: PEX from one seed list, churn, a partition.

N Switches (``--nodes``, default 1,000) on one ``MemoryNetwork`` driven by a
``HeapClock``, each with a ``PexReactor`` and a numbered-stream reactor. A few of them
(``--seeds``) are seeds in seed mode; every other node starts knowing only the seeds'
addresses (booked as the seeds' own word, then PEX rounds dial them). Everything random
comes from ``--seed``: node keys, each PexReactor's ``rng``, the reconnect jitter, the
choice of who restarts; a run repeats exactly.

Addresses: MemoryNetwork's default hosts (10.0.0.n) all share one private /16, which
would put every node in one network group of the address book. Here node ``i`` gets
the public address ``(11 + i // 250).(i % 250).0.1``: every node in a /16 of its own, so
the book's grouping (new buckets by source group, tried buckets by address group) works
as on the Internet.

Phases, each on simulated time:

1. *Formation*: until every non-seed node has ``max_outbound_peers`` outbound sessions
   (or ``--form-limit`` seconds). Measured: the time, the curve of nodes with full
   outbound peers over time, the mesh's diameter and average clustering coefficient (of
   the undirected graph of sessions between non-seed nodes, by BFS in plain Python),
   the dials and the bytes it took.
2. *Churn* (``--churn-minutes``, 0 to skip): every simulated minute 10% of the nodes
   restart (a new process with the same key at the same host; its book is empty again
   but for the seeds); in the middle, a partition of 20% of the nodes from the rest for
   ``--partition`` seconds, then it heals. Some nodes (``--streamers``) send a numbered
   stream on channel 0x60 to every peer all along; every receiving session checks no
   loss, no duplicate, in order, and at the end every session that resumed and is still
   open has delivered all its sender accepted.
3. *Recovery*: until every node has its outbound peers again.

Prints one JSON line; writes bench/out/sim_network.png (nodes with full outbound peers
over simulated time) when matplotlib is installed (the ``pipeline`` extra) and
bench/out/sim_network.json.

    .venv/bin/python bench/sim_network.py --nodes 1000
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import pathlib
import random
import resource
import struct
import sys
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mconn import ChannelDescriptor, Config, NodeKey, Reactor  # noqa: E402
from mconn.switch.dialer import default_reconnect_delay  # noqa: E402
from mconn.testing import HeapClock, MemoryNetwork  # noqa: E402
from reactors.pex import PexReactor  # noqa: E402

PORT = 26656
STREAM = 0x60
CONFIG = Config(
    stats_interval=0,
    ping_interval=10.0,
    pong_timeout=5.0,
    resume_grace=60.0,
    dial_timeout=3.0,
    handshake_timeout=5.0,
    max_reconnect_delay=4.0,
    ack_interval=0.5,
)
#: PEX as deployed (specs/pex.md section 6), with the seeds' hold shortened.
PEX_DEFAULTS = dict(request_interval=10.0)


def host_of_index(i: int) -> str:
    """A public IPv4 address in a /16 of its own for node ``i`` (up to 22,000 nodes)."""
    return f"{11 + i // 250}.{i % 250}.0.1"


class StreamReactor(Reactor):
    """A numbered stream on channel 0x60: a streaming node sends to every peer; every
    node checks what each session delivers (no loss, no duplicate, in order)."""

    def __init__(self, sim: Simulation, node: int, streaming: bool) -> None:
        self.sim, self.node, self.streaming = sim, node, streaming

    def get_channels(self):
        return [ChannelDescriptor(STREAM, priority=1, send_queue_capacity=64)]

    def add_peer(self, peer) -> None:
        self.sim.sessions_started += 1

    def receive(self, channel_id, peer, message) -> None:
        self.sim.received(self.switch.node_id, peer, message)

    def remove_peer(self, peer, reason) -> None:
        pass

    def peer_resumed(self, peer) -> None:
        self.sim.resumed.add((peer.node_id, self.switch.node_id, peer.session.id))


class Simulation:
    """One seeded run of ``nodes`` Switches; see the module docstring."""

    def __init__(
        self,
        nodes: int = 1000,
        *,
        seeds: int = 3,
        seed: int = 1,
        streamers: int = 10,
        config: Config = CONFIG,
        request_interval: float = 10.0,
        addrbook_files: dict[int, str] | None = None,
        pex_options: dict[int, dict] | None = None,
    ) -> None:
        self.n, self.n_seeds, self.config = nodes, seeds, config
        self.addrbook_files = addrbook_files or {}
        #: Node index -> more PexReactor arguments for it (its restarts too).
        self.pex_options = pex_options or {}
        #: Print the formation's progress to stderr every 30 simulated seconds.
        self.progress = False
        self.request_interval = request_interval
        self.rng = random.Random(seed)
        self.clock = HeapClock()
        self.network = MemoryNetwork(self.clock, keep_closed_links=False)
        self.target = config.max_outbound_peers
        self.keys = [NodeKey(Ed25519PrivateKey.from_private_bytes(self.rng.randbytes(32))) for _ in range(nodes)]
        self.index = {k.node_id: i for i, k in enumerate(self.keys)}
        self.streaming = set(range(seeds, min(nodes, seeds + streamers)))
        #: (sender id, receiver id, session id) -> numbers delivered; sender side -> accepted.
        self.delivered: dict = collections.defaultdict(list)
        self.accepted: dict = collections.Counter()
        self.violations: list[str] = []
        self.resumed: set = set()
        self.sessions_started = 0
        self.restarts = 0
        self.pex: list[PexReactor] = []
        self.switches: list = []
        for i in range(nodes):
            switch, pex = self._make(i)
            self.switches.append(switch)
            self.pex.append(pex)
        self.seed_addresses = [self.network.dial_address(self.switches[i], PORT) for i in range(seeds)]
        for i in range(nodes):
            self._boot(i)
        self.retired_counters: collections.Counter = collections.Counter()
        self.stream_call = None

    # -- nodes ----------------------------------------------------------------------

    def _pex(self, i: int) -> PexReactor:
        return PexReactor(
            request_interval=self.request_interval,
            rng=random.Random(self.rng.getrandbits(64)),
            seed_mode=i < self.n_seeds,
            addrbook_file=self.addrbook_files.get(i),
            **self.pex_options.get(i, {}),
        )

    def _reconnect_delay(self):
        jitter = random.Random(self.rng.getrandbits(64))
        return functools.partial(default_reconnect_delay, max_delay=self.config.max_reconnect_delay, rng=jitter.random)

    def _make(self, i: int):
        pex = self._pex(i)
        reactors = [pex, StreamReactor(self, i, i in self.streaming)]
        switch = self.network.switch(
            reactors,
            host=host_of_index(i),
            node_key=self.keys[i],
            config=self.config,
            reconnect_delay=self._reconnect_delay(),
        )
        switch.listen(f"tcp:{PORT}")
        return switch, pex

    def _boot(self, i: int) -> None:
        """Start node ``i`` knowing only the seeds (booked as their own word)."""
        switch, pex = self.switches[i], self.pex[i]
        if not switch.running:
            switch.startService()
        for address in self.seed_addresses:
            node_id = address.split("@")[0]
            if node_id != switch.node_id:
                pex.add_address(address, source=node_id, source_host=address.split("@")[1].rsplit(":", 1)[0])
        pex.start()

    def restart(self, i: int) -> None:
        """Node ``i``'s process restarts: same key, same host, an empty book but the seeds."""
        self.retired_counters.update(self.pex[i].counters)
        pex = self._pex(i)
        old = self.switches[i]
        new = self.network.restart(
            old, [pex, StreamReactor(self, i, i in self.streaming)], reconnect_delay=self._reconnect_delay()
        )
        self.switches[i], self.pex[i] = new, pex
        self._boot(i)
        self.restarts += 1

    # -- the stream -----------------------------------------------------------------

    def start_stream(self, every: float = 1.0, per_tick: int = 2) -> None:
        def tick():
            for i in sorted(self.streaming):
                switch = self.switches[i]
                if not self.network.is_alive(switch):
                    continue
                for peer in list(switch.peers.values()):
                    if peer.state == "closed":
                        continue
                    key = (switch.node_id, peer.node_id, peer.session.id)
                    for _ in range(per_tick):
                        n = self.accepted[key]
                        if not peer.try_send(STREAM, struct.pack(">Q", n) + bytes(24)):
                            break
                        self.accepted[key] = n + 1
            self.stream_call = self.clock.callLater(every, tick)

        self.stream_call = self.clock.callLater(every, tick)

    def stop_stream(self) -> None:
        if self.stream_call is not None and self.stream_call.active():
            self.stream_call.cancel()

    def received(self, receiver: str, peer, message: bytes) -> None:
        key = (peer.node_id, receiver, peer.session.id)
        (n,) = struct.unpack(">Q", message[:8])
        got = self.delivered[key]
        expected = got[-1] + 1 if got else 0
        if n != expected:
            self.violations.append(f"{key[0][:8]}->{key[1][:8]} session {key[2]!r}: got #{n}, expected #{expected}")
        got.append(n)

    # -- measuring ------------------------------------------------------------------

    def outbound(self, i: int) -> int:
        switch = self.switches[i]
        return sum(
            1
            for node_id, p in switch.peers.items()
            if p.is_outbound and p.state == "connected" and self.index[node_id] >= self.n_seeds
        )

    def full(self) -> int:
        """Non-seed nodes with ``max_outbound_peers`` outbound sessions to non-seed nodes."""
        return sum(1 for i in range(self.n_seeds, self.n) if self.outbound(i) >= self.target)

    def run_until_full(self, limit: float, *, sample: float = 1.0, curve: list | None = None) -> float | None:
        """Run until every non-seed node has its outbound peers; returns the simulated
        seconds it took, or None if ``limit`` passed first."""
        start = self.clock.seconds()
        need = self.n - self.n_seeds
        for _ in range(int(limit / sample) + 1):
            full = self.full()
            if curve is not None:
                curve.append((round(self.clock.seconds(), 3), full))
            if full == need:
                return self.clock.seconds() - start
            if self.progress and int(self.clock.seconds()) % 30 == 0:
                print(f"t={self.clock.seconds():.0f}s full {full}/{need}", file=sys.stderr, flush=True)
            self.clock.run(sample)
        return None

    def run_sampled(self, seconds: float, curve: list | None, *, sample: float = 1.0) -> None:
        """Let ``seconds`` pass, adding ``(time, nodes with full outbound peers)`` to
        ``curve`` every ``sample`` seconds (just run if ``curve`` is None)."""
        if curve is None:
            self.clock.run(seconds)
            return
        steps = max(1, round(seconds / sample))
        for _ in range(steps):
            self.clock.run(seconds / steps)
            curve.append((round(self.clock.seconds(), 3), self.full()))

    def graph(self) -> dict[int, set[int]]:
        """The undirected graph of connected sessions between non-seed nodes."""
        adjacency: dict[int, set[int]] = {i: set() for i in range(self.n_seeds, self.n)}
        for i in range(self.n_seeds, self.n):
            for node_id, p in self.switches[i].peers.items():
                j = self.index[node_id]
                if j >= self.n_seeds and p.state == "connected":
                    adjacency[i].add(j)
                    adjacency[j].add(i)
        return adjacency

    def counters(self) -> collections.Counter:
        total = collections.Counter(self.retired_counters)
        for pex in self.pex:
            total.update(pex.counters)
        return total

    def bytes_moved(self) -> int:
        return self.network.delivered_bytes()


def bfs_stats(adjacency: dict[int, set[int]]) -> dict:
    """Connectedness, diameter (exact, a BFS from every node) and average clustering."""
    nodes = list(adjacency)
    diameter, total_distance, pairs, connected = 0, 0, 0, True
    for source in nodes:
        seen = {source: 0}
        frontier = [source]
        while frontier:
            nxt = []
            for u in frontier:
                for v in adjacency[u]:
                    if v not in seen:
                        seen[v] = seen[u] + 1
                        nxt.append(v)
            frontier = nxt
        if len(seen) < len(nodes):
            connected = False
        diameter = max(diameter, max(seen.values()))
        total_distance += sum(seen.values())
        pairs += len(seen) - 1
    clustering = []
    for u in nodes:
        neighbours = adjacency[u]
        k = len(neighbours)
        if k < 2:
            clustering.append(0.0)
            continue
        links = sum(len(adjacency[v] & neighbours) for v in neighbours) / 2
        clustering.append(links / (k * (k - 1) / 2))
    degrees = [len(adjacency[u]) for u in nodes]
    return {
        "connected": connected,
        "diameter": diameter,
        "mean_distance": round(total_distance / pairs, 3) if pairs else 0.0,
        "clustering": round(sum(clustering) / len(clustering), 4) if clustering else 0.0,
        "degree_min": min(degrees, default=0),
        "degree_mean": round(sum(degrees) / len(degrees), 2) if degrees else 0.0,
        "degree_max": max(degrees, default=0),
    }


def churn(
    sim: Simulation, *, minutes: int, fraction: float = 0.1, partition: float = 25.0, curve: list | None = None
) -> dict:
    """Restart ``fraction`` of the non-seed nodes every simulated minute; a partition of
    20% of them from the rest in the middle, healed after ``partition`` seconds."""
    movable = list(range(sim.n_seeds, sim.n))
    cut = 0
    for minute in range(minutes):
        for i in sim.rng.sample(movable, max(1, int(len(movable) * fraction))):
            sim.restart(i)
        if minute == minutes // 2:
            side = sim.rng.sample(movable, max(1, len(movable) // 5))
            rest = [sim.switches[i] for i in range(sim.n) if i not in set(side)]
            cut = sim.network.partition([sim.switches[i] for i in side], rest)
            sim.run_sampled(partition, curve)
            sim.network.heal()
            sim.run_sampled(60.0 - partition, curve)
        else:
            sim.run_sampled(60.0, curve)
    return {"restarts": sim.restarts, "partition_paths": cut}


def check_streams(sim: Simulation) -> dict:
    """Every resumed session that is still open on both sides delivered exactly what its
    sender accepted (no loss, no duplicate, in order: ``received`` checked order)."""
    checked = 0
    for key in sorted(sim.resumed):
        sender_id, receiver_id, session_id = key
        sender = sim.switches[sim.index[sender_id]]
        peer = sender.peers.get(receiver_id)
        if peer is None or peer.state != "connected" or peer.session.id != session_id:
            continue
        if sim.accepted[(sender_id, receiver_id, session_id)] == 0:
            continue
        got = sim.delivered[key]
        accepted = sim.accepted[(sender_id, receiver_id, session_id)]
        if got != list(range(accepted)):
            sim.violations.append(f"{sender_id[:8]}->{receiver_id[:8]}: accepted {accepted}, delivered {len(got)}")
        checked += 1
    return {"resumed_sessions": len(sim.resumed), "resumed_checked": checked, "violations": len(sim.violations)}


#: The victim's PexReactor without the restart rules (specs/pex.md section 3.11): no
#: anchors, and a ``session_held`` refusal is a failure at once (held_wait 0).
WITHOUT_RESTART_RULES = {"anchors": 0, "held_wait": 0.0}


def eclipse(
    groups: int,
    *,
    honest: int = 100,
    per_group: int = 16,
    seed: int = 1,
    attack: float = 600.0,
    restart_rules: bool = True,
    waits: tuple = (60.0, 300.0),
    config: Config = CONFIG,
) -> dict:
    """An eclipse attack in the style of Heilman et al. (2015) on one node's book.

    An honest network of ``honest`` nodes forms; the victim (node 3) keeps its book in a
    file. The attacker runs ``per_group`` nodes in each of ``groups`` /16s (hosts
    101.x.j.1 up); each knows only the attacker's addresses, dials the victim (persistent:
    it holds inbound slots and comes back), and answers the victim's requests with
    attacker addresses only. After ``attack`` seconds the victim's process restarts with
    its book file; measured: the fraction of its outbound peers the attacker holds at
    each of ``waits`` seconds after, and of its book's entries in each table. Without
    ``restart_rules`` the victim has no anchors and takes a ``session_held`` refusal for
    a failure (as PEX did before them).
    """
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        book = f"{tmp}/victim.json"
        options = {} if restart_rules else {3: WITHOUT_RESTART_RULES}
        sim = Simulation(honest, seed=seed, streamers=0, addrbook_files={3: book}, pex_options=options, config=config)
        formed = sim.run_until_full(1800.0)
        victim = 3
        evil_ids: set[str] = set()
        evil_hosts = [f"{101 + g // 250}.{g % 250}.{j}.1" for g in range(groups) for j in range(per_group)]
        evil = []
        for host in evil_hosts:
            key = NodeKey(Ed25519PrivateKey.from_private_bytes(sim.rng.randbytes(32)))
            pex = PexReactor(
                request_interval=sim.request_interval, target_outbound=0, rng=random.Random(sim.rng.getrandbits(64))
            )
            switch = sim.network.switch([pex], host=host, node_key=key, config=sim.config)
            switch.listen(f"tcp:{PORT}")
            switch.startService()
            evil.append((switch, pex))
            evil_ids.add(switch.node_id)
        addresses = [sim.network.dial_address(s, PORT) for s, _ in evil]
        for switch, pex in evil:
            for address in sim.rng.sample(addresses, min(len(addresses), pex.max_addresses)):
                if not address.startswith(switch.node_id):
                    pex.add_address(address, source=switch.node_id, source_host=sim.network.host_of(switch))
            d = switch.dial(sim.network.dial_address(sim.switches[victim], PORT), persistent=True)
            d.addErrback(lambda failure: None)
        sim.clock.run(attack)
        before = _book_share(sim.pex[victim], evil_ids)
        sim.pex[victim].save_book()
        sim.restart(victim)
        shares: dict = {}
        restarted = sim.clock.seconds()
        for wait in waits:
            sim.clock.run(restarted + wait - sim.clock.seconds())
            out = [n for n, p in sim.switches[victim].peers.items() if p.is_outbound and p.state == "connected"]
            label = f"after_{wait:g}s"
            shares[label] = round(sum(1 for n in out if n in evil_ids) / len(out), 3) if out else None
            shares[label + "_outbound"] = len(out)
        counters = sim.pex[victim].counters
        return {
            "groups": groups,
            "restart_rules": restart_rules,
            "anchor_dials": counters["anchor_dials"],
            "dials_held": counters["dials_held"],
            "attacker_nodes": len(evil),
            "honest": honest,
            "formed_s": formed,
            "book_before_restart": before,
            "book_after": _book_share(sim.pex[victim], evil_ids),
            **shares,
        }


def _book_share(pex: PexReactor, evil: set) -> dict:
    """The attacker's entries in each table of ``pex``'s book, and the tables' sizes."""
    entries = list(pex.book.values())
    counts = {"new": 0, "tried": 0, "evil_new": 0, "evil_tried": 0}
    for e in entries:
        table = "tried" if e.tried else "new"
        counts[table] += 1
        if e.address.node_id in evil:
            counts["evil_" + table] += 1
    return counts


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--streamers", type=int, default=10)
    parser.add_argument("--form-limit", type=float, default=1800.0)
    parser.add_argument("--churn-minutes", type=int, default=4)
    parser.add_argument("--partition", type=float, default=25.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "out"))
    parser.add_argument("--per-group", type=int, default=16)
    parser.add_argument("--eclipse", default="", help="attacker group counts, e.g. 1,4,16 (runs only that)")
    parser.add_argument(
        "--restart-rules",
        choices=("on", "off", "both"),
        default="both",
        help="the eclipse victim (or, off, every node of the network run) with anchors and the "
        "session_held wait (on), without (off), or both (the eclipse)",
    )
    args = parser.parse_args(argv)
    if args.eclipse:
        rules = {"on": (True,), "off": (False,), "both": (False, True)}[args.restart_rules]
        rows = []
        for k in args.eclipse.split(","):
            for on in rules:
                row = eclipse(int(k), seed=args.seed, per_group=args.per_group, restart_rules=on)
                print(json.dumps({"bench": "sim_network_eclipse", **row}), flush=True)
                rows.append(row)
        return {"eclipse": rows}

    wall = time.perf_counter()
    without = {i: WITHOUT_RESTART_RULES for i in range(args.nodes)} if args.restart_rules == "off" else {}
    sim = Simulation(args.nodes, seeds=args.seeds, seed=args.seed, streamers=args.streamers, pex_options=without)
    sim.progress = True
    curve: list = []
    formed = sim.run_until_full(args.form_limit, curve=curve)
    formed_counters = sim.counters()
    mesh = bfs_stats(sim.graph())
    result = {
        "bench": "sim_network",
        "nodes": args.nodes,
        "seeds": args.seeds,
        "seed": args.seed,
        "target_outbound": sim.target,
        "request_interval": sim.request_interval,
        "restart_rules": args.restart_rules != "off",
        "formed_s": formed,
        "mesh": mesh,
        "dials": formed_counters["dials"],
        "dial_failures": formed_counters["dial_failures"],
        "pex_requests": formed_counters["requests_sent"],
        "bytes": sim.bytes_moved(),
        "links": sim.network.links_opened,
        "wall_form_s": round(time.perf_counter() - wall, 1),
    }
    if args.churn_minutes:
        sim.start_stream()
        sim.run_sampled(5.0, curve)
        result["churn"] = churn(sim, minutes=args.churn_minutes, partition=args.partition, curve=curve)
        churn_end = sim.clock.seconds()
        recovered = sim.run_until_full(args.form_limit, curve=curve)
        result["recovered_s"] = recovered
        sim.stop_stream()
        sim.clock.run(30.0)  # what is in flight arrives, acknowledgements settle
        result["churn"].update(check_streams(sim))
        result["churn"]["mesh_after"] = bfs_stats(sim.graph())
        result["churn"]["churn_end_s"] = round(churn_end, 1)
        result["violations"] = sim.violations[:5]
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    result["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_network.json").write_text(json.dumps({**result, "curve": curve}) + "\n")
    chart(curve, result, out / "sim_network.png")
    print(json.dumps(result))
    return result


def chart(curve: list, result: dict, path: pathlib.Path) -> bool:
    """Nodes with full outbound peers over simulated time; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([t for t, _ in curve], [n for _, n in curve], lw=1.2)
    ax.axhline(result["nodes"] - result["seeds"], color="grey", lw=0.6, ls="--")
    churn = result.get("churn")
    if churn:
        start = result["formed_s"] or 0.0
        ax.axvspan(start, churn["churn_end_s"], color="orange", alpha=0.15, label="churn + partition")
        ax.legend(loc="lower right")
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel(f"nodes with {result['target_outbound']} outbound peers")
    ax.set_title(f"{result['nodes']} nodes, PEX from {result['seeds']} seeds (seed {result['seed']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    main()
