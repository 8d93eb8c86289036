"""The image's `smoke` role: a user's Horovod script (or the bundled trainer) on N ranks in one container over Gloo,
for a CI runner without GPUs (docker/entrypoint.sh runs `python -m launcher.smoke`).

    output.py   horovodrun's rank-prefixed lines, parsed and shown with their rank; each rank's last error line
    report.py   the outcome: the last line (passed/failed), the exit status and the JUnit XML report
    trainer.py  the bundled trainer's short run (no command given) and its checks
    run.py      horovodrun started, watched, timed out (every rank's stack first) and stopped
"""
