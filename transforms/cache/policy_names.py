"""The replacement policies `simulate` replays (policies.py, queue_policies.py), named apart from
their numba code so that building the command line does not compile it (~0.4 s on every
command), and the one reader of a `--policy` list for every command that takes one."""

from kvtrace.transforms.errors import ConfigError

POLICIES = ("lru", "prefix-lru", "fifo", "belady", "s3-fifo", "sieve", "arc", "tinylfu")
# The policies calibrate may fit: those an engine could run online (belady is the offline optimum).
CALIBRATED_POLICIES = tuple(policy for policy in POLICIES if policy != "belady")


def parse_policies(
    text: str, flag: str = "--policy", known: tuple[str, ...] = POLICIES
) -> tuple[str, ...]:
    """A comma-separated list of known policies, in the order given; ConfigError otherwise."""
    policies = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in policies if p not in known]
    if unknown or not policies:
        raise ConfigError(
            f"{flag}: unknown {', '.join(unknown) or 'empty list'}; known: {', '.join(known)}"
        )
    return policies
