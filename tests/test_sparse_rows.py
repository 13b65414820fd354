"""RowRanges: a sparse product cut into ranges of rows, one per thread, against scipy's one product."""

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy import sparse

from isotrope.resources import usable_cores
from isotrope.sparse_rows import RowRanges, shared_workers


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_row_ranges_multiply_as_one_sparse_product(parts):
    """A matrix cut into ranges of rows gives, range by range in threads, exactly the floats of scipy's one
    product: with empty rows, more parts than rows, no nonzeros, and no rows."""
    rng = np.random.default_rng(parts)
    dense = rng.random((6, 9)) * (rng.random((6, 9)) < 0.4)
    dense[[1, 4]] = 0
    block = rng.standard_normal((9, 5)).astype(np.float32)
    with ThreadPoolExecutor(max_workers=parts) as workers:
        for matrix in (dense, np.zeros((6, 9)), np.zeros((0, 9))):
            csr = sparse.csr_matrix(matrix, dtype=np.float32)
            ranges = RowRanges(csr, parts, workers)
            assert sum(stop - start for start, stop, _ in ranges.ranges) == csr.shape[0]
            np.testing.assert_array_equal(ranges @ block, csr @ block)


def test_a_forked_child_gets_threads_of_its_own():
    """The process's row threads, all started in the parent, do not run in a forked child: the child's products
    start a pool of their own and finish (the parent's pool would take the work and never run it)."""
    workers = usable_cores()
    started = threading.Barrier(workers)
    for done in [shared_workers().submit(started.wait, 10) for _ in range(workers)]:  # every thread started
        done.result()
    matrix = sparse.csr_matrix(np.eye(4, dtype=np.float32))
    block = np.arange(12, dtype=np.float32).reshape(4, 3)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=lambda: results.put((RowRanges(matrix, 2, shared_workers()) @ block).tolist()))
    child.start()
    child.join(timeout=30)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child's product did not finish")
    np.testing.assert_array_equal(np.array(results.get(timeout=5)), matrix @ block)
