#!/usr/bin/env bash
# Elastic Horovod's --host-discovery-script (launcher/plan.py's DISCOVERY_SCRIPT): horovodrun runs it without
# arguments, so it hands over to the entrypoint's "discover" role. Candidates come from WORKER_HOSTS (the
# multi-host launcher's nodes, rank 0's first) or WORKER_SERVICE (compose's worker service).
exec "$(dirname "$0")/entrypoint.sh" discover
