"""The stack's Horovod settings: every rank gets them unless the user's environment sets them.

Owned here, beside the trainer, so the code that runs on every rank needs nothing from the host-side launcher; the
launch methods (launcher/core/jobspec.py) put the same values into the ranks' environment, and the trainer fills in any
that a plain `horovodrun` or `mpirun` of the user's left out.
"""

from __future__ import annotations

HOROVOD_DEFAULTS: dict[str, str] = {"OMPI_MCA_mpi_yield_when_idle": "1", "NCCL_DEBUG": "WARN"}
"""Open MPI yields the core while it waits, instead of spinning against the rank's own compute threads (Horovod's
background thread polls MPI every cycle; measured with `python -m app.bench peers`, docs/performance.md). NCCL
says only what goes wrong; `launcher start --debug` (or NCCL_DEBUG=INFO in the job's environment) asks for its
topology and transport lines."""
