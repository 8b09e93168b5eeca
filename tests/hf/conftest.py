import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
