"""The ``mconn`` command: node keys and a running node's status.

::

    mconn keygen PATH    write a new node key (mode 0600); refuses to overwrite a file
    mconn id PATH        print the node id of a key
    mconn status URL     print a running node's status page (URL/status.json) as a table

Output to a pipe that its reader closes early (``mconn status URL | head -3``) ends the
command quietly, with exit status 0.

Running a node is twistd's job: ``twistd -n mconn --help``.

The status document (``GET URL/status.json``, served by ``twistd mconn --status ENDPOINT``,
mconn/ops/status.py) is specified field by field in specs/status.md; the fields read here::

    {"node_id": str, "listen_addresses": [str],
     "peers": [{"node_id": str, "state": str, "remote_address": str,
                "uptime": seconds (number), "resumes": int,
                "round_trip": seconds (number) or null, "channels": [...]}]}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

from mconn.core.node_key import NodeKey

#: Seconds ``mconn status`` waits for the node's answer.
STATUS_TIMEOUT = 10.0


def main(argv: list[str] | None = None) -> int:
    """Run one command; 0 on success, 1 with one line on stderr on failure, 2 for bad usage."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        args.command(args)
        sys.stdout.flush()
    except CommandError as e:
        print(f"mconn {args.name}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader stopped early (``mconn status URL | head -3``): that is its choice,
        # not an error. Point stdout at /dev/null so that the flush at exit is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


class CommandError(Exception):
    """What went wrong, for one line on stderr."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mconn", description="Node keys and status; run nodes with: twistd mconn")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    keygen = commands.add_parser("keygen", help="write a new node key (mode 0600); never overwrites")
    keygen.add_argument("path")
    keygen.set_defaults(command=keygen_command, name="keygen")
    node_id = commands.add_parser("id", help="print the node id of a key file")
    node_id.add_argument("path")
    node_id.set_defaults(command=id_command, name="id")
    status = commands.add_parser("status", help="print a running node's status (URL/status.json) as a table")
    status.add_argument("url", help="the node's status page, e.g. http://127.0.0.1:8080")
    status.set_defaults(command=status_command, name="status")
    return parser


# -- keys ------------------------------------------------------------------------------


def keygen_command(args) -> None:
    key = NodeKey.generate()
    directory, name = os.path.split(os.path.abspath(args.path))
    temporary = os.path.join(directory, f".{name}.keygen.{os.getpid()}")
    try:
        key.save(temporary)  # 0600, complete on disk
        os.link(temporary, args.path)  # fails if the path exists: never overwrites
    except FileExistsError:
        raise CommandError(f"{args.path} already exists; remove it first to replace the key") from None
    except OSError as e:
        raise CommandError(f"cannot write {args.path}: {e.strerror or e}") from None
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    print(f"wrote {args.path}: node id {key.node_id}")


def id_command(args) -> None:
    try:
        print(NodeKey.load(args.path).node_id)
    except ValueError as e:
        raise CommandError(str(e)) from None


# -- status ----------------------------------------------------------------------------


def status_command(args) -> None:
    print(format_status(fetch_status(args.url)))


def status_url(url: str) -> str:
    """``URL/status.json`` (``http://`` added if no scheme; a URL ending in .json is kept)."""
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith(".json") else url.rstrip("/") + "/status.json"


def fetch_status(url: str) -> dict:
    """The status document of the node at ``url``."""
    target = status_url(url)
    try:
        with urllib.request.urlopen(target, timeout=STATUS_TIMEOUT) as response:
            body = response.read()
    except urllib.error.HTTPError as e:
        raise CommandError(f"{target}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CommandError(f"cannot reach {target}: {getattr(reason, 'strerror', None) or reason}") from None
    try:
        document = json.loads(body)
    except ValueError as e:
        raise CommandError(f"{target} is not JSON: {e}") from None
    if not isinstance(document, dict) or not isinstance(document.get("peers", []), list):
        raise CommandError(f"{target} is not an mconn status document")
    return document


PEER_COLUMNS = ("PEER", "STATE", "ADDRESS", "UPTIME", "RESUMES", "RTT")


def format_status(document: dict) -> str:
    """The status document as text: the node, its listen addresses, a table of peers."""
    lines = [
        f"node       {document.get('node_id', '?')}",
        f"listening  {', '.join(document.get('listen_addresses') or []) or '-'}",
        "",
    ]
    rows = [PEER_COLUMNS] + [
        (
            str(peer.get("node_id", "?")),
            str(peer.get("state", "?")),
            str(peer.get("remote_address") or "-"),
            format_duration(peer.get("uptime")),
            str(peer.get("resumes", "-")),
            format_round_trip(peer.get("round_trip")),
        )
        for peer in document.get("peers", [])
        if isinstance(peer, dict)
    ]
    if len(rows) == 1:
        return "\n".join(lines + ["no peers"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(PEER_COLUMNS))]
    numeric = {3, 4, 5}
    for row in rows:
        cells = [cell.rjust(w) if i in numeric else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_duration(seconds) -> str:
    """``42s``, ``3m07s``, ``2h05m``, ``3d04h``; ``-`` if unknown."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_round_trip(seconds) -> str:
    """Milliseconds with one decimal; ``-`` if not measured yet."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        return "-"
    return f"{seconds * 1000:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
