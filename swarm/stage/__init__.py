"""The stage side: the layers this node holds and the one dispatcher that serves every peer message."""
