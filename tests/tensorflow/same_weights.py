"""What every check here ends with: each rank's weights (and optimizer slots) gathered on rank 0 and compared; rank 0
prints one line and every rank exits 1 where they differ, so a smoke run of the check fails."""

import horovod.tensorflow as hvd
import numpy as np


def check(name: str, arrays: list) -> None:
    flat = np.concatenate([np.asarray(array, dtype=np.float64).ravel() for array in arrays])
    gathered = hvd.allgather(flat.reshape(1, -1)).numpy()
    same = all(np.array_equal(gathered[0], other) for other in gathered[1:])
    if hvd.rank() == 0:
        print(f"{name}: {hvd.size()} ranks, {flat.size} values, identical on every rank: {same}", flush=True)
    if not same:
        raise SystemExit(1)
