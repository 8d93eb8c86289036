"""The Slurm launch method: the job as a batch script (`launcher export sbatch`), every rank a Slurm task in the stack's
image run by Apptainer from a SIF. What the export may be given is sbatch_request.py's; the script, sbatch.py's. Pure:
nothing here talks to a cluster.
"""
