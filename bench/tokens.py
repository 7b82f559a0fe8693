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
                 beside them, for what a read costs. The same, with the shards on the local S3 server
                 (no memmap there). Each mode is held to the target on the store it is made for. The
                 shards are packed at the product's default block size (train.tokens.BLOCK_TOKENS).
                 Every run is a fresh process (bench/token_stream.py).
packing          MB of text per CPU-second of `python -m train.data pack tokens --workers 1` run as
                 commands (each process and its worker counted) against the tokenizer alone
                 (Tokenizer.encode_batch_fast in one process) on the same documents, the standard
                 library's source (13 MB): the rate of one more pass over the text, the corpus packed
                 twice over less once, so a command's fixed start-up (about a second) weighs as little
                 as it does on a corpus of gigabytes; a single command's own rate is kept beside it.
trainer_vs_bare  tokens/s of `python -m train --task lm` (2 workers under horovodrun, as the backends
                 launch it) against a bare Horovod loop training the same GPT on the same batches
                 (bench/lm_loop.py through bench/worker_hvd.py), over the same steady window.

The other rows' corpus is seven of the standard library's packages as Parquet
(cluster/example_data.py), tokenized by a 2,048-token BPE trained on them (--quick: one package, a
512-token BPE, a tiny GPT: a smoke run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from unittest import mock

from bench.compare import Contender, run_comparison
from bench.figures import Ratio
from bench.lm_loop import LmShape, tokens_per_s
from bench.peer import horovod_contender
from bench.sections import (
    EFFICIENCY_TARGET,
    PRODUCTION,
    STORE_BUCKET,
    STORE_PRIORITY,
    TRAINER_DEFAULTS,
    object_store,
)
from bench.trainer_run import TrainerRun
from train.tasks.lm import DEFAULT_SEQ_LEN, DEFAULT_SHAPE
from train.tokens import BLOCK_TOKENS

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("json", "email", "http", "logging", "unittest", "xml", "asyncio")

# Issue 36's targets (its constants, not measurements; bench.report applies them when it renders the
# results file): the token stream against the bare loop of ranged reads, in the read mode made for each
# store (`--readahead-blocks 0` on a local disk, where a read costs less than a hand-off between threads;
# the default read-ahead on S3, where it hides each GET's wait; the other mode on each store, and the
# memmap loop, are shown with no target); `pack tokens` against the tokenizer alone; the trainer against
# the bare Horovod loop (the headline's target).
TOKEN_PIPELINE_TARGET = 0.95
STREAM_MODE_FOR = {"local": "stream_inline", "s3": "stream"}
PACKING_TARGET = 0.8
TRAINER_TARGET = EFFICIENCY_TARGET


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass(frozen=True)
class TokensPlan:
    """How big each row is: the full run and --quick differ only here."""

    packages: tuple[str, ...]   # standard-library packages in the corpus
    packing_packages: tuple[str, ...] | None  # the packing row's corpus (None: the whole library)
    packing_extra_passes: int   # the packing row's second command: the corpus 1 + this many times over
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
FULL = TokensPlan(PACKAGES, None, 1, 2048, 1 << 16, BLOCK_TOKENS, repeats=8, pipeline_seq_len=1024,
                  pipeline_batch=8, pipeline_epochs=160,
                  trainer_shape=LmShape("", steps=40, warmup=10, layers=DEFAULT_SHAPE.layers,
                                        heads=DEFAULT_SHAPE.heads, dim=DEFAULT_SHAPE.dim,
                                        seq_len=DEFAULT_SEQ_LEN, batch_size=8),
                  trainer_repeats=6, timeout_s=600)
QUICK = TokensPlan(("json",), ("json",), 20, 512, 2048, 2048, repeats=1, pipeline_seq_len=128,
                   pipeline_batch=4, pipeline_epochs=1,
                   trainer_shape=LmShape("", steps=10, warmup=10, layers=1, heads=2, dim=32, seq_len=32,
                                         batch_size=4),
                   trainer_repeats=1, timeout_s=120)


@dataclass(frozen=True)
class Corpus:
    """The rows' data: the Parquet corpus, the BPE trained on it, its token shards."""

    parquet: Path
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
    return Corpus(corpus, tok_path, root / "tokens")


def token_pipeline(data: Corpus, plan: TokensPlan, root: Path) -> dict:
    """The local-disk comparison, with the same shards on S3 (the local S3 server) under "s3"."""
    from cluster.local.objectstore import LOCAL_CREDENTIALS

    local = _pipeline_comparison(str(root / "tokens-pipeline"), None, data, plan,
                                 ("bare_range", "stream", "stream_inline", "bare_memmap"))
    # The store's credentials for this row only: later rows' runs inherit this process's environment.
    with mock.patch.dict(os.environ, LOCAL_CREDENTIALS), object_store() as store:
        s3 = _pipeline_comparison(f"s3://{STORE_BUCKET}/tokens-pipeline", store.endpoint_url, data, plan,
                                  ("bare_range", "stream", "stream_inline"))
    return {**local, "s3": {**s3, "store": f"local S3 server (moto), {STORE_PRIORITY}"}}


def _pipeline_comparison(uri: str, endpoint_url: str | None, data: Corpus, plan: TokensPlan,
                         names: tuple[str, ...]) -> dict:
    from train import pack_tokens, tokens

    pack_tokens.pack_tokens([str(data.parquet)], uri, str(data.tokenizer), workers=1, memory_mb=256,
                            shard_mb=64, block_tokens=plan.pipeline_block_tokens, endpoint_url=endpoint_url)
    seq_len, batch = plan.pipeline_seq_len, plan.pipeline_batch
    view = tokens.open_dataset(uri, endpoint_url).windows(seq_len)
    steps = plan.pipeline_epochs * view_length(view, batch)
    readers = {"bare_range": ("bare_range", 0), "stream": ("stream", 4), "stream_inline": ("stream", 0),
               "bare_memmap": ("bare_memmap", 0)}

    def isolated(name: str) -> Contender:
        """Each run in a fresh process (bench/token_stream.py says why)."""
        reader, readahead = readers[name]
        args = json.dumps({"shards": uri, "reader": reader, "readahead": readahead, "seq_len": seq_len,
                           "batch": batch, "steps": steps, "endpoint_url": endpoint_url})

        def run() -> dict:
            done = subprocess.run([sys.executable, "-m", "bench.token_stream", args], cwd=REPO, check=True,
                                  capture_output=True, text=True, timeout=plan.timeout_s)
            return json.loads(done.stdout.splitlines()[-1])
        return Contender(name, run, {"readahead_blocks": readahead} if reader == "stream" else {})

    result = run_comparison([isolated(name) for name in names], "bare_range", plan.repeats,
                            metric="tokens_per_s", progress=_progress)
    return {**result, "shape": {"seq_len": seq_len, "batch": batch, "steps": steps,
                                "blocks": len(view.ds.blocks), "block_tokens": plan.pipeline_block_tokens,
                                "dtype": view.ds.index["dtype"]},
            "isolation": "each run in a fresh process (bench/token_stream.py)"}


def view_length(view, batch: int) -> int:
    from train import tokens

    return tokens.Plan.from_state(None, 1).length(view, 0, batch)


def packing(data: Corpus, plan: TokensPlan, root: Path) -> dict:
    """Packing's rate per core at corpus scale: each run packs the corpus once and, as a second command,
    twice over (its files listed twice in --src; --quick's small corpus 21 times); the CPU the second
    command spends beyond the first's is what more passes over the text cost, with the fixed costs (two
    interpreters, their imports, the worker's start: about a second a command) taken out, as a corpus of
    gigabytes takes them out. The single command's own rate is kept beside it."""
    from tokenizers import Tokenizer

    from cluster.example_data import write_stdlib_parquet
    from train import text_source

    corpus = root / "parquet-packing"
    write_stdlib_parquet(corpus, list(plan.packing_packages) if plan.packing_packages else None)
    docs = list(text_source.corpus(text_source.find_sources([str(corpus)], None), "text"))
    tok = Tokenizer.from_file(str(data.tokenizer))
    mb = sum(map(len, docs)) / 1e6
    runs = iter(range(10_000))

    def alone() -> dict:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        cpu = _cpu_s()
        for i in range(0, len(docs), 64):
            tok.encode_batch_fast(docs[i:i + 64], add_special_tokens=False)
        return {"mb_per_cpu_s": mb / (_cpu_s() - cpu)}

    def command(passes: int) -> float:
        """The CPU-seconds of one `pack tokens` command over `passes` copies of the corpus. As users run
        it: the CLI in a process of its own, its worker spawned from it (run in this process instead,
        the spawned worker would import this bench, its __main__, and torch with it)."""
        cpu = _cpu_s()
        subprocess.run([sys.executable, "-m", "train.data", "pack", "tokens",
                        "--src", *[str(corpus)] * passes,
                        "--tokenizer", str(data.tokenizer), "--out", str(root / f"pack-{next(runs)}"),
                        "--workers", "1", "--memory-mb", "256", "--shard-mb", "64",
                        "--block-tokens", str(plan.block_tokens)],
                       check=True, capture_output=True, timeout=plan.timeout_s)
        return _cpu_s() - cpu

    def pack() -> dict:
        extra = plan.packing_extra_passes
        once, more = command(1), command(1 + extra)
        return {"mb_per_cpu_s": extra * mb / (more - once), "command_mb_per_cpu_s": mb / once}

    result = run_comparison([Contender("tokenizer_alone", alone), Contender("pack_tokens", pack)],
                            "tokenizer_alone", plan.repeats, metric="mb_per_cpu_s", progress=_progress)
    command_rates = [r["command_mb_per_cpu_s"] for r in result["contenders"]["pack_tokens"]["runs"]]
    return {**result, "text_mb": mb, "documents": len(docs),
            "corpus": list(plan.packing_packages) if plan.packing_packages else "the standard library",
            "one_command_mb_per_cpu_s": statistics.median(command_rates)}


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
    """The results file's rows with every ratio as a bench.figures.Ratio against its target (see the
    targets above), as bench.report renders them: the targets are this module's constants, applied to
    the file's per-repeat ratios whenever it is rendered, so a file written before a target changed
    reads against the target of now."""
    out = dict(results)
    if "token_pipeline" in results:
        def targeted(comparison: dict, store: str) -> dict:
            def target(name: str) -> float | None:
                return TOKEN_PIPELINE_TARGET if name == STREAM_MODE_FOR[store] else None
            return {**comparison, "ratios": {name: Ratio.of(r["per_repeat"], target(name)).to_json()
                                             for name, r in comparison["ratios"].items()}}
        row = targeted(results["token_pipeline"], "local")
        # (a row written before the S3 comparison has none: `--rows` keeps rows not re-run)
        out["token_pipeline"] = {**row, "s3": targeted(row["s3"], "s3")} if "s3" in row else row
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
    """Every contender's median ratio to the row's baseline, with its interval (then those of the row's
    "s3" comparison, if it has one)."""
    parts = []
    for contender, ratios in row["ratios"].items():
        ratio = Ratio.of(ratios["per_repeat"])
        ci = ratio.interval
        spread = f" (95 % {ci.low:.3f}-{ci.high:.3f})" if ci else " (too few repeats for an interval)"
        parts.append(f"{contender} / {row['baseline']} = {ratio.median:.3f}{spread}")
    line = f"{name}: " + "; ".join(parts)
    return line + "\n" + row_line(f"{name} on S3", row["s3"]) if "s3" in row else line


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
