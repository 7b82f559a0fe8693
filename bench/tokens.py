"""The lm task's text path and trainer against bare loops (issue 36's bench rows), each comparison
interleaved:

    python -m bench.tokens [--rows ROW,...] [--repeats N] [--quick] [--out bench/results/tokens.json]

token_pipeline   tokens/s of the lm task's stream (train.tokens.WindowStream: a ranged read of each
                 block, its checksum, the windows cut and gathered into int64 batches), with its
                 default read-ahead (4 blocks on threads, for S3) and with --readahead-blocks 0 (each
                 block read when needed, on the consuming thread, for a local disk), against a bare
                 loop over the same blocks in the same order that reads each block by one ranged read
                 (bench.lm_loop.bare_batches with reads="range": no checksum, no thread): the same
                 batches, bit for bit. A bare loop through a numpy memmap of the shards is measured
                 beside them, for what a read costs. The shards are packed at the product's default
                 block size (train.tokens.BLOCK_TOKENS).
packing          MB of text per CPU-second of `python -m train.data pack tokens --workers 1` run as a
                 command (its process and its worker, both counted) against the tokenizer alone
                 (Tokenizer.encode_batch_fast in one process) on the same documents.
trainer_vs_bare  tokens/s of `python -m train --task lm` (2 workers under horovodrun, as the backends
                 launch it) against a bare Horovod loop training the same GPT on the same batches
                 (bench/lm_loop.py through bench/worker_hvd.py), over the same steady window.

The corpus is the standard library's source as Parquet (cluster/example_data.py), tokenized by a
2,048-token BPE trained on it (--quick: one package, a 512-token BPE, a tiny GPT: a smoke run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.compare import Contender, run_comparison
from bench.figures import Ratio
from bench.lm_loop import LmShape, bare_batches, tokens_per_s
from bench.peer import horovod_contender
from bench.sections import EFFICIENCY_TARGET, PRODUCTION, TRAINER_DEFAULTS
from bench.trainer_run import TrainerRun
from train.tasks.lm import DEFAULT_SEQ_LEN, DEFAULT_SHAPE
from train.tokens import BLOCK_TOKENS

PACKAGES = ("json", "email", "http", "logging", "unittest", "xml", "asyncio")

# Issue 36's targets (its constants, not measurements; bench.report applies them when it renders the
# results file): the token stream against the bare loop, for both stream contenders (the memmap loop is
# there to show what a read costs, with no target); `pack tokens` against the tokenizer alone; the
# trainer against the bare Horovod loop (the headline's target).
TOKEN_PIPELINE_TARGET = 0.95
STREAM_CONTENDERS = ("stream", "stream_inline")
PACKING_TARGET = 0.8
TRAINER_TARGET = EFFICIENCY_TARGET


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass(frozen=True)
class TokensPlan:
    """How big each row is: the full run and --quick differ only here."""

    packages: tuple[str, ...]   # standard-library packages in the corpus
    vocab: int                  # the BPE's vocabulary
    block_tokens: int           # tokens per checksummed block of the shards (packing, trainer_vs_bare)
    pipeline_block_tokens: int  # the same, for the token_pipeline row's own shards
    repeats: int                # token_pipeline and packing
    pipeline_seq_len: int
    pipeline_batch: int
    pipeline_epochs: int
    trainer_shape: LmShape      # its `data` is filled in with the packed shards
    trainer_repeats: int
    timeout_s: float            # one trainer or bare-loop run


# The trainer row: the lm task's default GPT and context (train/tasks/lm.py) at a batch whose step is
# long against the trainer's own per-step work, as a real model's is; 6 repeats are the fewest that
# give a 95 % interval (bench.stats.median_interval).
FULL = TokensPlan(PACKAGES, 2048, 1 << 16, BLOCK_TOKENS, repeats=8, pipeline_seq_len=1024, pipeline_batch=8,
                  pipeline_epochs=40,
                  trainer_shape=LmShape("", steps=40, warmup=10, layers=DEFAULT_SHAPE.layers,
                                        heads=DEFAULT_SHAPE.heads, dim=DEFAULT_SHAPE.dim,
                                        seq_len=DEFAULT_SEQ_LEN, batch_size=8),
                  trainer_repeats=6, timeout_s=600)
QUICK = TokensPlan(("json",), 512, 2048, 2048, repeats=1, pipeline_seq_len=128, pipeline_batch=4,
                   pipeline_epochs=1,
                   trainer_shape=LmShape("", steps=10, warmup=10, layers=1, heads=2, dim=32, seq_len=32,
                                         batch_size=4),
                   trainer_repeats=1, timeout_s=120)


@dataclass(frozen=True)
class Corpus:
    """The rows' data: the Parquet corpus, its documents, the BPE trained on them, their token shards."""

    parquet: Path
    docs: list[str]
    tokenizer: Path
    tokens: Path


def prepare(root: Path, plan: TokensPlan) -> Corpus:
    from cluster.example_data import write_stdlib_parquet
    from train import pack_tokens, text_source, tokenizer

    corpus = root / "parquet"
    write_stdlib_parquet(corpus, list(plan.packages))
    docs = list(text_source.corpus(text_source.find_sources([str(corpus)], None), "text"))
    tok = tokenizer.train_bpe(docs, plan.vocab)
    tok_path = root / "tokenizer.json"
    tok_path.write_text(tok.to_str())
    pack_tokens.pack_tokens([str(corpus)], str(root / "tokens"), str(tok_path), workers=1, memory_mb=256,
                            shard_mb=64, block_tokens=plan.block_tokens)
    return Corpus(corpus, docs, tok_path, root / "tokens")


def token_pipeline(data: Corpus, plan: TokensPlan, root: Path) -> dict:
    from train import pack_tokens, tokens

    shards = root / "tokens-pipeline"
    pack_tokens.pack_tokens([str(data.parquet)], str(shards), str(data.tokenizer), workers=1, memory_mb=256,
                            shard_mb=64, block_tokens=plan.pipeline_block_tokens)
    seq_len, batch = plan.pipeline_seq_len, plan.pipeline_batch
    view = tokens.open_dataset(str(shards), None).windows(seq_len)
    steps = plan.pipeline_epochs * view_length(view, batch)

    def timed(batches) -> dict:
        t = time.perf_counter()
        for i, _ in enumerate(batches, 1):
            if i == steps:
                break
        return {"tokens_per_s": steps * batch * seq_len / (time.perf_counter() - t)}

    def stream(readahead: int) -> Callable[[], dict]:
        def run() -> dict:
            s = tokens.WindowStream(view, 0, batch, 0, 1, None, readahead=readahead)
            try:
                return timed(s)
            finally:
                s.close()
        return run

    def bare(reads: str) -> Callable[[], dict]:
        return lambda: timed(bare_batches(view, 0, batch, 0, 1, reads=reads))

    contenders = [Contender("bare_range", bare("range")),
                  Contender("stream", stream(4), {"readahead_blocks": 4}),
                  Contender("stream_inline", stream(0), {"readahead_blocks": 0}),
                  Contender("bare_memmap", bare("memmap"))]
    result = run_comparison(contenders, "bare_range", plan.repeats, metric="tokens_per_s", progress=_progress)
    return {**result, "shape": {"seq_len": seq_len, "batch": batch, "steps": steps,
                                "blocks": len(view.ds.blocks), "block_tokens": plan.pipeline_block_tokens,
                                "dtype": view.ds.index["dtype"]}}


def view_length(view, batch: int) -> int:
    from train import tokens

    return tokens.Plan.from_state(None, 1).length(view, 0, batch)


def packing(data: Corpus, plan: TokensPlan, root: Path) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(data.tokenizer))
    mb = sum(map(len, data.docs)) / 1e6
    runs = iter(range(10_000))

    def alone() -> dict:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        cpu = _cpu_s()
        for i in range(0, len(data.docs), 64):
            tok.encode_batch_fast(data.docs[i:i + 64], add_special_tokens=False)
        return {"mb_per_cpu_s": mb / (_cpu_s() - cpu)}

    def pack() -> dict:
        # As users run it: the CLI in a process of its own, its worker spawned from it. Run in this
        # process instead, the spawned worker would import this bench (its __main__) and torch with it.
        cpu = _cpu_s()
        out = root / f"pack-{next(runs)}"
        subprocess.run([sys.executable, "-m", "train.data", "pack", "tokens", "--src", str(data.parquet),
                        "--tokenizer", str(data.tokenizer), "--out", str(out), "--workers", "1",
                        "--memory-mb", "256", "--shard-mb", "64", "--block-tokens", str(plan.block_tokens)],
                       check=True, capture_output=True, timeout=plan.timeout_s)
        return {"mb_per_cpu_s": mb / (_cpu_s() - cpu)}

    result = run_comparison([Contender("tokenizer_alone", alone), Contender("pack_tokens", pack)],
                            "tokenizer_alone", plan.repeats, metric="mb_per_cpu_s", progress=_progress)
    return {**result, "text_mb": mb}


def trainer_vs_bare(data: Corpus, plan: TokensPlan, root: Path) -> dict:
    """`python -m train --task lm` under horovodrun with its own defaults (no tuning flags, no
    checkpoints; its metrics file is its timer) against the bare Horovod loop with the settings the
    trainer picks on CPU workers (bench.sections.PRODUCTION), interleaved, both over the same steady
    window, as the headline compares them on the demo's model."""
    shape = dataclasses.replace(plan.trainer_shape, data=str(data.tokens))
    trainer = TrainerRun(shape, TRAINER_DEFAULTS, 0)
    bare = horovod_contender("bare-hvd", PRODUCTION, shape, plan.timeout_s)
    contenders = [
        Contender("trainer",
                  lambda: tokens_per_s(trainer.run("lm-trainer", root, {}, plan.timeout_s), shape.seq_len),
                  {"what": "python -m train --task lm under horovodrun (cluster.launch.horovodrun_command)",
                   "metrics_file": True, "checkpoints": False,
                   "settings": "the trainer's defaults (no tuning flags)", **asdict(shape)}),
        dataclasses.replace(bare, run=lambda: tokens_per_s(bare.run(), shape.seq_len)),
    ]
    comparison = run_comparison(contenders, "bare-hvd", plan.trainer_repeats, metric="tokens_per_s",
                                progress=_progress)
    efficiency = Ratio.of(comparison["ratios"]["trainer"]["per_repeat"], TRAINER_TARGET)
    return {**comparison,
            "window": f"steps {shape.warmup}..{shape.warmup + shape.steps} of every run "
                      f"(the first {shape.warmup} are warmup and untimed for both)",
            "efficiency": efficiency.to_json()}


ROWS: dict[str, Callable[[Corpus, TokensPlan, Path], dict]] = {
    "token_pipeline": token_pipeline, "packing": packing, "trainer_vs_bare": trainer_vs_bare}


def merge_rows(previous: dict, measured: dict) -> dict:
    """The results file after a run of some rows: the rows just measured, and the others as the file
    had them (anything else in it is dropped)."""
    return {name: measured.get(name, previous.get(name)) for name in ROWS
            if name in measured or name in previous}


def with_targets(results: dict) -> dict:
    """The results file's rows with every ratio as a bench.figures.Ratio against its target (none for
    the memmap loop), as bench.report renders them: the targets are this module's constants, applied to
    the file's per-repeat ratios whenever it is rendered, so a file written before a target changed
    reads against the target of now."""
    out = dict(results)
    if "token_pipeline" in results:
        row = results["token_pipeline"]
        out["token_pipeline"] = {**row, "ratios": {
            name: Ratio.of(r["per_repeat"], TOKEN_PIPELINE_TARGET if name in STREAM_CONTENDERS else None)
            .to_json() for name, r in row["ratios"].items()}}
    if "packing" in results:
        row = results["packing"]
        out["packing"] = {**row, "ratios": {
            "pack_tokens": Ratio.of(row["ratios"]["pack_tokens"]["per_repeat"], PACKING_TARGET).to_json()}}
    if "trainer_vs_bare" in results:
        row = results["trainer_vs_bare"]
        out["trainer_vs_bare"] = {
            **row, "efficiency": Ratio.of(row["ratios"]["trainer"]["per_repeat"], TRAINER_TARGET).to_json()}
    return out


def row_line(name: str, row: dict) -> str:
    """Every contender's median ratio to the row's baseline, with its interval."""
    parts = []
    for contender, ratios in row["ratios"].items():
        ratio = Ratio.of(ratios["per_repeat"])
        ci = ratio.interval
        spread = f" (95 % {ci.low:.3f}-{ci.high:.3f})" if ci else " (too few repeats for an interval)"
        parts.append(f"{contender} / {row['baseline']} = {ratio.median:.3f}{spread}")
    return f"{name}: " + "; ".join(parts)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _row_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: rows are a comma-separated list of {', '.join(ROWS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tokens", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=_row_names, default=list(ROWS),
                   help=f"comma-separated, of {', '.join(ROWS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="a small corpus and model: a smoke run, not figures")
    p.add_argument("--repeats", type=int, default=None,
                   help="repeats of every row run (default: the plan's, "
                        f"{FULL.repeats} and {FULL.trainer_repeats} for trainer_vs_bare)")
    p.add_argument("--out", default=None,
                   help="write the results here as JSON; rows not run are kept from the file already there")
    a = p.parse_args(argv)
    plan = QUICK if a.quick else FULL
    if a.repeats is not None:
        if a.repeats < 1:
            p.error(f"--repeats {a.repeats}: must be >= 1")
        plan = dataclasses.replace(plan, repeats=a.repeats, trainer_repeats=a.repeats)
    previous = {}
    if a.out and Path(a.out).exists():
        try:
            previous = json.loads(Path(a.out).read_text())
        except (OSError, ValueError) as e:
            p.error(f"--out {a.out}: cannot read the results already there: {e}")
        if not isinstance(previous, dict):
            p.error(f"--out {a.out}: holds {type(previous).__name__}, not this bench's results")
    results = {}
    with tempfile.TemporaryDirectory(prefix="ringtrain-bench-tokens-") as tmp:
        data = prepare(Path(tmp), plan)
        for name in a.rows:
            measured = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average": os.getloadavg()[0],
                        "cpus": len(os.sched_getaffinity(0)), "quick": a.quick}
            results[name] = {**ROWS[name](data, plan, Path(tmp)), "measured": measured}
            print(row_line(name, results[name]), flush=True)
            if a.out:  # after every row: a later row's failure keeps the rows measured
                Path(a.out).write_text(json.dumps(merge_rows(previous, results), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
