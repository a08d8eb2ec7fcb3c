import pytest

from cuda_fakes import PEER_LAYOUT, VA_LAYOUT, FakeDriver


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="run the full interleave test: 300 steps x 20 seeds")


# the full interleave run takes about half an hour on one core (6000 steps of about 0.3 s),
# past the suite's 600 s per-test timeout (pyproject.toml); with --long, the tests that ask
# for `long_run` get this bound instead
LONG_RUN_TIMEOUT_S = 3600


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--long"):
        return
    for item in items:
        if "long_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(LONG_RUN_TIMEOUT_S))


@pytest.fixture
def long_run(request) -> bool:
    return bool(request.config.getoption("--long"))


# the fake CUDA driver and a small sm_90 manifest, for the loader and memory tests
@pytest.fixture
def fake():
    from peerdsl.runtime import cuda as pcuda
    from peerdsl.runtime.cuda import _driver
    pcuda.clear_caches()
    drv = FakeDriver(param_layout={"vector_add_bf16": VA_LAYOUT, "vector_add_f16": VA_LAYOUT,
                                   "peer_probe_w8": PEER_LAYOUT})
    with _driver.use_driver(drv):
        yield drv
    pcuda.clear_caches()


@pytest.fixture
def man(tmp_path):
    from peerdsl.runtime.manifest import load_manifest
    from test_runtime_loader_helpers import write_manifest
    write_manifest(tmp_path)
    return load_manifest(tmp_path, "sm_90")
