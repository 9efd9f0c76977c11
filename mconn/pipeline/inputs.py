"""Which files the pipeline reads: the user's LOGS resolved to telemetry files (specs/pipeline.md section 2.1).

LOGS are files, directories, globs and remote URIs. Before Spark starts, each local one
is resolved to concrete files, and only telemetry files are kept:

* a directory is walked recursively; a file in it is a candidate when its name looks
  like telemetry (``TELEMETRY_NAME``: ``.json``, ``.jsonl`` or ``.ndjson``, then
  an optional closed-file suffix ``.<UTC time>-<seq>`` or an older rotation index ``.N``,
  then an optional ``.gz`` or ``.bz2``). Other names
  (``n0.key``, ``twistd.log``) are skipped and named in one warning; names starting with ``.``
  or ``_`` are skipped as Spark skips them;
* a glob (``*``, ``?``, ``[``; ``**`` crosses directories) selects what it matches, a
  directory it matches as above;
* a file named on the command line is a candidate whatever its name;
* the rotated files of a candidate (its closed files ``PATH.<UTC time>-<seq>``
  (specs/telemetry.md section 2.1), and ``PATH.1``, ``PATH.2``, ... of the older layout)
  come along, so a glob like ``logs/*.json`` reads every rotation.

The walk is bounded and never loops: neither a directory walk nor ``**`` enters a
directory through a symbolic link (such links are named in one warning; a link named
on the command line, or crossed by a fixed component of a pattern, is followed: the
pattern's length bounds those), and at most ``max_entries`` directory entries
(``MAX_WALK_ENTRIES`` unless ``--max-walk-entries`` says otherwise) are looked at in
all: one more is an :class:`InputError` naming the bound. Only regular files are read:
a FIFO, a socket or a device, even named like telemetry, is skipped with a warning
that names it and what it is, and never opened in a way that could block.

A candidate is read only when its first record is a telemetry record: a JSON object
(after an optional record separator, version 1) with a string ``event`` and
``node_id``. Anything else is skipped with a warning that names the file and never its
content (a private key in the same directory must not reach a table or the report).
An empty file is skipped without a word. Remote URIs (``hdfs://``, ``s3a://``) are
handed to Spark unchanged.

A local path that does not exist, or a glob that matches nothing, is an
:class:`InputError` (one line, raised before Spark starts), and so is a selection with
no telemetry file left. A node's files with a gap in their rotation indices
(``PATH.1`` and ``PATH.3`` without ``PATH.2``, or rotated files without ``PATH``) or in
their closed files' sequence numbers (``-000004`` and ``-000006`` without ``-000005``) get a
warning: their records are missing from the tables.

:func:`redact` removes what looks like key material (PEM blocks, long base64 or hex
runs) from any text shown as an example.
"""

from __future__ import annotations

import bz2
import dataclasses
import fnmatch
import gzip
import itertools
import json
import os
import re
import stat

#: Names a telemetry file may have inside a directory: a JSON suffix, an older rotation
#: index or a closed file's suffix, a compression suffix (groups: base, rotation index,
#: closed file's sequence number).
TELEMETRY_NAME = re.compile(r"^(.+\.(?:json|jsonl|ndjson))(?:\.(\d+)|\.\d{8}T\d{6}Z-(\d+))?(?:\.(?:gz|bz2))?$")
#: A Hadoop glob, under a directory, matching the closed telemetry files in it and no live
#: one (specs/telemetry.md section 2.1): what ``mconn-pipeline --follow`` reads.
CLOSED_GLOB = "*.{json,jsonl,ndjson}.[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]T[0-9][0-9][0-9][0-9][0-9][0-9]Z-[0-9]*"
#: Bytes read at most to find a file's first record (records are a few KB).
FIRST_RECORD_BYTES = 1 << 20
RECORD_SEPARATOR = "\x1e"
_ROTATED = re.compile(r"^(.+)\.(\d+)$")
#: A closed file (groups: its log's PATH, its sequence number).
_CLOSED = re.compile(r"^(.+)\.\d{8}T\d{6}Z-(\d+)$")
_COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open}
_GLOB = re.compile(r"[*?\[]")
#: Rotated siblings looked for at most per file (telemetry keeps 10 by default).
MAX_ROTATIONS = 10_000
#: Directory entries looked at, at most, to resolve one run's LOGS (``--max-walk-entries``):
#: a thousand nodes' logs with every rotation kept are some 11,000 files.
MAX_WALK_ENTRIES = 1_000_000
#: What a file that is not a regular file is, by its ``stat`` type (the reason it is skipped).
_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


class InputError(Exception):
    """The input cannot be read: a local path missing, a glob matching nothing, no telemetry file left."""


@dataclasses.dataclass
class Inputs:
    """What to read: ``paths`` (local files and remote URIs, in order) and one line per ``warnings``."""

    paths: list[str]
    warnings: list[str]


class Budget:
    """The directory entries a resolution may still look at; one more is an InputError."""

    def __init__(self, entries: int) -> None:
        self.limit = self.left = entries

    def take(self, directory: str, count: int = 1) -> None:
        """Count ``count`` entries of ``directory``; raises :class:`InputError` past the limit."""
        self.left -= count
        if self.left < 0:
            raise InputError(
                f"looked at more than {self.limit} directory entries (at {directory or os.curdir}); "
                "name fewer or narrower LOGS, or raise --max-walk-entries"
            )


def resolve(logs: list[str], max_entries: int = MAX_WALK_ENTRIES) -> Inputs:
    """The telemetry files behind ``logs`` (see the module doc), looking at most at
    ``max_entries`` directory entries; raises :class:`InputError`."""
    candidates: list[str] = []
    remote: list[str] = []
    warnings: list[str] = []
    budget = Budget(max_entries)
    for log in logs:
        if log.startswith("file:"):
            log = "/" + log[len("file:") :].lstrip("/")
        elif "://" in log:
            remote.append(log)
            continue
        candidates += _expand(log, warnings, budget)
    paths: list[str] = []
    seen: set[str] = set()
    listings: dict[str, dict[str, list[tuple[int, str]]]] = {}
    for path in candidates:
        for file in [path] + _rotations(path, listings, budget):
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


def _expand(log: str, warnings: list[str], budget: Budget) -> list[str]:
    """The candidate files of one local LOGS entry."""
    links: list[str] = []
    if _GLOB.search(log):
        matches = sorted(set(glob_matches(log, budget, links)))
        links = sorted(set(links))  # two ``**`` of one pattern may meet a link twice
        if links:
            warnings.append(f"did not follow {len(links)} directory link(s) matching {log}: {_few(links)}")
        if not matches:
            raise InputError(f"{log}: no file matches this pattern")
    elif not os.path.exists(log):
        raise InputError(f"{log}: no such file or directory")
    else:
        matches = [log]
    found: list[str] = []
    unnamed: list[str] = []
    for match in matches:
        if os.path.isdir(match):
            files, others, dir_links = _walk(match, budget)
            found += files
            if others:
                warnings.append(f"skipped {len(others)} file(s) in {match} not named like telemetry: {_few(others)}")
            if dir_links:
                warnings.append(
                    f"did not follow {len(dir_links)} directory link(s) in {match}: {_few(sorted(dir_links))}"
                )
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


def _walk(directory: str, budget: Budget) -> tuple[list[str], list[str], list[str]]:
    """Telemetry-named files under ``directory``, in ``os.walk``'s top-down order with
    names sorted; the names of the others; and the directory links not followed (both
    relative to ``directory``)."""
    files: list[str] = []
    others: list[str] = []
    links: list[str] = []
    stack = [directory]
    while stack:
        top = stack.pop()
        entries = sorted(_entries(top, budget), key=lambda entry: entry.name)
        subdirs = []
        for entry in entries:
            if entry.name.startswith((".", "_")):
                continue
            if _is_real_dir(entry):
                subdirs.append(entry.path)
            elif _is_dir_link(entry):
                links.append(entry.path)
            else:
                (files if TELEMETRY_NAME.match(entry.name) else others).append(entry.path)
        stack += reversed(subdirs)
    return files, [os.path.relpath(o, directory) for o in others], [os.path.relpath(k, directory) for k in links]


def _entries(directory: str, budget: Budget) -> list:
    """The ``os.DirEntry`` of ``directory``, each counted in ``budget``; none if it cannot
    be listed (as ``os.walk`` and ``glob`` skip it)."""
    entries = []
    try:
        with os.scandir(directory or os.curdir) as listing:
            for entry in listing:
                budget.take(directory)
                entries.append(entry)
    except (NotADirectoryError, FileNotFoundError, PermissionError):
        pass
    return entries


def _is_real_dir(entry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_dir_link(entry) -> bool:
    try:
        return entry.is_symlink() and entry.is_dir()
    except OSError:
        return False


def glob_matches(pattern: str, budget: Budget, links: list[str] | None = None) -> list[str]:
    """What ``glob.glob(pattern, recursive=True)`` matches, except that ``**`` never
    enters a directory through a symbolic link (each such link goes to ``links``), and
    every directory entry looked at counts in ``budget``.

    As glob: ``*``, ``?`` and ``[...]`` match within one name, and not a name starting
    with ``.`` unless the pattern's does; ``**`` alone as a component matches zero or more
    directories (a final ``**`` matches the directory itself, walked as a directory).
    The components before the first wildcard are taken as they are, links and all.
    """
    links = [] if links is None else links
    parts = pattern.split(os.sep)
    first = next(i for i, part in enumerate(parts) if _GLOB.search(part))
    base = os.sep.join(parts[:first]) or (os.sep if pattern.startswith(os.sep) else "")
    rest = [part for part in parts[first:] if part]
    found: list[str] = []
    _select(base, rest, budget, links, found)
    return found


def _join(base: str, name: str) -> str:
    return os.path.join(base, name) if base else name


def _select(base: str, parts: list[str], budget: Budget, links: list[str], found: list[str]) -> None:
    """Append to ``found`` the paths under ``base`` that ``parts`` match (``glob_matches``)."""
    if not parts:
        found.append(base)
        return
    head, rest = parts[0], parts[1:]
    if head == "**":
        while rest and rest[0] == "**":
            rest = rest[1:]
        if not rest:
            found.append(base or os.curdir)  # walked as a directory by the caller
            return
        for directory in _directories(base, budget, links):
            _select(directory, rest, budget, links, found)
        return
    if not _GLOB.search(head):  # a fixed name: as glob, followed whatever it is
        budget.take(base)
        path = _join(base, head)
        if os.path.isdir(path) if rest else os.path.lexists(path):
            _select(path, rest, budget, links, found)
        return
    for entry in _entries(base, budget):
        if entry.name.startswith(".") and not head.startswith("."):
            continue
        if fnmatch.fnmatchcase(entry.name, head):
            path = _join(base, entry.name)
            if not rest:
                found.append(path)
            elif _is_real_dir(entry) or _is_dir_link(entry):  # one level: a link cannot loop here
                _select(path, rest, budget, links, found)


def _directories(base: str, budget: Budget, links: list[str]) -> list[str]:
    """``base`` and every directory below it that a name not starting with ``.`` reaches
    without crossing a symbolic link (the links met go to ``links``), top-down."""
    directories, stack = [], [base]
    while stack:
        top = stack.pop()
        directories.append(top)
        below = []
        for entry in _entries(top, budget):
            if entry.name.startswith("."):
                continue
            if _is_real_dir(entry):
                below.append(_join(top, entry.name))
            elif _is_dir_link(entry):
                links.append(_join(top, entry.name))
        stack += sorted(below, reverse=True)
    return directories


def _rotations(path: str, listings: dict[str, dict[str, list[tuple[int, str]]]], budget: Budget) -> list[str]:
    """The rotated files that exist, for a file that is not itself rotated: ``PATH.1``,
    ``PATH.2``, ... (the older layout), then its closed files by sequence number.

    ``listings`` caches each directory's rotated files by base name (one listing per
    directory, counted in ``budget``)."""
    if _ROTATED.match(path) or _CLOSED.match(path) or os.path.splitext(path)[1] in _COMPRESSED:
        return []
    directory, name = os.path.split(path)
    if directory not in listings:
        rotated: dict[str, list[tuple[int, str]]] = {}
        names = os.listdir(directory or ".")
        budget.take(directory, len(names))
        for entry in names:
            old, closed = _ROTATED.match(entry), _CLOSED.match(entry)
            if old:  # the older layout first (older than any closed file), by index
                rotated.setdefault(old.group(1), []).append((-(1 << 62) + int(old.group(2)), entry))
            elif closed:
                rotated.setdefault(closed.group(1), []).append((int(closed.group(2)), entry))
        listings[directory] = rotated
    found = sorted(listings[directory].get(name, []))[:MAX_ROTATIONS]
    return [os.path.join(directory, entry) if directory else entry for _, entry in found]


def first_record_verdict(path: str) -> str | None:
    """None if ``path`` starts with a telemetry record; "" if it is empty; else why it is
    not telemetry (the reason never quotes the file).

    Only a regular file is read. The file is opened without blocking and checked on
    the open descriptor, so a FIFO put in its place after a first look cannot hold the
    run (opening a FIFO to read waits for a writer; reading it, for data)."""
    try:
        kind = _not_regular(os.stat(path).st_mode)
        if kind:
            return f"not a regular file ({kind})"
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        return f"cannot read it ({error.strerror or type(error).__name__})"
    with os.fdopen(fd, "rb") as raw:
        kind = _not_regular(os.fstat(fd).st_mode)
        if kind:
            return f"not a regular file ({kind})"
        os.set_blocking(fd, True)
        return _head_verdict(raw, _COMPRESSED.get(os.path.splitext(path)[1]))


def _not_regular(mode: int) -> str:
    """What a file of ``mode`` is when it is not a regular file ("a FIFO"); "" when it is."""
    if stat.S_ISREG(mode):
        return ""
    return next((name for test, name in _NOT_REGULAR if test(mode)), "of another kind")


def _head_verdict(file, opener) -> str | None:
    """``first_record_verdict`` of the file open on ``file`` (through ``opener``, a
    decompressing open, when not None)."""
    try:
        if opener is None:
            head = file.read(FIRST_RECORD_BYTES)
        else:
            with opener(file, "rb") as f:
                head = f.read(FIRST_RECORD_BYTES)
    except (OSError, EOFError) as error:
        return (
            f"cannot read it ({error.strerror or type(error).__name__})"
            if isinstance(error, OSError)
            else ("a compressed file cut short")
        )
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
    """One warning per log whose rotated files have a gap: a missing index or no live
    file (the older layout), or a sequence number missing between two closed files (the
    oldest closed files go by retention, and a stopped node's PATH may be empty: neither
    is a gap)."""
    indices: dict[str, set[int]] = {}
    seqs: dict[str, set[int]] = {}
    for path in paths:
        name = os.path.basename(path)
        closed = _CLOSED.match(name)
        if closed is not None and TELEMETRY_NAME.match(name):
            seqs.setdefault(os.path.join(os.path.dirname(path), closed.group(1)), set()).add(int(closed.group(2)))
            continue
        match = TELEMETRY_NAME.match(name) or _ROTATED.match(name)
        if match is None:
            continue
        base = os.path.join(os.path.dirname(path), match.group(1))
        indices.setdefault(base, set()).add(int(match.group(2) or 0))
    for base in seqs:  # closed files: the older layout's files before them need no live PATH
        if base in indices:
            indices[base].add(0)
    warnings = []
    for base, numbers in sorted(seqs.items()):
        ordered = sorted(numbers)
        holes = [n for a, b in itertools.pairwise(ordered) for n in range(a + 1, min(b, a + 6))][:5]
        count = ordered[-1] - ordered[0] + 1 - len(ordered)
        if count:
            more = f" and {count - len(holes)} more" if count > len(holes) else ""
            names = ", ".join(f"{n:06d}" for n in holes)
            warnings.append(
                f"gap in the closed files of {base}: sequence number {names}{more} missing; their records are not read"
            )
    for base, present in sorted(indices.items()):
        ordered = sorted(present)
        count = ordered[-1] + 1 - len(ordered)  # indices 0 .. max not present
        if count:
            missing: list[int] = []  # the first five, without listing a range sized by a file name
            expected = 0
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
