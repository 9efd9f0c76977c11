"""Which files the pipeline reads: the user's LOGS resolved to telemetry files (specs/pipeline.md section 2.1).

LOGS are files, directories, globs and remote URIs. Before Spark starts, each local one
is resolved to concrete files, and only telemetry files are kept:

* a directory is walked recursively; a file in it is a candidate when its name looks
  like telemetry (``TELEMETRY_NAME``: ``.json``, ``.jsonl`` or ``.ndjson``, then
  an optional rotation index ``.N``, then an optional ``.gz`` or ``.bz2``). Other names
  (``n0.key``, ``twistd.log``) are skipped and named in one warning; names starting with ``.``
  or ``_`` are skipped as Spark skips them;
* a glob (``*``, ``?``, ``[``; ``**`` crosses directories) selects what it matches, a
  directory it matches as above;
* a file named on the command line is a candidate whatever its name;
* the rotated files of a candidate (``PATH.1``, ``PATH.2``, ...) come along, so a glob
  like ``logs/*.json`` reads every rotation.

A candidate is read only when its first record is a telemetry record: a JSON object
(after an optional record separator, version 1) with a string ``event`` and
``node_id``. Anything else is skipped with a warning that names the file and never its
content (a private key in the same directory must not reach a table or the report).
An empty file is skipped without a word. Remote URIs (``hdfs://``, ``s3a://``) are
handed to Spark unchanged.

A local path that does not exist, or a glob that matches nothing, is an
:class:`InputError` (one line, raised before Spark starts), and so is a selection with
no telemetry file left. A node's files with a gap in their rotation indices
(``PATH.1`` and ``PATH.3`` without ``PATH.2``, or rotated files without ``PATH``) get a
warning: their records are missing from the tables.

:func:`redact` removes what looks like key material (PEM blocks, long base64 or hex
runs) from any text shown as an example.
"""

from __future__ import annotations

import bz2
import dataclasses
import glob
import gzip
import json
import os
import re

#: Names a telemetry file may have inside a directory: a JSON suffix, a rotation index,
#: a compression suffix (groups: base, rotation index).
TELEMETRY_NAME = re.compile(r"^(.+\.(?:json|jsonl|ndjson))(?:\.(\d+))?(?:\.(?:gz|bz2))?$")
#: Bytes read at most to find a file's first record (records are a few KB).
FIRST_RECORD_BYTES = 1 << 20
RECORD_SEPARATOR = "\x1e"
_ROTATED = re.compile(r"^(.+)\.(\d+)$")
_COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open}
_GLOB = re.compile(r"[*?\[]")
#: Rotated siblings looked for at most per file (telemetry keeps 10 by default).
MAX_ROTATIONS = 10_000


class InputError(Exception):
    """The input cannot be read: a local path missing, a glob matching nothing, no telemetry file left."""


@dataclasses.dataclass
class Inputs:
    """What to read: ``paths`` (local files and remote URIs, in order) and one line per ``warnings``."""

    paths: list[str]
    warnings: list[str]


def resolve(logs: list[str]) -> Inputs:
    """The telemetry files behind ``logs`` (see the module doc); raises :class:`InputError`."""
    candidates: list[str] = []
    remote: list[str] = []
    warnings: list[str] = []
    for log in logs:
        if log.startswith("file:"):
            log = "/" + log[len("file:"):].lstrip("/")
        elif "://" in log:
            remote.append(log)
            continue
        candidates += _expand(log, warnings)
    paths, seen, listings = [], set(), {}
    for path in candidates:
        for file in [path] + _rotations(path, listings):
            key = os.path.realpath(file)
            if key in seen:
                continue
            seen.add(key)
            verdict = first_record_verdict(file)
            if verdict is None:
                paths.append(file)
            elif verdict:
                warnings.append(f"skipped {file}: {verdict}")
    if not paths and not remote:
        raise InputError(f"no telemetry file in {' '.join(logs)}" + (f" ({warnings[-1]})" if warnings else ""))
    warnings += rotation_gaps(paths)
    return Inputs(paths + remote, warnings)


def _expand(log: str, warnings: list[str]) -> list[str]:
    """The candidate files of one local LOGS entry."""
    if _GLOB.search(log):
        matches = sorted(glob.glob(log, recursive=True))
        if not matches:
            raise InputError(f"{log}: no file matches this pattern")
    elif not os.path.exists(log):
        raise InputError(f"{log}: no such file or directory")
    else:
        matches = [log]
    found, unnamed = [], []
    for match in matches:
        if os.path.isdir(match):
            files, others = _walk(match)
            found += files
            if others:
                warnings.append(f"skipped {len(others)} file(s) in {match} not named like telemetry: {_few(others)}")
        # A file the user named is a candidate whatever its name; a glob's match, by its name.
        elif match == log or TELEMETRY_NAME.match(os.path.basename(match)):
            found.append(match)
        else:
            unnamed.append(match)
    if unnamed:
        warnings.append(f"skipped {len(unnamed)} file(s) matching {log} not named like telemetry: {_few(unnamed)}")
    return found


def _few(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _walk(directory: str) -> tuple[list[str], list[str]]:
    """Telemetry-named files under ``directory`` (sorted), and the names of the others."""
    files, others = [], []
    for top, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(names):
            if name.startswith((".", "_")):
                continue
            (files if TELEMETRY_NAME.match(name) else others).append(os.path.join(top, name))
    return files, [os.path.relpath(o, directory) for o in others]


def _rotations(path: str, listings: dict) -> list[str]:
    """``PATH.1``, ``PATH.2``, ... that exist, for a file that is not itself rotated.

    ``listings`` caches each directory's rotated files by base name (one listing per directory)."""
    if _ROTATED.match(path) or os.path.splitext(path)[1] in _COMPRESSED:
        return []
    directory, name = os.path.split(path)
    if directory not in listings:
        rotated: dict[str, list[int]] = {}
        for entry in os.listdir(directory or "."):
            match = _ROTATED.match(entry)
            if match:
                rotated.setdefault(match.group(1), []).append(int(match.group(2)))
        listings[directory] = rotated
    indices = sorted(listings[directory].get(name, []))[:MAX_ROTATIONS]
    return [f"{path}.{n}" for n in indices]


def first_record_verdict(path: str) -> str | None:
    """None if ``path`` starts with a telemetry record; "" if it is empty; else why it is
    not telemetry (the reason never quotes the file)."""
    opener = _COMPRESSED.get(os.path.splitext(path)[1], open)
    try:
        with opener(path, "rb") as f:
            head = f.read(FIRST_RECORD_BYTES)
    except (OSError, EOFError) as error:
        return f"cannot read it ({error.strerror or type(error).__name__})" if isinstance(error, OSError) else (
            "a compressed file cut short")
    text = head.decode("utf-8", errors="replace")
    line = next((piece for raw in text.split("\n") for piece in raw.split(RECORD_SEPARATOR) if piece.strip()), None)
    if line is None:
        return "" if not head.strip() else "not telemetry (no record in its first MiB)"
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        return "not telemetry (its first line is not a JSON object)"
    if not isinstance(record, dict):
        return "not telemetry (its first line is not a JSON object)"
    if not isinstance(record.get("event"), str) or not isinstance(record.get("node_id"), str):
        return 'not telemetry (its first record has no "event" and "node_id")'
    return None


def rotation_gaps(paths: list[str]) -> list[str]:
    """One warning per log whose rotated files have a gap: a missing index, or no live file."""
    indices: dict[str, set[int]] = {}
    for path in paths:
        match = TELEMETRY_NAME.match(os.path.basename(path)) or _ROTATED.match(os.path.basename(path))
        if match is None:
            continue
        base = os.path.join(os.path.dirname(path), match.group(1))
        indices.setdefault(base, set()).add(int(match.group(2) or 0))
    warnings = []
    for base, present in sorted(indices.items()):
        ordered = sorted(present)
        count = ordered[-1] + 1 - len(ordered)  # indices 0 .. max not present
        if count:
            missing, expected = [], 0  # the first five, without listing a range sized by a file name
            for index in ordered:
                missing += range(expected, min(index, expected + 5 - len(missing)))
                expected = index + 1
            names = ", ".join(base if n == 0 else f"{base}.{n}" for n in missing)
            more = f" and {count - len(missing)} more" if count > len(missing) else ""
            warnings.append(f"gap in the rotated files of {base}: {names}{more} missing; their records are not read")
    return warnings


_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|$)", re.S)
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]{40,}={0,2}")
_HEX = re.compile(r"[0-9a-fA-F]{64,}")


def redact(text: str | None) -> str | None:
    """``text`` without what looks like key material: PEM blocks (a cut one to its end),
    hex runs of 64 characters or more (a 32-byte secret; node ids have 40), and base64
    runs of 40 or more that mix digits, upper and lower case (random bytes do, words and
    paths rarely)."""
    if text is None:
        return None
    text = _PEM.sub("[redacted PEM block]", text)
    text = _HEX.sub(lambda m: f"[redacted {len(m.group())} hex characters]", text)

    def base64(match: re.Match) -> str:
        run = match.group()
        mixed = any(c.isdigit() for c in run) and any(c.isupper() for c in run) and any(c.islower() for c in run)
        return f"[redacted {len(run)} characters]" if mixed else run

    return _BASE64.sub(base64, text)
