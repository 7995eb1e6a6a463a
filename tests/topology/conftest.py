import pytest

from labkit.topology import list_samples


@pytest.fixture(scope="session")
def samples():
    return list_samples()
