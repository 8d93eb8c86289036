"""`launcher`: runs a Horovod job across Docker hosts, and the job agent that every door's job runs under.

One launch, in order: settings (.env, flags; settings.py) -> a plan and its job spec (plan.py, pure) -> a worker
container on every node's engine, the cluster's SSH trust handed over (driver.py, sshtrust.py, session.py) -> the
job agent in the rank-0 container (agent.py): readiness, a lifeline to every worker, mpirun, the exit status and
root cause, every worker stopped. compose's door builds the same job spec from its environment (compose_job.py);
protocol.py holds the facts every process shares. cli.py only parses and prints.
"""
