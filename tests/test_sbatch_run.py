"""The exported batch script trains for real, without Slurm or Apptainer: it runs in a container of the stack's image,
where stand-ins take srun's part (one process per task, each with the variables Slurm gives a task of a 2-node
allocation) and Apptainer's (the command with only the APPTAINERENV_ variables, as --cleanenv leaves it), and the
real Horovod, Gloo and rendezvous server of the image do the rest: the bundled trainer's ranks meet, train and end
with identical parameters. What only a live cluster shows (srun, Apptainer, two hosts) is tests/test_slurm_*.py's.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from launcher.core.options import job_command
from launcher.slurm import sbatch, sbatch_request
from tests.docker_image import IMAGE, image_missing

pytestmark = pytest.mark.integration

SRUN = """#!/bin/bash
# srun's part: every task of the allocation (NODES nodes, SLURM_NTASKS_PER_NODE each) as a process of its own.
while [[ $1 == --* ]]; do shift; done
per=$SLURM_NTASKS_PER_NODE nodes=$NODES pids=()
for ((task = 0; task < nodes * per; task++)); do
  SLURM_PROCID=$task SLURM_LOCALID=$((task % per)) SLURM_NODEID=$((task / per)) SLURM_NTASKS=$((nodes * per)) \\
    SLURM_NNODES=$nodes SLURMD_NODENAME=node$((task / per + 1)) "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
APPTAINER = """#!/bin/bash
# Apptainer's part: exec --cleanenv [--nv] [--bind B]... [--pwd D] SIF COMMAND runs COMMAND with the image's own
# variables and the APPTAINERENV_ ones alone (the binds are the container's own mounts here).
[ "$1" = exec ] && shift
folder=
while [[ $1 == --* ]]; do
  case $1 in --bind) shift 2 ;; --pwd) folder=$2; shift 2 ;; *) shift ;; esac
done
shift
given=()
for name in ${!APPTAINERENV_@}; do given+=("${name#APPTAINERENV_}=${!name}"); done
[ -z "$folder" ] || cd "$folder"
exec env -i PATH=/opt/venv/bin:/usr/bin:/bin PYTHONPATH=/opt/horovod-stack HOME=/tmp LANG=C.UTF-8 "${given[@]}" "$@"
"""
SCONTROL = "#!/bin/bash\nfor ((node = 1; node <= NODES; node++)); do echo node$node; done\n"


IMAGE_MISSING = image_missing()
"""Asked once, at collection: `docker image inspect` is not free."""


@pytest.mark.skipif(IMAGE_MISSING is not None, reason=str(IMAGE_MISSING))
@pytest.mark.parametrize("slots", [1, 2], ids=["2 nodes x 1", "2 nodes x 2"])
def test_the_exported_script_trains_with_identical_parameters_on_every_rank(tmp_path, slots, measured):
    check, shared = tmp_path / "check", tmp_path / "shared"
    (check / "bin").mkdir(parents=True)
    shared.mkdir()
    for name, text in (("srun", SRUN), ("apptainer", APPTAINER), ("scontrol", SCONTROL.replace("NODES", "2"))):
        (check / "bin" / name).write_text(text)
    command = job_command(["--dataset", "digits", "--epochs", "1", "--progress", "lines"])
    job = {"command": command, "secrets": ("HF_TOKEN",)}
    request = sbatch_request.request(job, nodes="2", slots=slots, sif="/check/none.sif", shared="/shared")
    (check / "job.sbatch").write_text(sbatch.script(request))
    for path in (check, check / "bin", shared, *check.rglob("*")):
        path.chmod(0o777 if path.is_dir() else 0o755)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NTASKS_PER_NODE": str(slots)}
    run = ["docker", "run", "--rm", "--user", "1000:1000", "--entrypoint", "bash"]
    run += ["-v", f"{check}:/check:ro", "-v", f"{shared}:/shared", "-e", "HF_TOKEN=not-in-the-script"]
    run += [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]
    done = subprocess.run(
        [*run, "-e", "NODES=2", IMAGE, "-c", "PATH=/check/bin:$PATH exec bash /check/job.sbatch"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    ranks = 2 * slots
    assert f"parameters identical on all {ranks} ranks" in output, output[-4000:]
    metrics = [
        json.loads(line) for line in (shared / "runs" / "horovod-stack-42" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [(epoch["epoch"], epoch["world_size"]) for epoch in metrics] == [(1, ranks)]
    measured(
        f"exported sbatch script, {ranks} ranks (stand-in srun/apptainer): val accuracy {metrics[0]['val_accuracy']}"
    )
    assert "not-in-the-script" not in (check / "job.sbatch").read_text()
