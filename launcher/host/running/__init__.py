"""A job started from the user's machine, followed, and looked at afterwards: the launch in order, its signal policy,
the root cause of a failure, and the clusters already started (status, logs, results, stop). Reads
launcher/host/planning/ and launcher/host/engines/."""
