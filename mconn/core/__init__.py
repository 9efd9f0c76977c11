"""mconn's sans-I/O core: bytes and ``now`` in, events and bytes out.

The rule: nothing here imports Twisted, zope or autobahn, reads a clock or touches a
socket (tests/core/test_import_graph.py and the I/O-free test import every module of
this folder). The modules, in reading order:

* ``wire_primitives``: go-wire's uvarint, byte slices and strings;
* ``wire``: every packet, declared once with construct (specs/wire.md);
* ``pre_hello``: the 8 clear bytes of an upgraded TLS start;
* ``frame_buffer``: bytes in, whole packets out, lengths checked before bodies;
* ``speedups``: whether the compiled twin of the per-packet path (``_speedups.pyx``) runs;
* ``channel``: descriptors, send queues, chunking, reassembly, the priority scheduler;
* ``packet_size``: how large msg packets are cut;
* ``rate``: the token bucket of send_rate and recv_rate;
* ``events``: the facts the core reports;
* ``connection_table``: the MConnection's states, inputs and transitions, as data;
* ``connection``: the MConnection (specs/connection.md);
* ``handshake``: the hello exchange;
* ``node_info``: what a node announces, and whether two nodes can work together;
* ``node_key``: the Ed25519 identity and the node id;
* ``private_file``: files only their owner may read, written atomically;
* ``address``: PeerAddress, address scopes, which learnt addresses may be dialed;
* ``codec``: typed channels;
* ``session``: a session's counters, recovery buffer and acks (specs/resume.md);
* ``session_table``: the session lifecycle as data;
* ``session_ref``: a session's public name, for telemetry;
* ``admission``: per-address and pending-handshake limits, address groups.
"""
