"""One timed run of a token_pipeline contender (bench/tokens.py), in a process of its own:

    python -m bench.token_stream '{"shards": DIR_OR_S3_URI, "reader": "stream", "readahead": 4,
                                   "seq_len": 1024, "batch": 8, "steps": 3800, "endpoint_url": null}'

prints {"tokens_per_s": ...}. A process per run, because runs in one process weigh on each other: after
a read-ahead run, with its threads and the blocks they allocated gone, a bare loop in the same process
ran 5-15 % slower than in a fresh one, and the contender that came next paid for it. A worker reads one
way for its whole life, as each fresh process here does. Only numpy and train.tokens are imported.
"""

from __future__ import annotations

import json
import sys
import time

from bench.lm_loop import bare_batches
from train import tokens

READERS = ("stream", "bare_range", "bare_memmap")


def timed(make_batches, steps: int, tokens_per_batch: int) -> dict:
    """tokens/s over `steps` batches, from making the iterator on (the stream's plan, which its
    constructor draws, and its first read included, as a bare loop's are), as a worker's first step
    waits for them."""
    started = time.perf_counter()
    batches = make_batches()
    try:
        for i, _ in enumerate(batches, 1):
            if i == steps:
                break
        return {"tokens_per_s": steps * tokens_per_batch / (time.perf_counter() - started)}
    finally:
        batches.close()


def run(shards: str, reader: str, seq_len: int, batch: int, steps: int, readahead: int = 0,
        endpoint_url: str | None = None) -> dict:
    view = tokens.open_dataset(shards, endpoint_url).windows(seq_len)
    if reader == "stream":
        return timed(lambda: tokens.WindowStream(view, 0, batch, 0, 1, None, readahead=readahead), steps,
                     batch * seq_len)
    if reader not in READERS:
        raise ValueError(f"reader {reader!r}: one of {', '.join(READERS)}")
    return timed(lambda: bare_batches(view, 0, batch, 0, 1, reads=reader.removeprefix("bare_")), steps,
                 batch * seq_len)


if __name__ == "__main__":
    print(json.dumps(run(**json.loads(sys.argv[1]))))
