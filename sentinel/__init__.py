"""sentinel: a testbed for the security of decentralized pipeline-parallel training."""

__version__ = "0.1.0"
