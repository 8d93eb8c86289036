"""Starting a bench's ranks on this machine, and the rank side's view of them.

Driver side: `run_job(peer, ranks, bench, args, env)` starts `python -m app.bench.worker BENCH ARGS` on every
rank with one of the peers below and returns what rank 0 wrote to its result file (JSON):

- `hvd-mpi`:  Open MPI's mpirun (Horovod's MPI controller and MPI CPU ops), as the stack's jobs run;
- `hvd-gloo`: horovodrun --gloo (Horovod's Gloo controller and Gloo CPU ops);
- `ddp`:      one plain process per rank with RANK/WORLD_SIZE/MASTER_ADDR, torch.distributed over Gloo (as
              torchrun starts them).

Rank side: `Peer.from_env()` joins the group its launcher made and offers the few collectives benches need.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
PEERS = ("ddp", "hvd-mpi", "hvd-gloo")
HOROVOD_KNOBS = (
    "HOROVOD_CYCLE_TIME",
    "HOROVOD_FUSION_THRESHOLD",
    "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_CPU_OPERATIONS",
    "HOROVOD_CONTROLLER",
    "HOROVOD_AUTOTUNE",
    "HOROVOD_THREAD_AFFINITY",
    "OMPI_MCA_mpi_yield_when_idle",
    "HOROVOD_STACK_IDLE_WAIT_MS",
)
"""Settings a bench controls itself: removed from the inherited environment so 'untuned' means Horovod's own."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def bench_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This venv first on PATH, the repository on PYTHONPATH, no inherited Horovod knobs, then `env`."""
    base = {k: v for k, v in os.environ.items() if k not in HOROVOD_KNOBS}
    base.update(PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}", PYTHONPATH=str(REPO))
    return {**base, **(env or {})}


def launcher_argv(peer: str, ranks: int, env: dict[str, str], mpi_args: list[str] | None = None) -> list[str]:
    """The launcher words before the command, for the Horovod peers (`mpi_args`: more of mpirun's options)."""
    if peer == "hvd-mpi":
        argv = ["mpirun", "-np", str(ranks), "-bind-to", "none", "-map-by", "slot", "-x", "PATH", "-x", "PYTHONPATH"]
        if os.geteuid() == 0:
            argv.insert(1, "--allow-run-as-root")
        for name in env:
            argv += ["-x", name]
        return argv + list(mpi_args or [])
    if peer == "hvd-gloo":
        return ["horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo"]
    raise ValueError(f"unknown peer {peer!r}; one of {', '.join(PEERS)}")


def run_job(
    peer: str,
    ranks: int,
    bench: str,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 600,
    rank_prefix=None,
    master_addr: str = "127.0.0.1",
    mpi_args: list[str] | None = None,
    mpi_rank_wrapper: list[str] | None = None,
) -> dict:
    """Runs one multi-rank job to its end; returns rank 0's result. Raises RuntimeError with the output's tail.

    For `ddp` only: rank_prefix(rank) gives words to run each rank under (such as `ip netns exec NS`), and
    master_addr is where rank 0 listens. For `hvd-mpi`: mpi_args are more of mpirun's options, and every rank runs
    under mpi_rank_wrapper's words (netns.mpi_rank_wrapper: each rank in its own namespace)."""
    env = dict(env or {})
    with tempfile.TemporaryDirectory(prefix="bench-") as work:
        result = Path(work) / "result.json"
        command = [sys.executable, "-m", "app.bench.worker", bench, "--peer", peer, "--result", str(result), *args]
        full_env = bench_env(env)
        log = Path(work) / "output.log"
        with open(log, "w") as out:
            if peer == "ddp":
                port = str(free_port())
                processes = [
                    subprocess.Popen(
                        [*(rank_prefix(r) if rank_prefix else []), *command],
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env={
                            **full_env,
                            "RANK": str(r),
                            "LOCAL_RANK": str(r),
                            "WORLD_SIZE": str(ranks),
                            "MASTER_ADDR": master_addr,
                            "MASTER_PORT": port,
                        },
                    )
                    for r in range(ranks)
                ]
            else:
                processes = [
                    subprocess.Popen(
                        launcher_argv(peer, ranks, env, mpi_args) + list(mpi_rank_wrapper or []) + command,
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env=full_env,
                    )
                ]
            codes = wait_all(processes, timeout)
        if any(codes) or not result.exists():
            raise RuntimeError(
                f"{peer} job {bench} {' '.join(args)} failed (exit {codes}):\n" + log.read_text()[-3000:]
            )
        return json.loads(result.read_text())


def wait_all(processes: list[subprocess.Popen], timeout: float) -> list[int | None]:
    """Waits for every process; on timeout (or any failure) ends each one's process group."""
    try:
        for process in processes:
            process.wait(timeout=timeout)
            if process.returncode:
                break
    except subprocess.TimeoutExpired:
        pass
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return [process.returncode for process in processes]


class Peer:
    """The rank side: which framework joined the group, this rank, the world size, and gathering results."""

    def __init__(self, peer: str, device: str = "cpu"):
        """device 'cuda': one GPU per rank (the local rank's), and DDP over NCCL instead of Gloo."""
        import torch

        self.name = peer
        if peer == "ddp":
            import torch.distributed as dist

            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            if device == "cuda":
                torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl" if device == "cuda" else "gloo")
            self.rank, self.size = dist.get_rank(), dist.get_world_size()
        else:
            import horovod.torch as hvd

            hvd.init()
            self.rank, self.size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
            if device == "cuda":
                torch.cuda.set_device(local_rank)
        self.device = torch.device(f"cuda:{local_rank}" if device == "cuda" else "cpu")

    def gather(self, value) -> list:
        """Every rank's value, on every rank (as JSON: app/shared_values.py)."""
        from app import shared_values

        return shared_values.allgather(value, self.gather_arrays, "bench_values")

    def gather_arrays(self, array, name: str):
        """shared_values' one primitive (equal-length 1-D arrays, concatenated in rank order) on this peer's ops."""
        import torch

        tensor = torch.from_numpy(array)
        if self.name == "ddp":
            import torch.distributed as dist

            tensor = tensor.to(self.device)  # NCCL gathers on the GPU
            parts = [torch.empty_like(tensor) for _ in range(self.size)]
            dist.all_gather(parts, tensor)
            return torch.cat(parts).cpu().numpy()
        import horovod.torch as hvd

        return hvd.allgather(tensor, name=name).numpy()

    def finish(self, result_file: str, result: dict) -> None:
        if self.rank == 0:
            Path(result_file).write_text(json.dumps(result))
        if self.name == "ddp":
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()
        else:
            import horovod.torch as hvd

            hvd.shutdown()
