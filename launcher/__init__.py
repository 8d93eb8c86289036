"""`launcher`: starts a Horovod cluster across Docker hosts and runs mpirun in its rank-0 container.

One launch, in order: settings (.env, flags; settings.py) -> a plan (plan.py, pure) -> a worker container
on every node's engine, the cluster's SSH trust handed over (driver.py, sshtrust.py) -> readiness (every
sshd answers) -> mpirun in the rank-0 container -> exit status and cleanup (session.py). cli.py only parses
and prints.
"""
