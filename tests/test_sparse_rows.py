"""RowRanges: a sparse product cut into ranges of rows, one per thread, against scipy's one product."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy import sparse

from isotrope.sparse_rows import RowRanges


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
