"""Under mpirun -n 4: rank 0 is a learner, ranks 1-3 actors. Every actor streams chunks of random
transitions (uneven counts, the last chunk partial) through the real ActorChannel/LearnerChannel;
the learner checks that every chunk arrives exactly once and intact, and prints JSON lines."""
import json
import sys
import time

import numpy as np

from mpippo.algos.apex import chunk_fields
from mpippo.comm import World
from mpippo.comm.p2p import ActorChannel, ChunkLayout, LearnerChannel

world = World(collective_timeout_s=60)
world.install_abort_hook()
rank = world.rank
layout = ChunkLayout(chunk_size=16, item_fields=chunk_fields((8, 8, 3)))
OBS_SHAPE = (8, 8, 3)
N_PARAMS = 1000
actors = list(range(1, world.size))

if rank == 0:
    ch = LearnerChannel(world, actors, layout, N_PARAMS, max_inflight=3, timeout_s=30)
    seen = {a: [] for a in actors}
    version = 0
    deadline = time.monotonic() + 60
    while not ch.all_done():
        assert time.monotonic() < deadline, "learner timed out"
        for slot, actor, views, count in ch.poll():
            assert views["header"]["actor"] == actor
            seen[actor].append(int(views["header"]["seq"]))
            # payload was generated from (actor, seq): check it survived the trip
            rng = np.random.default_rng(actor * 100_000 + int(views["header"]["seq"]))
            expect = rng.integers(0, 256, size=(layout.chunk_size,) + OBS_SHAPE, dtype=np.uint8)[:count]
            assert np.array_equal(views["obs"][:count], expect)
            ch.release(slot)
        if np.random.rand() < 0.5:  # a learner that is sometimes slow to hand out credit
            ch.grant()
        if ch.send_weights(version + 1, np.full(N_PARAMS, version + 1, dtype=np.float32)):
            version += 1
    ch.finish()
    assert ch.corrupted() == []
    ch.stopped[actors[-1]] = ch.stopped[actors[-1]].copy()
    ch.stopped[actors[-1]][2] += 1  # an actor whose announced CRC differs from what arrived
    assert ch.corrupted() == [actors[-1]]
    ch.stopped[actors[-1]][2] -= 1
    for a in actors:
        sent, steps, checksum, chunks = (int(x) for x in ch.stopped[a][:4])
        print(json.dumps({"role": "learner", "actor": a, "received": ch.received[a], "sent": sent,
                          "checksum_ok": ch.checksums[a] == checksum, "chunks": chunks,
                          "seqs_exact": sorted(seen[a]) == list(range(chunks)), "weights_versions": version}),
              flush=True)
else:
    ch = ActorChannel(world, 0, layout, N_PARAMS, max_inflight=3, timeout_s=30)
    n_chunks = 5 + 3 * rank
    versions = []
    for seq in range(n_chunks):
        views = ch.chunk()
        count = layout.chunk_size if seq < n_chunks - 1 else rank * 3  # the last one is partial
        rng = np.random.default_rng(rank * 100_000 + seq)
        views["obs"][:] = rng.integers(0, 256, size=views["obs"].shape, dtype=np.uint8)
        views["next_obs"][:count] = views["obs"][:count] // 2
        views["actions"][:count] = seq
        views["returns"][:count] = rng.random(count)
        ch.send(count, rank)
        w = ch.poll_weights()
        if w is not None:
            assert np.all(w[1] == w[0]), "weights and their version disagree"
            versions.append(w[0])
    ch.finish(env_steps=ch.sent)
    print(json.dumps({"role": "actor", "rank": rank, "sent": ch.sent, "chunks": n_chunks,
                      "versions_increasing": versions == sorted(versions)}), flush=True)
sys.stdout.flush()
