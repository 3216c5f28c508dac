"""What planning tells those who wait on it."""


class NoPipeline(Exception):
    """No whole pipeline could be had in time (peers gone, or the swarm cannot hold the model)."""
