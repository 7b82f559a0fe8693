"""The lm task's text path against bare loops (issue 36's bench rows), each comparison interleaved:

    python -m bench.tokens [--repeats 8] [--out bench/results/tokens.json]

token_pipeline  tokens/s of the lm task's stream (train.tokens.WindowStream: a ranged read of each
                block, its checksum, the windows cut and gathered into int64 batches on a read-ahead
                thread) against a bare loop over the same blocks in the same order through a numpy
                memmap of the shard (no checksum, no thread): the same batches, bit for bit.
packing         MB of text per CPU-second of `pack tokens` with one tokenizer process (its main
                process and the worker, both counted) against the tokenizer alone
                (Tokenizer.encode_batch_fast in one process) on the same documents.

The corpus is the standard library's source as Parquet (cluster/example_data.py), tokenized by a
2,048-token BPE trained on it. The trainer's tokens/s against a bare Horovod loop is not here: see
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.compare import Contender, run_comparison
from bench.stats import median_interval

PACKAGES = ("json", "email", "http", "logging", "unittest", "xml", "asyncio")


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def prepare(root: Path) -> dict:
    from cluster.example_data import write_stdlib_parquet
    from train import pack_tokens, text_source, tokenizer

    corpus = root / "parquet"
    write_stdlib_parquet(corpus, list(PACKAGES))
    docs = list(text_source.corpus(text_source.find_sources([str(corpus)], None), "text"))
    tok = tokenizer.train_bpe(docs, 2048)
    tok_path = root / "tokenizer.json"
    tok_path.write_text(tok.to_str())
    pack_tokens.pack_tokens([str(corpus)], str(root / "tokens"), str(tok_path), workers=1, memory_mb=256,
                            shard_mb=64, block_tokens=1 << 16)
    return {"corpus": corpus, "docs": docs, "tokenizer": tok_path, "tokens": root / "tokens"}


def token_pipeline(data: dict, repeats: int, seq_len: int = 1024, batch: int = 8, epochs: int = 40) -> dict:
    from train import tokens

    view = tokens.open_dataset(str(data["tokens"]), None).windows(seq_len)
    steps = epochs * view_length(view, batch)

    def stream() -> dict:
        s = tokens.WindowStream(view, 0, batch, 0, 1, None, readahead=4)
        t = time.perf_counter()
        for i, (_, _) in enumerate(s, 1):
            if i == steps:
                break
        s.close()
        return {"tokens_per_s": steps * batch * seq_len / (time.perf_counter() - t)}

    def bare() -> dict:
        ds = view.ds
        maps = [np.memmap(ds.store.root / e["name"], dtype=ds.dtype, mode="r") for e in ds.index["shards"]]
        plan = tokens.Plan.from_state(None, 1)
        out = np.empty((batch, seq_len + 1), dtype=np.int64)
        t = time.perf_counter()
        done, filled, epoch = 0, 0, 0
        while done < steps:
            for b, start, end in plan.rank_segments(view, 0, 0):
                block = ds.blocks[b]
                toks = maps[block.shard][block.start:block.start + block.tokens]
                n = end - start
                windows = np.lib.stride_tricks.as_strided(toks, (n, seq_len + 1), (seq_len * toks.itemsize,
                                                                                     toks.itemsize))
                order = tokens.sample_order(0, epoch, b, n)
                i = 0
                while i < n and done < steps:
                    take = min(n - i, batch - filled)
                    out[filled:filled + take] = windows[order[i:i + take]]
                    filled, i = filled + take, i + take
                    if filled == batch:
                        _ = out.copy()
                        done, filled = done + 1, 0
            epoch += 1
            plan = tokens.Plan(epoch, 1, None, 0)
            filled = 0
        return {"tokens_per_s": steps * batch * seq_len / (time.perf_counter() - t)}

    result = run_comparison([Contender("bare_memmap", bare), Contender("stream", stream)], "bare_memmap",
                            repeats, metric="tokens_per_s", progress=lambda m: print(m, file=sys.stderr))
    return {**result, "shape": {"seq_len": seq_len, "batch": batch, "steps": steps,
                                "blocks": len(view.ds.blocks), "dtype": view.ds.index["dtype"]}}


def view_length(view, batch: int) -> int:
    from train import tokens

    return tokens.Plan.from_state(None, 1).length(view, 0, batch)


def packing(data: dict, repeats: int, root: Path) -> dict:
    from tokenizers import Tokenizer

    from train import pack_tokens

    tok = Tokenizer.from_file(str(data["tokenizer"]))
    mb = sum(map(len, data["docs"])) / 1e6
    runs = iter(range(10_000))

    def alone() -> dict:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        cpu = _cpu_s()
        for i in range(0, len(data["docs"]), 64):
            tok.encode_batch_fast(data["docs"][i:i + 64], add_special_tokens=False)
        return {"mb_per_cpu_s": mb / (_cpu_s() - cpu)}

    def pack() -> dict:
        cpu = _cpu_s()
        out = root / f"pack-{next(runs)}"
        pack_tokens.pack_tokens([str(data["corpus"])], str(out), str(data["tokenizer"]), workers=1,
                                memory_mb=256, shard_mb=64, block_tokens=1 << 16)
        return {"mb_per_cpu_s": mb / (_cpu_s() - cpu)}

    result = run_comparison([Contender("tokenizer_alone", alone), Contender("pack_tokens", pack)],
                            "tokenizer_alone", repeats, metric="mb_per_cpu_s",
                            progress=lambda m: print(m, file=sys.stderr))
    return {**result, "text_mb": mb}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tokens", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--out", default=None, help="write the results here as JSON")
    a = p.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ringtrain-bench-tokens-") as tmp:
        data = prepare(Path(tmp))
        results = {"started": started, "load_average": load, "cpus": len(os.sched_getaffinity(0)),
                   "token_pipeline": token_pipeline(data, a.repeats),
                   "packing": packing(data, a.repeats, Path(tmp))}
    for section in ("token_pipeline", "packing"):
        name, ratio = next(iter(results[section]["ratios"].items()))
        interval = median_interval(ratio["per_repeat"])
        print(f"{section}: {name} / {results[section]['baseline']} = {ratio['median']:.3f} "
              f"(95 % {interval.low:.3f}-{interval.high:.3f})" if interval else
              f"{section}: {name} / {results[section]['baseline']} = {ratio['median']:.3f}")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
