"""The peer protocol: typed messages in frames over one TCP connection per pair of peers.

Where each part runs: listener.py on the event loop (accepts, answers hellos),
lane.py on the MLX thread (reads and writes every frame), links.py from both.
"""
