"""Fixtures for every tier. Helpers live in the tests/support package, probes in tests/probes."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

# No test reaches the hub (this machine has no network to it): offline before anything imports huggingface_hub,
# which reads HF_HUB_OFFLINE once, at import. Set later (monkeypatch in a test), it came too late, and a test that
# named an absent hub model waited 70 s on connection retries before its one-line error. Launched jobs get it in
# their environment (support/jobs.py).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Runs trained in the test process (support/jobs.train_here, the unit tier) use one thread, as a launched rank
# does (support/jobs.base_env): `make test` runs three pytest processes and their ranks on the machine's cores,
# where the engine's default (the cores over the local ranks) gave each a second thread that only waited and spun
# (test_data's hypothesis-only run: 43 s of CPU in-process against 38 s launched). Before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Fixtures that test modules of several tiers use, defined beside their helpers.
from support import builds, sharing
from support.checkpoints import trained  # noqa: F401
from support.host_syncs import offline_cache  # noqa: F401
from support.model_runs import half_models  # noqa: F401

pytest_plugins = ["support.clock"]  # where the suite's time goes: a table at the end of every run


def needed_builds(item: pytest.Item) -> set[str]:
    return {name for marker in item.iter_markers("builds") for name in marker.args}


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that wait for a background build (support/builds.py) go last, in their random order, so that the
    build runs beside every other test instead of holding the session up; where processes share a tier
    (support/sharing.py), its tests come after the others, its longest modules first."""
    items[:] = sorted(items, key=lambda item: (sharing.shared(item), bool(needed_builds(item)),
                                               sharing.longest_first(item)))  # fmt: skip  # stable: else in order


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly and sharing.EARLY_BUILDS:
        builds.start(set().union(*map(needed_builds, session.items)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Under scripts/test.sh two processes share the integration tier (support/sharing.py): a module the other
    process claimed is passed over here, without a report (True: handled)."""
    return True if sharing.passed_over(item) else None


def pytest_sessionfinish() -> None:
    builds.stop_all()  # a build still running (the session ended early) dies with it


HYPOTHESIS_HOME = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Hypothesis keeps its example database and a cache of the constants it finds in the code under test in
    .hypothesis/ of the working directory, the checkout (the constants from collection on, before any fixture):
    this session's go to a temporary directory, removed at its end (and no earlier run's examples replay)."""
    from hypothesis.configuration import set_hypothesis_home_dir

    config.stash[HYPOTHESIS_HOME] = Path(tempfile.mkdtemp(prefix="hypothesis-"))
    set_hypothesis_home_dir(config.stash[HYPOTHESIS_HOME])


def pytest_unconfigure(config: pytest.Config) -> None:
    if HYPOTHESIS_HOME in config.stash:
        shutil.rmtree(config.stash[HYPOTHESIS_HOME], ignore_errors=True)


@pytest.fixture(autouse=True)
def restore_the_environment() -> Iterator[None]:
    """Code run in the test process may set variables for the ranks it would launch (the Horovod engine sets
    HOROVOD_AUTOTUNE, HOROVOD_TIMELINE, ... before hvd.init). Every later test's launched ranks inherit
    os.environ: a leaked HOROVOD_AUTOTUNE=1 made an elastic test time out, by test order. Restored after each
    test (a warning names what leaked; monkeypatch's own changes are undone before this runs)."""
    before = dict(os.environ)
    yield
    leaked = sorted(k for k in {*before, *os.environ} - {"PYTEST_CURRENT_TEST"} if before.get(k) != os.environ.get(k))
    for name in leaked:
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]
    if leaked:
        warnings.warn(f"the test changed os.environ ({', '.join(leaked)}): restored", stacklevel=1)


@pytest.fixture(autouse=True)
def restore_stop_signal_handlers() -> Iterator[None]:
    """A run trained in the test process leaves the stop signals ignored once it stopped (as a rank must until
    it exits), and the processes later tests start would inherit that: each test gets the handlers back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        if handler is not None:  # None: set outside Python, and left as it is
            signal.signal(sig, handler)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One tokenizer/tokenized-data cache for the whole session (tests must not touch ~/.cache)."""
    return tmp_path_factory.mktemp("hvt-cache")
