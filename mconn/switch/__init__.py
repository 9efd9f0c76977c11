"""mconn's node: the Switch, its peers, sessions, dialing and routing to Reactors.

The rule: this layer uses the core and the net layer below it, never the ops layer
above. The modules, in reading order:

* ``reactor``: the Reactor contract node software subclasses (specs/reactor-api.md);
* ``switch``: the Switch: lifecycle, listen, dial, invariants;
* ``routing``: every call into reactors, and the error policy;
* ``connection_set``: the live connections, the owner each connection talks to;
* ``authorize``: may a node whose id is proven join;
* ``bans``: node ids a reactor marked bad, refused and not dialed for a while;
* ``session_manager``: the peer table and every session's lifecycle;
* ``session_limits``: dormant sessions make room instead of locking a node out;
* ``duplicates``: is a session's live connection still there;
* ``session_telemetry``: the telemetry of a session's lifecycle;
* ``node_counters``: per-node counters that outlive sessions;
* ``peer``: a session with another node, as reactors see it; sending;
* ``peer_delivery``: its receiving side;
* ``channel_shape``: what every Peer shares about the Switch's channels;
* ``peer_stats``: a Peer's counters at one moment;
* ``session_store``: sessions kept in a file, to survive a restart (opt-in);
* ``session_store_file``: that file: its schema, the checks at open, the load, the transaction;
* ``durable``: the Switch's session store opened, bounded, and the reactors' committed counts;
* ``persistent``: keep nodes connected, re-dial suspended sessions;
* ``dialer``: re-dialing over a pool of addresses, with backoff;
* ``telemetry``: every event mconn logs, by stable name (specs/telemetry.md).
"""
