"""The `dist` backend: the same scenarios on real processes, torch.distributed point-to-point, launched by torchrun.

    rank 0          the relay: trusted verifier and response policy at every boundary, the EventLog,
                    evaluation, the result folder (sentinel/distributed/relay.py)
    ranks 1..N-1    workers: each hosts the replicas of one stage (sentinel/distributed/mapping.py), computes
                    forward/backward, runs the sender half of the transport -- adversary and codec --
                    and the DP sync of its stage on a per-stage process group (sentinel/distributed/worker.py)

Every rank derives the same routing, schedule and canonical message order from the scenario seed;
the relay takes messages in sim's order, so a dist run reproduces the sim run of the same scenario
(losses to float tolerance, the same messages, tampered messages, flags and bans). Entry points:
`sentinel run SCENARIO --backend dist --nproc N` (sentinel/distributed/launch.py) and
`torchrun ... -m sentinel.distributed SCENARIO --out DIR` (sentinel/distributed/__main__.py).
"""
