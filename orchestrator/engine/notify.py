"""Optional notifications from ``phaselab run`` / ``resume``: when a stage fails for good and
when the grid is done.

=========================  ====================================================================
``PHASELAB_NOTIFY_CMD``    a shell command (``sh -c``); the event arrives as JSON on its stdin
                           and as ``PHASELAB_EVENT`` (``stage_failed`` | ``grid_done``),
                           ``PHASELAB_GRID``, ``PHASELAB_TEXT`` (one readable line) and, for a
                           stage, ``PHASELAB_STAGE``, ``PHASELAB_STAGE_HASH``, ``PHASELAB_CELL``
                           in its environment; e.g. ``notify-send phaselab "$PHASELAB_TEXT"``
``PHASELAB_NOTIFY_URL``    an http(s) URL that receives the event as a JSON POST; its ``text``
                           field is the readable line (what Slack and Mattermost incoming
                           webhooks show)
=========================  ====================================================================

A notification is a side channel: a command that fails or a URL that does not answer is reported
on stderr and never changes the grid's outcome. Events are delivered one at a time, in order, by
one background thread (at most ``timeout_s`` each), so a hook never runs twice at once (two
appends to one file cannot interleave); :meth:`Notifier.close` waits for those still queued
before the CLI exits.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

CMD_ENV, URL_ENV = "PHASELAB_NOTIFY_CMD", "PHASELAB_NOTIFY_URL"


class Notifier:
    """Sends events to the command and/or URL configured in the environment (module docstring)."""

    def __init__(self, grid: str, *, command: str | None = None, url: str | None = None,
                 timeout_s: float = 10.0) -> None:
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"{URL_ENV} must be an http:// or https:// URL, got {url!r}")
        self.grid, self.command, self.url, self.timeout_s = grid, command or None, url or None, timeout_s
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._sent = 0

    @classmethod
    def from_env(cls, grid: str) -> Notifier:
        return cls(grid, command=os.environ.get(CMD_ENV), url=os.environ.get(URL_ENV))

    @property
    def enabled(self) -> bool:
        return bool(self.command or self.url)

    def stage_failed(self, node: Any, detail: str) -> None:
        cell = node.members[0][0]
        self.send({"event": "stage_failed", "grid": self.grid, "stage": node.name, "stage_hash": node.hash,
                   "kind": node.kind, "cell": cell, "label": node.label, "message": detail,
                   "text": f"phaselab {self.grid}: stage {node.label} failed: {detail.splitlines()[0][:300]}"
                           if detail else f"phaselab {self.grid}: stage {node.label} failed"})

    def grid_done(self, ok: bool, counts: Mapping[str, int], failures: list[Mapping[str, Any]],
                  seconds: float) -> None:
        shown = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        names = "; ".join(f"{f['label']} {f['state'].lower()}" for f in failures[:10])
        self.send({"event": "grid_done", "grid": self.grid, "ok": ok, "counts": dict(counts),
                   "failures": list(failures), "seconds": seconds,
                   "text": f"phaselab {self.grid}: {'done' if ok else 'finished with failures'} in "
                           f"{seconds:.0f} s ({shown})" + (f": {names}" if names else "")})

    def send(self, event: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._worker, daemon=True, name="phaselab-notify")
            self._thread.start()
        self._queue.put(dict(event))
        self._sent += 1

    def close(self) -> None:
        """Wait for the notifications still on their way (each bounded by ``timeout_s``)."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout=self._sent * (2 * self.timeout_s + 1.0))
        self._thread, self._sent = None, 0

    def _worker(self) -> None:
        while (event := self._queue.get()) is not None:
            self._deliver(event)

    def _deliver(self, event: dict[str, Any]) -> None:
        body = json.dumps(event, default=str)
        if self.command:
            env = {**os.environ, "PHASELAB_EVENT": event["event"], "PHASELAB_GRID": self.grid,
                   "PHASELAB_TEXT": event["text"]}
            env |= {f"PHASELAB_{k.upper()}": str(event[k]) for k in ("stage", "stage_hash", "cell") if k in event}
            try:
                res = subprocess.run(["sh", "-c", self.command], input=body, text=True, env=env,
                                     capture_output=True, timeout=self.timeout_s, check=False)
                if res.returncode:
                    _warn(f"{CMD_ENV} exited {res.returncode}: {res.stderr.strip()[:300]}")
            except (OSError, subprocess.TimeoutExpired) as err:
                _warn(f"{CMD_ENV} failed: {err}")
        if self.url:
            import urllib.request

            req = urllib.request.Request(self.url, data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:   # the scheme is checked in __init__
                    resp.read()
            except OSError as err:   # URLError, HTTPError, timeouts
                _warn(f"{URL_ENV}: {err}")


def _warn(text: str) -> None:
    sys.stderr.write(f"phaselab: notification not delivered: {text}\n")
