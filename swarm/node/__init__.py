"""The node daemon and what it starts from: its configuration, ports, secrets, lifecycle.

`node.py` assembles every part of swarm/ into one node; `lifecycle.py` runs it until a
signal. Nothing in swarm/ but cli.py and bench/ imports from here.
"""
