"""How pytest-xdist's workers share the suite when tests/run runs it with ``-n 2``.

A test module is one unit of work, so that its module-scoped fixtures (a dra-guard server, a
registered webhook, a real node) start once, in one worker. The modules that run a real node
(tests/e2e/test_node_*.py: kubelet + containerd, one per machine, behind the file lock of
tests/e2e/node.py) are together one unit, queued first: two workers running node modules would
only wait for each other at the lock, and the node modules are the longest unit of the suite, which
a worker should start before the short ones. Every other module keeps its collection order.

xdist's own ``--dist loadgroup`` would express this with marks, but it renames items through
``Item._nodeid``, which pytest 9.2 no longer reads (``Node.nodeid`` is derived from ``Node._id``):
its groups are silently ignored. tests/unit/test_test_helpers.py runs a small suite in two workers
through this scheduler and fails when the node modules are split or when a module is.
"""

from __future__ import annotations

import pathlib

from xdist.scheduler import LoadScopeScheduling

#: where the tests that run a real node live (tests/e2e/conftest.py refuses them elsewhere)
REAL_NODE_MODULES = "test_node_*.py"
#: the unit of work of the real-node modules
REAL_NODE_UNIT = "real-node"


def is_real_node_module(path: str) -> bool:
    """Whether the module at `path` (a node id's file part, e.g. ``tests/e2e/test_node_probes.py``)
    is one of the modules that run a real node."""
    return pathlib.PurePosixPath(path).match(REAL_NODE_MODULES)


class ModulesAndOneRealNode(LoadScopeScheduling):
    """xdist's load-scope scheduling with a module as the scope, and the real-node modules as one.

    Overrides ``_split_scope``, the method xdist's own LoadFile and LoadGroup schedulers override
    to choose their scope (``pytest_xdist_make_scheduler`` is the public hook that installs it)."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return REAL_NODE_UNIT if is_real_node_module(path) else path
