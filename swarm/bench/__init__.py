"""swarm-bench: the swarm on N local nodes vs mlx-lm on the same model, in one table."""
