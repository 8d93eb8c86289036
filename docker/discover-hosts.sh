#!/usr/bin/env bash
# Elastic Horovod's --host-discovery-script (launcher/core/protocol.py's DISCOVERY_SCRIPT): horovodrun runs it
# without arguments; the job agent answers from the job's spec (python -m launcher.agent discover).
exec python -m launcher.agent discover
