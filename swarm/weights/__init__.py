"""Model weights as the swarm shares them: a manifest of hashed chunks, stores that hold some
of them, and fetching exactly a stage's chunks from the peers that hold them."""
