"""Each node's Docker engine, as the host side reaches it: the NodeEngine protocol and its Docker SDK driver, whether
an engine answers, the image on every node, and the byte streams the engines send. Reads launcher/host/planning/."""
