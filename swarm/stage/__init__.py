"""The stage side: the layers this node holds, and the frames for them queued, batched, computed and sent on."""
