"""`dra-guard drain NODE` and `dra-guard uncordon NODE`: the options, the output, the exit code.

The drain itself is webhook.kube.nodedrain (its order: webhook.model.drain). Output, one event per
step: ``-o text`` (default) prints one line each, ``drain NODE: MESSAGE``; on a terminal the
"waiting" lines (what the drain waits for now) replace each other on one status line with the
time spent; ``-o json`` prints each event as one JSON object a line (keys event, node, message,
time, and per event phase, pod, reasons, ...).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import time
from typing import Any

from webhook.cli import terminal
from webhook.config import load_config


class Printer:
    """Prints the drain's events on stdout (see the module docstring)."""

    def __init__(self, output: str, node: str) -> None:
        self.output, self.node = output, node
        self.tty = output == "text" and terminal.is_terminal(sys.stdout)
        self.started = time.monotonic()
        self._status = False

    def __call__(self, event: dict[str, Any]) -> None:
        event = {**event, "time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        if self.output == "json":
            print(json.dumps(event, sort_keys=True), flush=True)
            return
        line = f"drain {self.node}: {event['message']}"
        if self.tty and event["event"] == "waiting":
            reasons = event.get("reasons") or [event["message"]]
            more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            status = f"[{time.monotonic() - self.started:.0f} s, phase {event.get('phase', '')}] {reasons[0]}{more}"
            width = max(shutil.get_terminal_size().columns, 20)
            sys.stdout.write("\r\x1b[K" + status[: width - 1])
            sys.stdout.flush()
            self._status = True
            return
        if self._status:
            sys.stdout.write("\r\x1b[K")
            self._status = False
        if event["event"] == "stopped":
            line += "".join(f"\n  - {r}" for r in event.get("reasons") or [])
        print(terminal.for_stream(line, sys.stdout), flush=True)


def run_drain(args: argparse.Namespace) -> int:
    from webhook.kube.client import api_client
    from webhook.kube.nodeapi import NodeApi
    from webhook.kube.nodedrain import DrainOptions, drain

    config = load_config(args.config)
    client = api_client(args.kubeconfig, timeout_seconds=args.request_timeout, context=args.context)
    options = DrainOptions(
        timeout=args.timeout,
        grace_period=args.grace_period,
        dry_run=args.dry_run,
        pod_selector=args.pod_selector or "",
        evict_drivers=args.evict_drivers,
        safety_seconds=args.unconfirmed_wait,
        request_timeout=args.request_timeout,
    )
    api = NodeApi(client, args.node, timeout_seconds=args.request_timeout)
    printer = Printer(args.output, args.node)
    try:
        return drain(api, config, options, printer)
    except KeyboardInterrupt:
        # the run's annotations were removed on the way out; the cordon and taints stay for a rerun
        printer({"event": "stopped", "node": args.node, "message": "interrupted; run it again to continue"})
        return 1


def run_uncordon(args: argparse.Namespace) -> int:
    from webhook.kube.client import api_client
    from webhook.kube.nodeapi import NodeApi
    from webhook.kube.nodeview import uncordon

    client = api_client(args.kubeconfig, timeout_seconds=args.request_timeout, context=args.context)
    return uncordon(NodeApi(client, args.node, timeout_seconds=args.request_timeout), Printer(args.output, args.node))
