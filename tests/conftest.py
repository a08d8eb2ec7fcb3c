import pytest


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="run the full interleave test: 300 steps x 20 seeds")


@pytest.fixture
def long_run(request) -> bool:
    return bool(request.config.getoption("--long"))
