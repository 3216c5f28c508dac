"""reference.local_reference_chat in a process of its own, started by reference.py under the BLAS the
nodes run under: a JSON request a line on stdin ({"model", "messages", "max_tokens"}), a JSON reply a
line on stdout ({"text", "n"} or {"error"})."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, not into the replies
    from reference import local_reference_chat
    for line in sys.stdin:
        request = json.loads(line)
        try:
            text, n = local_reference_chat(request["model"], request["messages"], request["max_tokens"])
            reply = {"text": text, "n": n}
        except Exception as e:  # handed to the test that asked
            reply = {"error": f"{type(e).__name__}: {e}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
