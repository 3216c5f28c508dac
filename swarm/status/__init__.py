"""What the node tells about itself and the swarm: /health, /v1/topology and its events."""
