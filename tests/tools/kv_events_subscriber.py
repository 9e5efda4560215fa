#!/usr/bin/env python3
"""An independent subscriber for KV cache events, written from vLLM's published schema (msgspec
structs, array-like and tagged; multipart [topic, seq (8 bytes big-endian), msgpack payload]; replay
by sending the first wanted seq to the ROUTER socket, answered by [seq, payload] messages and then
[-1, b""]). It keeps the block set the events describe, checks every event against it (a removed
block was stored, a stored block is new, token counts match block_size, each hash equals m3serve's
documented chain hash of its parent and tokens), fills every gap through the replay socket, and
prints the result as JSON.

Usage: kv_events_subscriber.py PUB_ENDPOINT REPLAY_ENDPOINT TOPIC READY_FILE [--drop-every N]
Touches READY_FILE once subscribed; then reads one line from stdin, the number of batches published,
and exits once it has applied all of them. --drop-every N discards every Nth live message, as a lossy
network would, so that the replay path is exercised.
"""
import json
import sys

import msgpack
import zmq

MASK = (1 << 64) - 1


def mix(x):  # splitmix64 finaliser, as in src/engine/block_pool.cpp
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def chain_hash(parent, tokens):
    h = mix(parent ^ 0x6D3A5E1F00000000)
    for i, t in enumerate(tokens):
        h = mix(h ^ (t & 0xFFFFFFFF) ^ (i << 32))
    return h


def to_u64(signed):
    return signed & MASK


class State:
    def __init__(self):
        self.blocks = {}  # hash (u64) -> tokens
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0, "blocks_stored": 0,
                       "blocks_removed": 0}
        self.errors = []

    def apply(self, seq, payload):
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if not (isinstance(batch, list) and len(batch) in (2, 3) and isinstance(batch[0], float)
                and isinstance(batch[1], list)):
            self.errors.append(f"seq {seq}: not a KVEventBatch: {batch!r:.200}")
            return
        for ev in batch[1]:
            if not isinstance(ev, list) or not ev or not isinstance(ev[0], str):
                self.errors.append(f"seq {seq}: untagged event {ev!r:.200}")
                continue
            tag = ev[0]
            self.counts[tag] = self.counts.get(tag, 0) + 1
            if tag == "BlockStored":
                if len(ev) != 7:
                    self.errors.append(f"seq {seq}: BlockStored with {len(ev)} fields")
                    continue
                _, hashes, parent, token_ids, block_size, lora_id, medium = ev
                if len(token_ids) != block_size * len(hashes) or lora_id is not None or medium != "CPU":
                    self.errors.append(f"seq {seq}: BlockStored fields {len(token_ids)} tokens, {len(hashes)} "
                                       f"hashes, block {block_size}, lora {lora_id}, medium {medium}")
                prev = 0 if parent is None else to_u64(parent)
                for i, h in enumerate(hashes):
                    h = to_u64(h)
                    toks = token_ids[i * block_size:(i + 1) * block_size]
                    if chain_hash(prev, toks) != h:
                        self.errors.append(f"seq {seq}: block hash {h:#x} is not H(parent, tokens)")
                    if h in self.blocks:
                        self.errors.append(f"seq {seq}: block {h:#x} stored twice")
                    self.blocks[h] = toks
                    self.counts["blocks_stored"] += 1
                    prev = h
            elif tag == "BlockRemoved":
                if len(ev) != 3 or ev[2] != "CPU":
                    self.errors.append(f"seq {seq}: BlockRemoved fields {ev!r:.200}")
                    continue
                for h in ev[1]:
                    h = to_u64(h)
                    if h not in self.blocks:
                        self.errors.append(f"seq {seq}: removed block {h:#x} was never stored")
                    self.blocks.pop(h, None)
                    self.counts["blocks_removed"] += 1
            elif tag == "AllBlocksCleared":
                self.blocks.clear()
            else:
                self.errors.append(f"seq {seq}: unknown event {tag}")


def main():
    pub_ep, replay_ep, topic, ready = sys.argv[1:5]
    drop_every = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[5] == "--drop-every" else 0
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(pub_ep)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    replay = ctx.socket(zmq.DEALER)
    replay.connect(replay_ep)
    open(ready, "w").close()

    state = State()
    pending = {}  # seq -> payload, received but not yet applied (a gap before it)
    next_seq = 0
    live = replayed = dropped = received = 0
    total = None

    def drain():
        nonlocal next_seq
        while next_seq in pending:
            state.apply(next_seq, pending.pop(next_seq))
            next_seq += 1

    def replay_from(start):
        nonlocal replayed
        replay.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            if not replay.poll(10000):
                state.errors.append(f"replay from {start}: no answer")
                return
            frames = replay.recv_multipart()
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                return
            if seq >= next_seq and seq not in pending:
                pending[seq] = frames[2]
                replayed += 1

    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    while total is None or next_seq < total:
        events = dict(poller.poll(10000 if total is None else 2000))
        if not events:
            if total is None:
                continue
            replay_from(next_seq)  # the tail was lost: ask for it
            drain()
            if next_seq < total and not pending:
                state.errors.append(f"stuck at seq {next_seq} of {total}")
                break
            continue
        if sub in events:
            t, seq_b, payload = sub.recv_multipart()
            received += 1
            if t != topic.encode():
                state.errors.append(f"topic {t!r}")
            if drop_every and received % drop_every == 0:
                dropped += 1
                continue
            seq = int.from_bytes(seq_b, "big")
            if seq >= next_seq:
                pending[seq] = payload
                live += 1
            if seq > next_seq and next_seq not in pending:
                replay_from(next_seq)
            drain()
        if sys.stdin.fileno() in events or sys.stdin in events:
            line = sys.stdin.readline()
            total = int(line) if line.strip() else 0
            poller.unregister(sys.stdin)
            if next_seq < total:
                replay_from(next_seq)
                drain()
    json.dump({"blocks": sorted(state.blocks), "counts": state.counts, "errors": state.errors[:20],
               "batches": next_seq, "live": live, "replayed": replayed, "dropped": dropped}, sys.stdout)


if __name__ == "__main__":
    main()
