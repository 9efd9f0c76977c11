"""What a chat node agrees to store: the limits on received files and their accounting
(specs/chat.md section 3.1).

Pure: no I/O and no clock. reactors/chat_files.py measures the downloads folder and the
free space, reads the time, and asks here whether an offer is refused and why.

Theory of operation:

* A file's **footprint** is its size rounded up to a whole BLOCK, and at least one BLOCK,
  so that a flood of empty or tiny files counts as what it costs the file system.
* **Per peer**: each accepted offer is charged to its sender as (time, footprint). The
  charges of the last ``peer_quota_window`` seconds may add up to ``peer_quota_bytes``; a
  transfer that ends early (cancelled, the session ended, refused half-way) is settled at
  what arrived. An offer over the quota is refused with ``retry_after``, the seconds until
  enough charges have aged out for it (0 if the file alone is over the quota).
* **Per node**: the files in the downloads folder plus the transfers being received may
  add up to ``downloads_quota_bytes``, and the file system must keep ``min_free_bytes``
  free after every transfer being received has arrived (``remaining``).

A peer can make new node ids at will, so the per-peer quota only slows one peer down; the
downloads quota and the free-space floor are what hold against many.
"""

from __future__ import annotations

import collections
import dataclasses
import math

from reactors.chat_wire import DISK_FLOOR, DOWNLOADS_QUOTA, PEER_QUOTA, TOO_LARGE

#: The unit a stored file is counted in, and the least it counts as.
BLOCK = 4096
#: The largest retry_after a REFUSE carries (u32).
MAX_RETRY_AFTER = 2**32 - 1


def footprint(size: int) -> int:
    """``size`` rounded up to a whole BLOCK, and at least one BLOCK."""
    return max(1, -(-size // BLOCK)) * BLOCK


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileLimits:
    """The limits a ChatReactor applies to the files peers send it (specs/chat.md section 3.1)."""

    #: The largest file accepted.
    max_file_size: int = 1 << 30
    #: Bytes (footprints) accepted from one peer per ``peer_quota_window`` seconds.
    peer_quota_bytes: int = 1 << 30
    peer_quota_window: float = 3600.0
    #: Bytes (footprints) the downloads folder may hold, with the transfers being received.
    downloads_quota_bytes: int = 4 << 30
    #: Bytes the file system of the downloads folder keeps free.
    min_free_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        for name in ("max_file_size", "peer_quota_bytes", "downloads_quota_bytes", "min_free_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a number of bytes >= 0, got {value!r}")
        window = self.peer_quota_window
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 < window < math.inf:
            raise ValueError(f"peer_quota_window must be a positive finite number of seconds, got {window!r}")


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why an offer, or the rest of a transfer, is refused: a REFUSE message's fields."""

    code: int
    reason: str
    retry_after: int = 0


class Charge:
    """One accepted offer's charge to its sender: ``when`` and ``size`` (a footprint)."""

    __slots__ = ("when", "size")

    def __init__(self, when: float, size: int) -> None:
        self.when = when
        self.size = size


class Quotas:
    """The per-peer charges and the checks of FileLimits."""

    def __init__(self, limits: FileLimits) -> None:
        self.limits = limits
        self._charges: dict[str, collections.deque[Charge]] = {}

    def refuse_sender(self, node_id: str, size: int, now: float) -> Refusal | None:
        """The refusal of an offer of ``size`` bytes from ``node_id`` by the per-file and
        per-peer limits, or None."""
        limits = self.limits
        if size > limits.max_file_size:
            reason = f"refused: a file of {size} bytes is larger than max_file_size {limits.max_file_size}"
            return Refusal(TOO_LARGE, reason)
        cost = footprint(size)
        used = self.used(node_id, now)
        if used + cost <= limits.peer_quota_bytes:
            return None
        window = limits.peer_quota_window
        return Refusal(
            PEER_QUOTA,
            f"refused: {used} of peer_quota_bytes {limits.peer_quota_bytes} used in the last {window:g} s; "
            f"a file of {size} bytes counts {cost}",
            self._retry_after(node_id, cost, now),
        )

    def refuse_disk(self, size: int, *, stored: int, in_flight: int, free: int, remaining: int) -> Refusal | None:
        """The refusal of an offer of ``size`` bytes by the downloads quota and the free-space
        floor, or None.

        :param stored: footprints of the files in the downloads folder.
        :param in_flight: footprints of the transfers being received.
        :param free: bytes free on the downloads folder's file system.
        :param remaining: bytes still to arrive for the transfers being received.
        """
        limits = self.limits
        cost = footprint(size)
        if stored + in_flight + cost > limits.downloads_quota_bytes:
            return Refusal(
                DOWNLOADS_QUOTA,
                f"refused: downloads holds {stored} bytes and {in_flight} arriving; a file of {size} bytes "
                f"would pass downloads_quota_bytes {limits.downloads_quota_bytes}",
            )
        if free - remaining - size < limits.min_free_bytes:
            return Refusal(
                DISK_FLOOR,
                f"refused: {free} bytes free and {remaining} arriving; a file of {size} bytes would leave less "
                f"than min_free_bytes {limits.min_free_bytes}",
            )
        return None

    def refuse_write(self, size: int, free: int) -> Refusal | None:
        """The refusal of writing a chunk of ``size`` bytes with ``free`` bytes free, or None."""
        if free - size >= self.limits.min_free_bytes:
            return None
        floor = self.limits.min_free_bytes
        return Refusal(DISK_FLOOR, f"refused: {free} bytes free; a chunk of {size} would pass min_free_bytes {floor}")

    def charge(self, node_id: str, size: int, now: float) -> Charge:
        """Charge an accepted offer of ``size`` bytes to ``node_id``; settle it if it ends early."""
        charge = Charge(now, footprint(size))
        self._charges.setdefault(node_id, collections.deque()).append(charge)
        return charge

    @staticmethod
    def settle(charge: Charge, received: int) -> None:
        """A transfer ended early: charge what arrived instead of the whole file."""
        charge.size = min(charge.size, footprint(received))

    def used(self, node_id: str, now: float) -> int:
        """Bytes charged to ``node_id`` in the window that ends ``now``."""
        self._expire(now)
        return sum(c.size for c in self._charges.get(node_id, ()))

    def _expire(self, now: float) -> None:
        start = now - self.limits.peer_quota_window
        for node_id in list(self._charges):
            charges = self._charges[node_id]
            while charges and charges[0].when <= start:
                charges.popleft()
            if not charges:
                del self._charges[node_id]

    def _retry_after(self, node_id: str, cost: int, now: float) -> int:
        """Whole seconds until ``cost`` more fits in node_id's quota; 0 if it never will."""
        quota = self.limits.peer_quota_bytes
        if cost > quota:
            return 0
        used = self.used(node_id, now)
        for charge in self._charges.get(node_id, ()):
            used -= charge.size
            if used + cost <= quota:
                wait = charge.when + self.limits.peer_quota_window - now
                return min(MAX_RETRY_AFTER, max(1, math.ceil(wait)))
        return 0
