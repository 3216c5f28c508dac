"""The file descriptors a node may open: as many as the system allows, or one clear line.

A node holds descriptors for its model's files, HTTP clients, peers and mDNS, and strangers
can make it hold more (each budget is a share of this limit: transport/connection_budget.py,
api/connection_cap.py). So the soft limit is raised to the hard one at start.

mlx-lm's import sets the limit to (2048, 4096): that lowers a higher soft limit, lowers the
hard limit for good (an unprivileged process cannot raise it back), and raises ValueError
("not allowed to raise maximum limit") where the hard limit is under 4,096, which killed the
node with a traceback. So mlx-lm is imported here first with that one call skipped.
"""

from __future__ import annotations

import resource

MIN_DESCRIPTORS = 256  # model files, a few clients and peers: below this a node cannot run
_CEILING = 1 << 20  # for an unlimited hard limit (Linux refuses a soft limit past fs.nr_open)


class DescriptorLimitError(Exception):
    pass


def raise_to_hard_limit() -> int:
    """The soft limit raised as far as the hard limit allows; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _CEILING if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return target if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def import_mlx_lm_keeping_the_limit() -> None:
    """Import mlx_lm without letting it change the descriptor limit (see the module's docstring)."""
    real = resource.setrlimit

    def skip_descriptors(which: int, limits) -> None:
        if which != resource.RLIMIT_NOFILE:
            real(which, limits)

    resource.setrlimit = skip_descriptors
    try:
        import mlx_lm.utils  # noqa: F401
    finally:
        resource.setrlimit = real


def prepare_descriptor_limit(minimum: int = MIN_DESCRIPTORS) -> int:
    """Raise the limit, import mlx-lm under it; DescriptorLimitError with one line if it is too low."""
    import_mlx_lm_keeping_the_limit()
    limit = raise_to_hard_limit()
    if limit < minimum:
        raise DescriptorLimitError(
            f"this process may open only {limit} files (ulimit -n); a node needs at least "
            f"{minimum}: raise it, e.g. `ulimit -n 4096` before starting swarm-node")
    return limit
