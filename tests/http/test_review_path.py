"""The path of one review through the server, as docs/architecture.md draws it: the modules of
webhook/ whose code runs for one eviction review on a kept-alive connection, traced on the real
front (in this process: its loop thread and its lanes' threads) and the real Flask app."""

from __future__ import annotations

import contextlib
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.http.clients import answer, connect, review_bytes
from tests.http.inprocess import serving
from webhook.config import from_mapping
from webhook.kube.state import ClusterState
from webhook.serve import app as app_module

pytestmark = pytest.mark.http

WEBHOOK = pathlib.Path(app_module.__file__).resolve().parents[1]
#: the modules one eviction review on a kept-alive connection may cross (docs/architecture.md,
#: "The path of one review"): a new one on the path is a hand-off to justify there
MAX_MODULES = 13


@contextlib.contextmanager
def tracing() -> Iterator[tuple[set[str], threading.Event]]:
    """(modules seen, recording): while `recording` is set, the webhook/ modules whose functions
    are called in the threads started inside this block (the front's loop thread, its lanes')."""
    seen: set[str] = set()
    recording = threading.Event()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and recording.is_set():
            path = pathlib.Path(frame.f_code.co_filename)
            if WEBHOOK in path.parents:
                seen.add(".".join(path.relative_to(WEBHOOK.parent).with_suffix("").parts))

    threading.setprofile(profile)
    try:
        yield seen, recording
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


def test_one_eviction_review_on_a_kept_alive_connection_crosses_few_modules(tmp_path):
    config = from_mapping(None)
    app = app_module.create_app(config=config, cluster=ClusterState(None))
    with tracing() as (crossed, recording), serving(app, config, tmp_path) as served:
        with contextlib.closing(connect(served)) as tls:
            tls.sendall(review_bytes("warm-up"))  # the connection kept alive, the lane's thread started
            answer(tls)
            recording.set()
            tls.sendall(review_bytes("traced"))
            traced = answer(tls)["response"]
            recording.clear()
    assert traced["uid"] == "traced", traced
    assert "webhook.serve.lanes" in crossed and "webhook.policies.eviction" in crossed, crossed
    assert len(crossed) <= MAX_MODULES, sorted(crossed)
