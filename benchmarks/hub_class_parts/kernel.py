"""A kernel's websocket as JupyterLab holds it, and a cell sent through it as JupyterLab sends one
(benchmarks/hub_class.py's first cells: ``%load_ext distlab`` and a ``%%distributed -n 2`` cell)."""

from __future__ import annotations

import contextlib
import datetime
import json
import time
import uuid

import websocket


class KernelChannel:
    """A kernel's websocket as JupyterLab holds it: one session id for the notebook's tab, and a
    new connection under the same id whenever one drops or does not open in time.

    The server keeps the kernel's messages for a session whose socket dropped and replays them
    when it comes back (jupyter_server's buffering, keyed by ``session_id``), so a busy machine
    that resets a connection mid-cell loses no reply: the browser reconnects, and so does this.
    ``reconnects`` counts how often that happened.
    """

    def __init__(self, url: str, authorization: str, deadline: float):
        self.session = uuid.uuid4().hex
        self.url, self.header = f"{url}?session_id={self.session}", [f"Authorization: {authorization}"]
        self.deadline, self.reconnects, self.socket = deadline, 0, None

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the kernel did not answer in time")
        return left

    def connected(self) -> websocket.WebSocket:
        while self.socket is None:
            try:
                self.socket = websocket.create_connection(self.url, header=self.header, timeout=min(120, self.left()))
            except (websocket.WebSocketException, OSError):
                self.reconnects += 1
                time.sleep(min(2, self.left()))
        return self.socket

    def dropped(self) -> None:
        with contextlib.suppress(Exception):
            self.socket.close()
        self.socket, self.reconnects = None, self.reconnects + 1

    def send(self, text: str) -> None:
        while True:
            try:
                return self.connected().send(text)
            except (websocket.WebSocketException, OSError):
                self.dropped()

    def receive(self) -> str | bytes:
        while True:
            socket = self.connected()
            socket.settimeout(self.left())
            try:
                return socket.recv()
            except websocket.WebSocketTimeoutException:
                self.left()          # raises once the deadline has passed; else the socket is stuck
                self.dropped()
            except (websocket.WebSocketException, OSError):
                self.dropped()

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()


def execute(channel: KernelChannel, code: str) -> str:
    """Run ``code`` in the kernel as JupyterLab sends a cell (an ``execute_request`` on the shell
    channel); wait for its reply and for the kernel to be idle again; return the value it showed
    (``text/plain``). An error in the cell raises, with the kernel's error name and message."""
    msg_id = uuid.uuid4().hex
    channel.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": channel.session,
                   "version": "5.3", "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    shown, reply, idle = "", None, False
    while reply is None or not idle:
        raw = channel.receive()
        if not isinstance(raw, str):
            continue                       # a binary frame: a message with buffers, not ours
        message = json.loads(raw)
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message["header"]["msg_type"], message["content"]
        if kind == "execute_result":
            shown = content["data"].get("text/plain", "")
        elif kind == "execute_reply":
            reply = content
        elif kind == "status" and content.get("execution_state") == "idle":
            idle = True
    if reply.get("status") != "ok":
        raise RuntimeError(f"the cell failed: {reply.get('ename')}: {reply.get('evalue')}")
    return shown
